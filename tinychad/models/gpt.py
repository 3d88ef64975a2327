"""GPT: a decoder-only transformer with nanoGPT's module names, a KV cache, sampling and speculative decoding.

in: a GPTConfig (or a checkpoint: nanoGPT's names, or Hugging Face GPT-2's), token ids (B, T) int
out: GPT(config)(idx, targets) -> (logits (B, T, vocab), loss or None);
     model.generate(idx, max_new_tokens, ...) -> (B, T + max_new_tokens) ids, sampled or greedy,
     optionally with a small draft model proposing speculate_k tokens that the model verifies in one pass.

Names follow nanoGPT's model.py (transformer.wte / wpe / h.N.ln_1 / attn.c_attn / attn.c_proj / ln_2 / mlp.c_fc /
mlp.c_proj / ln_f, lm_head tied to wte), so its state dicts load as they are; GPT.from_pretrained also reads
Hugging Face GPT-2 files, whose Conv1D matrices are stored (in, out) and are transposed on the way in.
Positions are a learned table (wpe) or rotary (config.rotary: nn.RotaryEmbedding on queries and keys).

The KV cache has a fixed size: each attention layer owns keys and values for max_len positions (rounded up to the
attention kernel's block; keys stored transposed, (B, heads, head_dim, slots), values (B, heads, slots, head_dim),
the layouts that kernel reads, so attending copies nothing), and a forward pass with `start` (an int Tensor, the position of idx[:, 0]) writes its keys and values at
start..start+T-1 and attends to the slots at or before each query's position. The position is a Tensor input,
not a Python number, and the buffers never change shape, so under TinyJit every decoded token replays the same
kernels: nothing compiles after warm-up. Attending over all max_len slots (masked) costs a little more than
attending over the filled ones, which is the price of fixed shapes.
"""
from __future__ import annotations
import math
from dataclasses import dataclass, fields, replace
from typing import Callable, NamedTuple
import numpy as np
from tinychad import nn
from tinychad.dtype import dtypes
from tinychad.engine.jit import TinyJit
from tinychad.function import ATTENTION_BLOCK_VECTORS
from tinychad.host import simd_bytes
from tinychad.nn import functional as F
from tinychad.nn.state import load_state_dict, safe_load
from tinychad.tensor import Tensor, no_grad


@dataclass(frozen=True)
class GPTConfig:
  block_size: int = 1024      # the longest sequence (learned positions, and the KV cache's limit)
  vocab_size: int = 50304     # nanoGPT's GPT-2 vocabulary padded to a multiple of 64
  n_layer: int = 12
  n_head: int = 12
  n_embd: int = 768
  dropout: float = 0.0
  bias: bool = True           # biases in the Linears and LayerNorms, as GPT-2
  rotary: bool = False        # rotary positions on queries and keys instead of the learned wpe table
  gelu: str = "none"          # "none" (nanoGPT's nn.GELU) or "tanh" (GPT-2's gelu_new, for its checkpoints)

  @staticmethod
  def named(name: str, **overrides) -> GPTConfig:
    """GPT-2's sizes ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl") or a small CPU one ("char-tiny", "char-small")."""
    if name not in CONFIGS: raise ValueError(f"GPTConfig.named: unknown config {name!r}, choose from {sorted(CONFIGS)}")
    return replace(CONFIGS[name], **overrides)


GPT2 = dict(vocab_size=50257, block_size=1024, gelu="tanh")
CONFIGS = {
  "gpt2": GPTConfig(n_layer=12, n_head=12, n_embd=768, **GPT2),
  "gpt2-medium": GPTConfig(n_layer=24, n_head=16, n_embd=1024, **GPT2),
  "gpt2-large": GPTConfig(n_layer=36, n_head=20, n_embd=1280, **GPT2),
  "gpt2-xl": GPTConfig(n_layer=48, n_head=25, n_embd=1600, **GPT2),
  # character-level models that train in minutes on two cores (examples/gpt.py, bench/generate.py)
  "char-tiny": GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=128, vocab_size=128),
  "char-small": GPTConfig(n_layer=4, n_head=4, n_embd=256, block_size=512, vocab_size=128),
}


class CausalSelfAttention(nn.Module):
  def __init__(self, config: GPTConfig):
    if config.n_embd % config.n_head: raise ValueError(f"GPT: n_embd {config.n_embd} is not a multiple of n_head {config.n_head}")
    self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout
    self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)   # queries, keys, values at once
    self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
    self.resid_dropout = nn.Dropout(config.dropout)
    head_dim = config.n_embd // config.n_head
    self.rotary = nn.RotaryEmbedding(head_dim, config.block_size) if config.rotary else None
    # (keys transposed (B, heads, head_dim, slots), values (B, heads, slots, head_dim)): the layouts the attention
    # kernel reads, so no token copies the cache to attend over it (see setup_cache)
    self._cache: tuple[Tensor, Tensor] | None = None

  def forward(self, x: Tensor, start: Tensor | None = None) -> Tensor:
    B, T, C = x.shape
    q, k, v = (t.reshape(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
    positions = None if start is None else start + Tensor.arange(T, dtype=dtypes.int64, device=x.device)
    if self.rotary is not None: q, k = self.rotary(q, positions), self.rotary(k, positions)
    if start is None:
      y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
    else:
      k, v, mask = self._cached(k, v, positions)
      y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, C)))

  def _cached(self, k: Tensor, v: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Write k, v (B, heads, T, head_dim) into the cache at `positions` (T,); return all cached keys and values
    (B, heads, slots, head_dim) and the mask (T, slots) of the slots each query may see (its own position and those
    before: never the slots past max_len that round the cache up)."""
    if self._cache is None: raise RuntimeError("GPT: call setup_cache(batch, max_len) before a forward with start=")
    keys_t, values = self._cache
    slots = Tensor.arange(values.shape[2], dtype=dtypes.int64, device=k.device)
    # one-hot (slots, T): which new row lands in which slot; slots written by none keep their old contents
    scatter = slots.unsqueeze(1) == positions.unsqueeze(0)
    written = scatter.any(1, keepdim=True)
    onehot = scatter.cast(k.dtype)
    # the transposed keys blend instead of a WHERE: its condition would vary along the vector lanes, a byte-mask
    # conversion the C renderer leaves to a scalar loop (20 us against 5 for 4 heads x 64 x 192 slots); exact for
    # finite keys (the new key plus 0 x old, or 0 plus 1 x old)
    keys_t.assign(k.transpose(2, 3) @ onehot.T + keys_t * (1 - written.T.cast(k.dtype)))
    values.assign(written.where(onehot @ v, values))
    return keys_t.transpose(2, 3), values, slots.unsqueeze(0) <= positions.unsqueeze(1)


class MLP(nn.Module):
  def __init__(self, config: GPTConfig):
    self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
    self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
    self.dropout = nn.Dropout(config.dropout)
    self.approximate = config.gelu

  def forward(self, x: Tensor) -> Tensor: return self.dropout(self.c_proj(self.c_fc(x).gelu(self.approximate)))


class Block(nn.Module):
  def __init__(self, config: GPTConfig):
    self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
    self.attn = CausalSelfAttention(config)
    self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
    self.mlp = MLP(config)

  def forward(self, x: Tensor, start: Tensor | None = None) -> Tensor:
    x = x + self.attn(self.ln_1(x), start)
    return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
  """nanoGPT's `transformer` ModuleDict as a module with attributes (wpe is None with rotary positions)."""
  def __init__(self, config: GPTConfig):
    self.wte = nn.Embedding(config.vocab_size, config.n_embd)
    self.wpe = None if config.rotary else nn.Embedding(config.block_size, config.n_embd)
    self.drop = nn.Dropout(config.dropout)
    self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
    self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)


class GPT(nn.Module):
  def __init__(self, config: GPTConfig):
    self.config = config
    self.transformer = Transformer(config)
    self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
    self.lm_head.weight = self.transformer.wte.weight   # tied: one tensor, trained once (get_parameters dedupes)
    self._init_weights()
    self._decoders: dict[tuple, TinyJit] = {}   # TinyJit per (tokens per call, sampling settings); see decoder()

  def _init_weights(self) -> None:
    """nanoGPT's: N(0, 0.02) weights and embeddings, zero biases, residual projections scaled by 1/sqrt(2 * n_layer)."""
    for name, t in self.named_parameters():
      if name.endswith("bias"): t.assign(Tensor.zeros(*t.shape))
      elif t.ndim == 2:
        std = 0.02 / math.sqrt(2 * self.config.n_layer) if name.endswith("c_proj.weight") else 0.02
        t.assign(Tensor.normal(*t.shape, std=std))
    Tensor.realize(*self.parameters())

  def num_params(self, non_embedding: bool = True) -> int:
    """Parameters counted once (the tied head is the embedding); without the position table by default, as nanoGPT."""
    total = sum(t.numel() for t in self.parameters())
    return total - self.transformer.wpe.weight.numel() if non_embedding and self.transformer.wpe is not None else total

  def forward(self, idx: Tensor, targets: Tensor | None = None, start: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """idx (B, T) -> (logits (B, T, vocab), mean cross-entropy against targets (B, T) or None). With `start`
    (an int Tensor: idx[:, 0]'s position) the pass reads and extends the KV cache (see setup_cache)."""
    if idx.ndim != 2 or idx.dtype.is_float: raise TypeError(f"GPT: idx must be (B, T) integers, got {idx.shape} {idx.dtype}")
    B, T = idx.shape
    if start is None and T > self.config.block_size:
      raise ValueError(f"GPT: sequence of length {T} is longer than block_size {self.config.block_size}")
    x = self.transformer.wte(idx)
    if self.transformer.wpe is not None:
      positions = Tensor.arange(T, dtype=dtypes.int64, device=idx.device)
      x = x + self.transformer.wpe(positions if start is None else positions + start)
    x = self.transformer.drop(x)
    for block in self.transformer.h: x = block(x, start)
    logits = self.lm_head(self.transformer.ln_f(x))
    # the cache's new contents are computed with the logits, in one schedule, and kept for the next call
    if start is not None: Tensor.realize(logits, *(t for block in self.transformer.h for t in block.attn._cache))
    if targets is None: return logits, None
    return logits, logits.reshape(B * T, -1).cross_entropy(targets.reshape(B * T))

  # ---- KV cache ----
  def setup_cache(self, batch: int, max_len: int) -> None:
    """Give every attention layer keys and values for `batch` sequences of up to max_len positions. The same
    sizes again keep the tensors (stale slots are masked, then overwritten), so recorded decoders stay valid."""
    if max_len > self.config.block_size:
      raise ValueError(f"GPT.setup_cache: max_len {max_len} is longer than block_size {self.config.block_size}")
    # slots rounded up to a multiple of the attention kernel's block of keys (function.Attention: SIMD lanes x
    # ATTENTION_BLOCK_VECTORS), so that it reads the cache as it is: a cache it had to pad would be copied every token
    align = ATTENTION_BLOCK_VECTORS * max(1, simd_bytes() // dtypes.float32.itemsize)
    slots, head_dim = -(-max_len // align) * align, self.config.n_embd // self.config.n_head
    shapes = ((batch, self.config.n_head, head_dim, slots), (batch, self.config.n_head, slots, head_dim))
    for block in self.transformer.h:
      cache = block.attn._cache
      if cache is None or (cache[0].shape, cache[1].shape) != shapes:
        block.attn._cache = tuple(Tensor.zeros(*shape).contiguous().realize() for shape in shapes)
        self._decoders.clear()   # their recordings wrote the old tensors

  def decoder(self, tokens: int, head: str = "logits", settings: dict | None = None) -> TinyJit:
    """A TinyJit of one cached step (idx (B, tokens), start) -> the logits (B, tokens, vocab) (head "logits"), their
    probabilities(**settings) ("probs"), or the next token (B, 1) drawn from the last position by
    sample_logits(**settings) ("sample"). One per (tokens, head, settings), kept until the cache changes size."""
    if head not in ("logits", "probs", "sample"): raise ValueError(f"GPT.decoder: unknown head {head!r}")
    settings = settings or {}
    key = (tokens, head, tuple(sorted(settings.items())))
    if key not in self._decoders:
      def step(idx: Tensor, start: Tensor) -> Tensor:
        logits = self(idx, start=start)[0]
        if head == "probs": return probabilities(logits, **settings)
        return logits if head == "logits" else sample_logits(logits[:, -1, :], **settings).unsqueeze(1)
      self._decoders[key] = TinyJit(step)
    return self._decoders[key]

  # ---- generation ----
  def generate(self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
               top_p: float | None = None, greedy: bool = False, draft_model: GPT | None = None,
               speculate_k: int = 4, jit: bool = True) -> Tensor:
    """idx (B, T) -> (B, T + max_new_tokens): each new token drawn from softmax(logits / temperature) over the
    top_k most likely tokens and the smallest set whose probability reaches top_p (Tensor.multinomial), or the
    argmax when greedy (or temperature 0). The prompt fills the KV cache in one pass; each further token is
    one TinyJit replay (jit=False: the same step built eagerly each time). The prompt's pass is a TinyJit too,
    one per prompt length, replayed from the third generate() with a prompt of that length. With a draft_model (batch 1, same
    vocabulary): speculative decoding, see speculative_generate."""
    if draft_model is not None:
      return speculative_generate(self, draft_model, idx, max_new_tokens, temperature, top_k, top_p, greedy, speculate_k)[0]
    B, T = _check_prompt(self, idx, max_new_tokens)
    if max_new_tokens == 0: return idx
    settings = sampling_settings(temperature, top_k, top_p, greedy, self.config.vocab_size)
    with no_grad():
      self.setup_cache(B, T + max_new_tokens)
      # the prompt fills the cache in one pass and samples token 1 (a TinyJit of its own: a generate() called again
      # with a prompt of the same length replays it), each further token is one replay of the 1-token step
      prompt, step = self.decoder(T, "sample", settings), self.decoder(1, "sample", settings)
      if not jit: prompt, step = prompt.fn, step.fn
      token = prompt(idx, _position(0))
      out = [token.numpy()]
      for i in range(1, max_new_tokens):
        token = step(token, _position(T + i - 1))
        out.append(token.numpy())
    return Tensor(np.concatenate([idx.numpy()] + out, axis=1).astype(np.int64), device=idx.device)

  # ---- checkpoints ----
  @staticmethod
  def from_pretrained(path: str, n_head: int | None = None, **overrides) -> GPT:
    """A GPT with the weights of a .safetensors file: nanoGPT's names (a state_dict of its GPT, `_orig_mod.`
    prefixes of torch.compile dropped) or Hugging Face GPT-2's (GPT2Model or GPT2LMHeadModel: their Conv1D
    weights are (in, out), transposed here; GPT-2's tanh GELU is then used). Sizes come from the file; n_head
    from GPT-2's table by width unless given. Any other config field can be overridden (dropout=0.1, ...)."""
    state = {k.removeprefix("_orig_mod."): v for k, v in safe_load(path).items()}
    state = {(k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}"): v for k, v in state.items()}
    wte = state.get("transformer.wte.weight")
    if wte is None: raise ValueError(f"GPT.from_pretrained: {path} has no wte.weight: not a GPT checkpoint")
    vocab, width = wte.shape
    layers = 1 + max((int(k.split(".")[2]) for k in state if k.startswith("transformer.h.")), default=-1)
    n_head = n_head or {768: 12, 1024: 16, 1280: 20, 1600: 25}.get(width)
    if n_head is None: raise ValueError(f"GPT.from_pretrained: width {width} is not a GPT-2 size; pass n_head=")
    hf = layers > 0 and state["transformer.h.0.attn.c_attn.weight"].shape == (width, 3 * width)
    if hf:
      conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
      state = {k: (v.T if k.endswith(conv1d) else v) for k, v in state.items()
               if not k.endswith((".attn.bias", ".attn.masked_bias"))}   # GPT-2's causal-mask buffers
    state.setdefault("lm_head.weight", wte)
    settings = dict(vocab_size=vocab, n_embd=width, n_layer=layers, n_head=n_head, rotary="transformer.wpe.weight" not in state,
                    block_size=state["transformer.wpe.weight"].shape[0] if "transformer.wpe.weight" in state else 1024,
                    bias="transformer.ln_f.bias" in state, gelu="tanh" if hf else "none")
    unknown = set(overrides) - {f.name for f in fields(GPTConfig)}
    if unknown: raise TypeError(f"GPT.from_pretrained: unknown config fields {sorted(unknown)}")
    model = GPT(GPTConfig(**{**settings, **overrides}))
    load_state_dict(model, state)
    return model


# ---- sampling ----
def sampling_settings(temperature: float, top_k: int | None, top_p: float | None, greedy: bool, vocab: int) -> dict:
  """Check generate's sampling arguments; return sample_logits' keywords (greedy when temperature is 0)."""
  if temperature < 0: raise ValueError(f"generate: temperature must be >= 0, got {temperature}")
  if top_k is not None and not 1 <= top_k: raise ValueError(f"generate: top_k must be >= 1, got {top_k}")
  if top_p is not None and not 0 < top_p <= 1: raise ValueError(f"generate: top_p must be in (0, 1], got {top_p}")
  if greedy or temperature == 0: return dict(greedy=True)
  return dict(temperature=float(temperature), top_k=min(top_k, vocab) if top_k else None, top_p=top_p)


def probabilities(logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None) -> Tensor:
  """softmax(logits / temperature) (..., vocab) over the top_k largest logits and then the smallest set of most
  likely tokens whose probability reaches top_p (nucleus), renormalised; ties at either threshold are all kept.
  Both thresholds come from a bisection, not a sort, so a 50,257-token vocabulary costs 32 passes over it."""
  logits = logits / temperature
  if top_k is not None and top_k < logits.shape[-1]:
    keep = largest_threshold(logits, lambda chosen: chosen.sum(-1, keepdim=True) >= top_k)
    logits = keep.where(logits, -math.inf)
  probs = logits.softmax(-1)
  if top_p is None or top_p >= 1: return probs
  # the most likely tokens, down to the first whose probability brings the total to top_p
  keep = largest_threshold(probs, lambda chosen: chosen.where(probs, 0.0).sum(-1, keepdim=True) >= top_p)
  kept = keep.where(probs, 0.0)
  return kept / kept.sum(-1, keepdim=True)


def largest_threshold(values: Tensor, enough: Callable[[Tensor], Tensor]) -> Tensor:
  """The mask values >= t, for the largest t of each row (last axis) where enough(mask) still holds (enough must
  only weaken as t grows, and hold for the whole row). A bisection over the float32 values' order-preserving
  integer keys: 32 steps find t exactly, each one comparison and one reduction per row, lazy (TinyJit replays
  it), where a sort would rank n * n pairs."""
  bits = values.cast(dtypes.float32).bitcast(dtypes.int32).cast(dtypes.int64)
  # negative floats order backwards as integers: flipping their magnitude bits makes the order the floats'
  keys = (bits < 0).where(bits ^ 0x7FFFFFFF, bits)
  low = Tensor.full(values.shape[:-1] + (1,), -2**31, dtype=dtypes.int64, device=values.device)   # enough holds
  high = Tensor.full(values.shape[:-1] + (1,), 2**31, dtype=dtypes.int64, device=values.device)   # it doesn't
  for _ in range(32):
    middle = low + (high - low) // 2
    holds = enough(keys >= middle)
    low, high = holds.where(middle, low), holds.where(high, middle)
  return keys >= low


def sample_logits(logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                  greedy: bool = False) -> Tensor:
  """logits (B, vocab) -> (B,) int64 tokens: the argmax, or one draw from probabilities(...) by Tensor.multinomial."""
  if greedy: return logits.argmax(-1)
  return probabilities(logits, temperature, top_k, top_p).multinomial(1, replacement=True).squeeze(-1)


def _position(start: int) -> Tensor: return Tensor(np.array(start, dtype=np.int64))


def _check_prompt(model: GPT, idx: Tensor, max_new_tokens: int) -> tuple[int, int]:
  if idx.ndim != 2 or idx.dtype.is_float: raise TypeError(f"generate: idx must be (B, T) integers, got {idx.shape} {idx.dtype}")
  if max_new_tokens < 0: raise ValueError(f"generate: max_new_tokens must be >= 0, got {max_new_tokens}")
  B, T = idx.shape
  if T == 0: raise ValueError("generate: the prompt is empty; give at least one token")
  if T + max_new_tokens > model.config.block_size:
    raise ValueError(f"generate: prompt {T} + {max_new_tokens} new tokens is longer than block_size {model.config.block_size}")
  return B, T


# ---- speculative decoding ----
class SpeculativeStats(NamedTuple):
  proposed: int     # draft tokens proposed
  accepted: int     # of those, accepted by the target model
  target_calls: int  # verification passes of the target model (each scores speculate_k + 1 positions)

  @property
  def acceptance_rate(self) -> float: return self.accepted / max(self.proposed, 1)


def speculative_generate(target: GPT, draft: GPT, idx: Tensor, max_new_tokens: int, temperature: float = 1.0,
                         top_k: int | None = None, top_p: float | None = None, greedy: bool = False,
                         speculate_k: int = 4) -> tuple[Tensor, SpeculativeStats]:
  """Speculative decoding (Leviathan et al. 2023, Chen et al. 2023) for one sequence: the draft proposes
  speculate_k tokens one by one, the target scores them all in one cached pass, and each is accepted with
  probability min(1, p/q) (p the target's, q the draft's probability of it, both after temperature / top_k /
  top_p); the first rejected one is replaced by a draw from max(0, p - q) renormalised, and when all are accepted
  the target's next distribution gives one token more. The output then follows the target's distribution
  exactly; greedy (p, q one-hot at the argmax) gives the target's greedy tokens exactly. Accept/reject runs on
  the host with Tensor.manual_seed's generator. Returns (ids (1, T + max_new_tokens), statistics)."""
  B, T = _check_prompt(target, idx, max_new_tokens)
  if B != 1: raise ValueError(f"speculative_generate: one sequence at a time, got a batch of {B}")
  if draft.config.vocab_size != target.config.vocab_size:
    raise ValueError(f"speculative_generate: vocabularies differ (target {target.config.vocab_size}, "
                     f"draft {draft.config.vocab_size})")
  if speculate_k < 1: raise ValueError(f"speculative_generate: speculate_k must be >= 1, got {speculate_k}")
  settings = sampling_settings(temperature, top_k, top_p, greedy, target.config.vocab_size)
  seq = [int(t) for t in idx.numpy()[0]]
  proposed = accepted = calls = 0
  # the caches hold up to speculate_k positions beyond the last token kept
  room = T + max_new_tokens + speculate_k
  if room > min(target.config.block_size, draft.config.block_size):
    raise ValueError(f"speculative_generate: {T} + {max_new_tokens} + speculate_k {speculate_k} positions exceed block_size")
  with no_grad():
    for model in (target, draft): model.setup_cache(1, room)
    # greedy decisions read the logits' argmax; sampled ones the probabilities, computed inside the replayed step
    head = "logits" if settings.get("greedy") else "probs"
    draft_step = draft.decoder(1, head, {} if head == "logits" else settings)
    verify = target.decoder(speculate_k + 1, head, {} if head == "logits" else settings)
    # invariant: both caches hold seq[:-1]; seq[-1] is the next token to feed
    if T > 1:
      for model in (target, draft): model(Tensor([seq[:-1]]), start=_position(0))[0].realize()
    rng = Tensor._rng
    while len(seq) < T + max_new_tokens:
      n, guesses, q = len(seq), [], []
      token = seq[-1]
      for i in range(speculate_k):
        probs = _host_probs(draft_step(Tensor([[token]]), _position(n - 1 + i))[0], settings)[-1]
        token = _draw(probs, rng, settings)
        guesses.append(token)
        q.append(probs)
      p = _host_probs(verify(Tensor([[seq[-1]] + guesses]), _position(n - 1))[0], settings)
      calls += 1
      kept, extra = [], None
      for i, guess in enumerate(guesses):
        if greedy_or_accept(p[i], q[i], guess, rng, settings):
          kept.append(guess)
          continue
        residual = np.maximum(p[i] - q[i], 0.0)
        extra = _draw(residual / residual.sum() if residual.sum() > 0 else p[i], rng, settings)
        break
      if extra is None:
        extra = _draw(p[speculate_k], rng, settings)
        # the draft never saw its last guess: feed it so its cache holds every kept token
        draft_step(Tensor([[guesses[-1]]]), _position(n - 1 + speculate_k))
      proposed += speculate_k
      accepted += len(kept)
      seq += (kept + [extra])[:T + max_new_tokens - n]
  return Tensor([seq], dtype=dtypes.int64, device=idx.device), SpeculativeStats(proposed, accepted, calls)


def _host_probs(out: Tensor, settings: dict) -> np.ndarray:
  """A decoder's (positions, vocab) output -> float64 probabilities on the host: one-hot at the argmax when
  greedy (the decoder gave logits), else the decoder's probabilities."""
  values = out.numpy().astype(np.float64)
  return np.eye(values.shape[-1])[values.argmax(-1)] if settings.get("greedy") else values


def _draw(probs: np.ndarray, rng: np.random.Generator, settings: dict) -> int:
  if settings.get("greedy"): return int(np.argmax(probs))
  return int(rng.choice(len(probs), p=probs / probs.sum()))


def greedy_or_accept(p: np.ndarray, q: np.ndarray, token: int, rng: np.random.Generator, settings: dict) -> bool:
  """Keep a draft token: always when the target agrees (greedy: its argmax is the token), else with min(1, p/q)."""
  if settings.get("greedy"): return bool(p[token] == 1.0)
  return bool(rng.random() < min(1.0, p[token] / q[token]))
