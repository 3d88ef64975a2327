"""models/gpt.py against a PyTorch twin written here in plain torch.nn (nanoGPT's model, same names).

Same weights in both: logits, loss, every parameter's gradient and a few AdamW steps agree; checkpoints written by
PyTorch under nanoGPT's names and under Hugging Face GPT-2's (transposed Conv1D weights, causal-mask buffers) load
and give the twin's logits; the KV cache gives the full forward's logits; decoding under TinyJit compiles and
schedules nothing after warm-up; rotary positions match the reference formula; speculative decoding is exact.
"""
from __future__ import annotations
import numpy as np
import pytest
import torch
import torch.nn as tnn
import torch.nn.functional as TF
from safetensors.torch import save_file
from scipy import stats
from tinychad import GlobalCounters, Tensor, nn
from tinychad.device import Device
from tinychad.models.gpt import GPT, GPTConfig, probabilities, speculative_generate
from tinychad.nn import functional as F
from tinychad.nn.optim import AdamW
from tinychad.nn.state import get_parameters

CONFIG = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=24, vocab_size=19)
LONG = GPTConfig(**{**CONFIG.__dict__, "block_size": 128})   # room for 100 decoded tokens


# ---- the PyTorch twin ----
def torch_rotary(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
  """RoPE, half-split layout (GPT-NeoX / Hugging Face Llama's rotate_half)."""
  dim = x.shape[-1]
  angles = positions[:, None].double() * base ** (-torch.arange(0, dim, 2).double() / dim)
  cos, sin = torch.cat([angles.cos()] * 2, -1).float(), torch.cat([angles.sin()] * 2, -1).float()
  rotated = torch.cat([-x[..., dim // 2:], x[..., :dim // 2]], -1)
  return x * cos + rotated * sin


class TorchAttention(tnn.Module):
  def __init__(self, c: GPTConfig):
    super().__init__()
    self.c_attn, self.c_proj, self.c = tnn.Linear(c.n_embd, 3 * c.n_embd, c.bias), tnn.Linear(c.n_embd, c.n_embd, c.bias), c

  def forward(self, x):
    B, T, C = x.shape
    q, k, v = (t.view(B, T, self.c.n_head, C // self.c.n_head).transpose(1, 2) for t in self.c_attn(x).split(C, 2))
    if self.c.rotary: q, k = torch_rotary(q, torch.arange(T)), torch_rotary(k, torch.arange(T))
    return self.c_proj(TF.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C))


class TorchBlock(tnn.Module):
  def __init__(self, c: GPTConfig):
    super().__init__()
    self.ln_1, self.attn, self.ln_2 = tnn.LayerNorm(c.n_embd, bias=c.bias), TorchAttention(c), tnn.LayerNorm(c.n_embd, bias=c.bias)
    self.mlp = tnn.ModuleDict(dict(c_fc=tnn.Linear(c.n_embd, 4 * c.n_embd, c.bias), c_proj=tnn.Linear(4 * c.n_embd, c.n_embd, c.bias)))
    self.gelu = c.gelu

  def forward(self, x):
    x = x + self.attn(self.ln_1(x))
    return x + self.mlp.c_proj(TF.gelu(self.mlp.c_fc(self.ln_2(x)), approximate=self.gelu))


class TorchGPT(tnn.Module):
  def __init__(self, c: GPTConfig):
    super().__init__()
    parts = dict(wte=tnn.Embedding(c.vocab_size, c.n_embd))
    if not c.rotary: parts["wpe"] = tnn.Embedding(c.block_size, c.n_embd)
    parts.update(h=tnn.ModuleList([TorchBlock(c) for _ in range(c.n_layer)]), ln_f=tnn.LayerNorm(c.n_embd, bias=c.bias))
    self.transformer = tnn.ModuleDict(parts)
    self.lm_head = tnn.Linear(c.n_embd, c.vocab_size, bias=False)
    self.lm_head.weight = self.transformer.wte.weight
    for name, p in self.named_parameters(): tnn.init.normal_(p, std=0.3) if p.ndim == 2 else tnn.init.uniform_(p, -0.5, 0.5)

  def forward(self, idx, targets=None):
    x = self.transformer.wte(idx)
    if "wpe" in self.transformer: x = x + self.transformer.wpe(torch.arange(idx.shape[1]))
    for block in self.transformer.h: x = block(x)
    logits = self.lm_head(self.transformer.ln_f(x))
    return logits, None if targets is None else TF.cross_entropy(logits.flatten(0, 1), targets.flatten())


def twins(config: GPTConfig = CONFIG, seed: int = 0) -> tuple[GPT, TorchGPT]:
  torch.manual_seed(seed)
  reference = TorchGPT(config)
  model = GPT(config)
  model.load_state_dict({k: v.detach().numpy() for k, v in reference.state_dict().items()})
  return model, reference


def batch(config: GPTConfig = CONFIG, B: int = 3, T: int = 11, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(seed)
  return rng.integers(0, config.vocab_size, (B, T)), rng.integers(0, config.vocab_size, (B, T))


# ---- the model ----
def test_names_are_nanogpts_and_the_head_is_tied():
  model, reference = twins()
  assert list(model.state_dict()) == list(reference.state_dict())
  assert model.lm_head.weight is model.transformer.wte.weight
  assert len(get_parameters(model)) == len(list(reference.parameters()))   # the tied matrix counted once
  assert model.num_params() == sum(p.numel() for p in reference.parameters()) - reference.transformer.wpe.weight.numel()


@pytest.mark.parametrize("rotary", [False, True])
def test_logits_loss_and_every_gradient_match_pytorch(rotary):
  config = GPTConfig(**{**CONFIG.__dict__, "rotary": rotary})
  model, reference = twins(config)
  idx, targets = batch(config)
  logits, loss = model(Tensor(idx), Tensor(targets))
  t_logits, t_loss = reference(torch.tensor(idx), torch.tensor(targets))
  np.testing.assert_allclose(logits.numpy(), t_logits.detach().numpy(), atol=2e-4, rtol=1e-4)
  np.testing.assert_allclose(loss.item(), t_loss.item(), rtol=1e-5)
  loss.backward()
  t_loss.backward()
  ours = dict(model.named_parameters())
  for name, p in reference.named_parameters():
    np.testing.assert_allclose(ours[name].grad.numpy(), p.grad.numpy(), atol=2e-5, rtol=2e-4, err_msg=name)


def test_adamw_steps_match_pytorch():
  model, reference = twins()
  opt, t_opt = AdamW(get_parameters(model), lr=3e-3), torch.optim.AdamW(reference.parameters(), lr=3e-3)
  for step in range(4):
    idx, targets = batch(seed=step)
    opt.zero_grad()
    t_opt.zero_grad()
    loss = model(Tensor(idx), Tensor(targets))[1]
    t_loss = reference(torch.tensor(idx), torch.tensor(targets))[1]
    np.testing.assert_allclose(loss.item(), t_loss.item(), rtol=1e-4, err_msg=f"step {step}")
    loss.backward()
    t_loss.backward()
    opt.step()
    t_opt.step()
  np.testing.assert_allclose(model.transformer.wte.weight.numpy(), reference.transformer.wte.weight.detach().numpy(), atol=1e-5)


def test_rotary_embedding_matches_the_reference_formula():
  x = np.random.default_rng(0).standard_normal((2, 3, 7, 8)).astype(np.float32)
  rope = nn.RotaryEmbedding(8, max_seq_len=16)
  np.testing.assert_allclose(rope(Tensor(x)).numpy(), torch_rotary(torch.tensor(x), torch.arange(7)).numpy(), atol=1e-5)
  at = np.array([3, 4, 5, 6, 7, 8, 9])
  np.testing.assert_allclose(rope(Tensor(x), Tensor(at)).numpy(), torch_rotary(torch.tensor(x), torch.tensor(at)).numpy(), atol=1e-5)
  with pytest.raises(ValueError, match="apply_rotary_emb"): F.apply_rotary_emb(Tensor(x), rope.cos[:7, :3], rope.sin[:7, :3])
  assert rope.state_dict() == {}   # the tables are not state


# ---- checkpoints ----
def test_a_nanogpt_checkpoint_written_by_pytorch_loads(tmp_path):
  _, reference = twins(seed=1)
  path = tmp_path / "nanogpt.safetensors"
  # torch.compile'd models' state dicts carry an _orig_mod. prefix; safetensors wants the tied matrix saved once per name
  save_file({f"_orig_mod.{k}": v.detach().clone().contiguous() for k, v in reference.state_dict().items()}, path)
  model = GPT.from_pretrained(str(path), n_head=CONFIG.n_head)
  assert model.config == GPTConfig(**{**CONFIG.__dict__, "block_size": CONFIG.block_size})
  idx, _ = batch()
  np.testing.assert_allclose(model(Tensor(idx))[0].numpy(), reference(torch.tensor(idx))[0].detach().numpy(), atol=2e-4, rtol=1e-4)


def test_a_hugging_face_gpt2_checkpoint_loads(tmp_path):
  config = GPTConfig(**{**CONFIG.__dict__, "gelu": "tanh"})   # GPT-2's gelu_new
  _, reference = twins(config, seed=2)
  hf = {}
  for name, value in reference.state_dict().items():
    name = name.removeprefix("transformer.")
    if name == "lm_head.weight": continue   # GPT2Model files have no head: it is the embedding
    # Hugging Face's Conv1D keeps (in, out) matrices
    hf[name] = value.T.contiguous() if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")) else value.clone()
  for i in range(config.n_layer):
    hf[f"h.{i}.attn.bias"] = torch.tril(torch.ones(config.block_size, config.block_size)).view(1, 1, config.block_size, -1)
    hf[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
  path = tmp_path / "model.safetensors"
  save_file(hf, path)
  model = GPT.from_pretrained(str(path), n_head=config.n_head)
  assert model.config.gelu == "tanh" and model.config.n_layer == config.n_layer
  idx, _ = batch()
  np.testing.assert_allclose(model(Tensor(idx))[0].numpy(), reference(torch.tensor(idx))[0].detach().numpy(), atol=2e-4, rtol=1e-4)


def test_from_pretrained_errors(tmp_path):
  path = tmp_path / "other.safetensors"
  save_file({"weight": torch.ones(3)}, path)
  with pytest.raises(ValueError, match="not a GPT checkpoint"): GPT.from_pretrained(str(path))
  save_file({"wte.weight": torch.ones(10, 40)}, path)
  with pytest.raises(ValueError, match="pass n_head="): GPT.from_pretrained(str(path))


# ---- the KV cache and generation ----
def greedy_without_cache(model: GPT, idx: np.ndarray, new: int) -> np.ndarray:
  for _ in range(new):
    logits = model(Tensor(idx))[0].numpy()
    idx = np.concatenate([idx, logits[:, -1].argmax(-1)[:, None]], 1)
  return idx


@pytest.mark.parametrize("rotary", [False, True])
def test_cached_logits_match_the_full_forward(rotary):
  model, _ = twins(GPTConfig(**{**CONFIG.__dict__, "rotary": rotary}))
  idx, _ = batch(B=2, T=12)
  full = model(Tensor(idx))[0].numpy()
  model.setup_cache(2, 16)
  # the prompt in one pass, then one token at a time, then three at once
  parts = [model(Tensor(idx[:, :5]), start=Tensor(0))[0].numpy()]
  parts += [model(Tensor(idx[:, i:i + 1]), start=Tensor(i))[0].numpy() for i in range(5, 9)]
  parts.append(model(Tensor(idx[:, 9:]), start=Tensor(9))[0].numpy())
  np.testing.assert_allclose(np.concatenate(parts, 1), full, atol=2e-4, rtol=1e-4)


def test_greedy_generation_matches_recomputing_everything():
  model, _ = twins()
  idx, _ = batch(B=2, T=4)
  want = greedy_without_cache(model, idx, 12)
  np.testing.assert_array_equal(model.generate(Tensor(idx), 12, greedy=True).numpy(), want)
  np.testing.assert_array_equal(model.generate(Tensor(idx), 12, greedy=True, jit=False).numpy(), want)
  np.testing.assert_array_equal(model.generate(Tensor(idx), 12, temperature=0).numpy(), want)


def test_decoding_under_tinyjit_builds_nothing_after_warm_up():
  model, _ = twins(LONG)
  model.setup_cache(1, LONG.block_size)
  step = model.decoder(1, "sample", dict(temperature=0.8, top_k=5, top_p=0.9))
  token = Tensor([[3]])
  # positions as data (a Python number would be a constant that needs a kernel to become a buffer)
  for pos in range(3): token = step(token, Tensor(np.array(pos)))   # run, record, first replay
  programs = {name: len(Device[name].programs) for name in ("CPU", "LLVM") if Device.available(name)}
  GlobalCounters.reset()
  for pos in range(3, 103): token = step(token, Tensor(np.array(pos)))   # 100 more tokens
  token.numpy()
  assert GlobalCounters.kernel_count == 0   # every kernel was a replay: nothing scheduled, nothing built
  assert programs == {name: len(Device[name].programs) for name in programs}
  assert step.recording is not None and step.calls == 2


def test_a_third_generate_schedules_and_builds_nothing():
  """generate() under TinyJit: the prompt's pass and the 1-token step are each a TinyJit, so from the third call
  with the same prompt length and sampling settings every kernel is a replay, the prompt's included."""
  model, _ = twins()
  idx, _ = batch(B=1, T=5)
  want = greedy_without_cache(model, idx, 10)
  for _ in range(2): np.testing.assert_array_equal(model.generate(Tensor(idx), 10, greedy=True).numpy(), want)
  programs = {name: len(Device[name].programs) for name in ("CPU", "LLVM") if Device.available(name)}
  GlobalCounters.reset()
  np.testing.assert_array_equal(model.generate(Tensor(idx), 10, greedy=True).numpy(), want)
  assert GlobalCounters.kernel_count == 0
  assert programs == {name: len(Device[name].programs) for name in programs}


def test_sampling_follows_temperature_top_k_and_top_p():
  logits = Tensor([[2.0, 1.0, 0.5, 0.0, -1.0, 3.0]])
  p = probabilities(logits, temperature=0.5).numpy()[0]
  np.testing.assert_allclose(p, torch.softmax(torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 3.0]) / 0.5, 0).numpy(), rtol=1e-5)
  top2 = probabilities(logits, top_k=2).numpy()[0]
  assert (top2 > 0).tolist() == [True, False, False, False, False, True]
  full = torch.softmax(torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 3.0]), 0).numpy()
  nucleus = probabilities(logits, top_p=0.8).numpy()[0]
  # sorted: 3.0 (0.63), 2.0 (0.23): the first two reach 0.8, the rest go
  assert (nucleus > 0).tolist() == [True, False, False, False, False, True]
  np.testing.assert_allclose(nucleus[[0, 5]], full[[0, 5]] / full[[0, 5]].sum(), rtol=1e-5)
  model, _ = twins()
  Tensor.manual_seed(3)
  out = model.generate(Tensor([[1, 2]]), 10, top_k=1).numpy()   # top_k=1 is greedy
  np.testing.assert_array_equal(out, greedy_without_cache(model, np.array([[1, 2]]), 10))
  with pytest.raises(ValueError, match="top_p must be in"): model.generate(Tensor([[1]]), 2, top_p=0)
  with pytest.raises(ValueError, match="longer than block_size"): model.generate(Tensor([[1]]), CONFIG.block_size)


# ---- speculative decoding ----
def test_greedy_speculative_decoding_is_the_targets_greedy_output():
  target, _ = twins(seed=0)
  draft, _ = twins(GPTConfig(**{**CONFIG.__dict__, "n_layer": 1}), seed=5)
  rng = np.random.default_rng(0)
  accepted = 0
  for trial in range(12):
    prompt = rng.integers(0, CONFIG.vocab_size, (1, 3))
    want = target.generate(Tensor(prompt), 14, greedy=True).numpy()
    out, stats_ = speculative_generate(target, draft, Tensor(prompt), 14, greedy=True, speculate_k=3)
    np.testing.assert_array_equal(out.numpy(), want, err_msg=f"prompt {prompt}")
    accepted += stats_.accepted
  assert 0 < accepted   # the draft was right sometimes: accepted tokens were really used
  # the draft model itself as its own draft: every guess is accepted
  out, stats_ = speculative_generate(target, target, Tensor([[1, 2, 3]]), 12, greedy=True, speculate_k=4)
  assert stats_.acceptance_rate == 1.0
  np.testing.assert_array_equal(out.numpy(), target.generate(Tensor([[1, 2, 3]]), 12, greedy=True).numpy())


def test_sampled_speculative_decoding_follows_the_target_distribution():
  """Two tokens after a fixed prompt, drawn 600 times: their joint distribution (25 cells) is the target's
  p(a) p(b | a), by a chi-square test, though the draft's distributions differ from the target's."""
  config = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=12, vocab_size=5)
  target, _ = twins(config, seed=0)
  draft, _ = twins(config, seed=7)
  prompt = np.array([[1, 3]])
  first = probabilities(target(Tensor(prompt))[0][:, -1, :]).numpy()[0].astype(np.float64)
  pairs = np.concatenate([np.repeat(prompt, 5, 0), np.arange(5)[:, None]], 1)
  second = probabilities(target(Tensor(pairs))[0][:, -1, :]).numpy().astype(np.float64)
  joint = first[:, None] * second
  q = probabilities(draft(Tensor(prompt))[0][:, -1, :]).numpy()[0]
  assert np.abs(q - first).max() > 0.1   # the draft disagrees with the target
  Tensor.manual_seed(0)
  counts = np.zeros((5, 5))
  proposed = accepted = 0
  for _ in range(600):
    out, s = speculative_generate(target, draft, Tensor(prompt), 2, speculate_k=2)
    a, b = out.numpy()[0, 2:]
    counts[a, b] += 1
    proposed, accepted = proposed + s.proposed, accepted + s.accepted
  assert 0 < accepted < proposed
  expected = 600 * joint.flatten() / joint.sum()
  assert stats.chisquare(counts.flatten(), expected).pvalue > 1e-3, (counts, expected)


def test_top_k_and_top_p_on_a_gpt2_sized_vocabulary():
  """The thresholds come from a bisection, not a sort, so GPT-2's 50,257 tokens work; checked against PyTorch's
  sort-based filtering. At the nucleus' edge, float32 sums of ~40,000 probabilities in another order may keep a
  few tokens more or less (of the least likely kept ones)."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 50257)).astype(np.float32) * 3
  t = torch.tensor(x)
  for k in (1, 50):
    kth = torch.topk(t, k).values[..., -1:]
    expected = torch.softmax(t.masked_fill(t < kth, -float("inf")), -1).numpy()
    np.testing.assert_allclose(probabilities(Tensor(x), top_k=k).numpy(), expected, atol=1e-7)
  p = torch.softmax(t, -1)
  ranked, order = p.sort(-1, descending=True)
  keep = torch.zeros_like(p).scatter(-1, order, ((ranked.cumsum(-1) - ranked) < 0.9).float()).bool().numpy()
  got = probabilities(Tensor(x), top_p=0.9).numpy()
  assert np.abs((got > 0).sum(-1) - keep.sum(-1)).max() <= 5, ((got > 0).sum(-1), keep.sum(-1))
  for row in range(2):     # the kept tokens keep their odds: one renormalisation factor per row
    both = (got[row] > 0) & keep[row]
    scale = got[row][both] / p.numpy()[row][both]
    np.testing.assert_allclose(scale, scale.mean(), rtol=1e-4)
