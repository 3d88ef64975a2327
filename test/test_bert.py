"""tinychad.models.bert against a PyTorch twin written here in plain torch.nn with Hugging Face's BertModel
structure and names (transformers isn't installed; the twin masks padding as BertModel does, adding
float32's lowest value to the scores): a checkpoint saved with safetensors.torch under Hugging Face's names
(with the "bert." prefix, position_ids and an MLM head, as BertForMaskedLM files have) loads, then hidden states,
pooled output, mean-pooled sentence embeddings, a loss, every parameter's gradient and three AdamW steps agree.
"""
from __future__ import annotations
import numpy as np
import pytest
import torch
import torch.nn as tnn
import torch.nn.functional as tF
from safetensors.torch import save_file
from tinychad import Tensor
from tinychad.models import BertConfig, BertModel
from tinychad.models.bert import hf_name, mean_pool
from tinychad.nn.optim import AdamW
from model_reference import assert_close, assert_same_grads, assert_same_training, to_torch


# ---- the twin: transformers' BertModel (eager attention), dropout left out ----
class TEmbeddings(tnn.Module):
  def __init__(self, c: BertConfig):
    super().__init__()
    self.word_embeddings = tnn.Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id)
    self.position_embeddings = tnn.Embedding(c.max_position_embeddings, c.hidden_size)
    self.token_type_embeddings = tnn.Embedding(c.type_vocab_size, c.hidden_size)
    self.LayerNorm = tnn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
    self.register_buffer("position_ids", torch.arange(c.max_position_embeddings).expand((1, -1)))

  def forward(self, ids, types):
    positions = self.position_ids[:, :ids.shape[1]]
    x = self.word_embeddings(ids) + self.token_type_embeddings(types) + self.position_embeddings(positions)
    return self.LayerNorm(x)


class TSelfAttention(tnn.Module):
  def __init__(self, c: BertConfig):
    super().__init__()
    self.heads = c.num_attention_heads
    self.query, self.key, self.value = (tnn.Linear(c.hidden_size, c.hidden_size) for _ in range(3))

  def forward(self, x, additive_mask):
    B, T, C = x.shape
    q, k, v = (p(x).view(B, T, self.heads, C // self.heads).transpose(1, 2) for p in (self.query, self.key, self.value))
    scores = q @ k.transpose(-1, -2) / (C // self.heads) ** 0.5 + additive_mask
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)


class TOutput(tnn.Module):   # BertSelfOutput and BertOutput
  def __init__(self, c: BertConfig, in_features):
    super().__init__()
    self.dense, self.LayerNorm = tnn.Linear(in_features, c.hidden_size), tnn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

  def forward(self, x, residual): return self.LayerNorm(self.dense(x) + residual)


class TAttention(tnn.Module):
  def __init__(self, c):
    super().__init__()
    self.self, self.output = TSelfAttention(c), TOutput(c, c.hidden_size)

  def forward(self, x, mask): return self.output(self.self(x, mask), x)


class TIntermediate(tnn.Module):
  def __init__(self, c):
    super().__init__()
    self.dense = tnn.Linear(c.hidden_size, c.intermediate_size)

  def forward(self, x): return tF.gelu(self.dense(x))


class TLayer(tnn.Module):
  def __init__(self, c):
    super().__init__()
    self.attention, self.intermediate, self.output = TAttention(c), TIntermediate(c), TOutput(c, c.intermediate_size)

  def forward(self, x, mask):
    x = self.attention(x, mask)
    return self.output(self.intermediate(x), x)


class TEncoder(tnn.Module):
  def __init__(self, c):
    super().__init__()
    self.layer = tnn.ModuleList([TLayer(c) for _ in range(c.num_hidden_layers)])


class TPooler(tnn.Module):
  def __init__(self, c):
    super().__init__()
    self.dense = tnn.Linear(c.hidden_size, c.hidden_size)


class TBert(tnn.Module):
  def __init__(self, c: BertConfig):
    super().__init__()
    self.embeddings, self.encoder, self.pooler = TEmbeddings(c), TEncoder(c), TPooler(c)

  def forward(self, ids, mask, types):
    additive = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
    x = self.embeddings(ids, types)
    for layer in self.encoder.layer: x = layer(x, additive)
    return x, torch.tanh(self.pooler.dense(x[:, 0]))


def t_encode(hidden, mask):   # sentence-transformers' mean pooling, then F.normalize
  m = mask.unsqueeze(-1).float()
  return tF.normalize((hidden * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=-1)


CONFIG = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                    max_position_embeddings=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def hf_checkpoint(twin: TBert, path) -> str:
  """The twin's weights as a BertForMaskedLM file names them: "bert." in front, position_ids, an MLM head."""
  state = {f"bert.{k}": v.contiguous() for k, v in twin.state_dict().items()}
  state["cls.predictions.bias"] = torch.zeros(CONFIG.vocab_size)
  save_file(state, str(path))
  return str(path)


def twin_pair(tmp_path) -> tuple[BertModel, TBert]:
  torch.manual_seed(0)
  twin = TBert(CONFIG)
  with torch.no_grad():
    for m in twin.modules():
      if isinstance(m, tnn.LayerNorm): m.weight.uniform_(0.5, 1.5), m.bias.uniform_(-0.2, 0.2)
  return BertModel(CONFIG, weights=hf_checkpoint(twin, tmp_path / "bert.safetensors")), twin


def batch(seed: int = 0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, CONFIG.vocab_size, (3, 9))
  mask = np.ones((3, 9), np.int64)
  mask[1, 5:], mask[2, 2:] = 0, 0       # padding at the ends of two sequences
  ids[mask == 0] = CONFIG.pad_token_id
  types = np.zeros((3, 9), np.int64)
  types[0, 4:] = 1                      # a sentence pair in the first row
  return ids, mask, types


def test_hugging_face_names():
  ours = {k: tuple(v.shape) for k, v in BertModel(BertConfig.base()).state_dict().items()}
  # bert-base-uncased's BertModel: 199 tensors (without position_ids), 109,482,240 parameters
  assert len(ours) == 199 and sum(int(np.prod(s)) for s in ours.values()) == 109_482_240
  for name in ("embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
               "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight",
               "encoder.layer.11.attention.self.query.weight", "encoder.layer.0.attention.self.key.bias",
               "encoder.layer.0.attention.self.value.weight", "encoder.layer.0.attention.output.dense.weight",
               "encoder.layer.0.attention.output.LayerNorm.bias", "encoder.layer.0.intermediate.dense.weight",
               "encoder.layer.0.output.dense.weight", "encoder.layer.0.output.LayerNorm.weight", "pooler.dense.weight"):
    assert name in ours, name
  assert hf_name("bert.encoder.layer.0.output.LayerNorm.gamma") == "encoder.layer.0.output.LayerNorm.weight"
  assert hf_name("cls.predictions.transform.dense.weight") is None and hf_name("embeddings.position_ids") is None


def test_matches_pytorch_twin(tmp_path):
  model, twin = twin_pair(tmp_path)
  ids, mask, types = batch()
  hidden = model(Tensor(ids), Tensor(mask), Tensor(types))
  pooled, sentences = model.pooler_output(hidden), mean_pool(hidden, Tensor(mask), normalize=True)
  t_hidden, t_pooled = twin(to_torch(ids), to_torch(mask), to_torch(types))
  t_sentences = t_encode(t_hidden, to_torch(mask))
  # padded positions' hidden states are computed in both, from the same real keys: they must agree too
  assert_close(hidden.numpy(), t_hidden.detach().numpy(), "hidden states", rtol=1e-4, atol_scale=1e-5)
  assert_close(pooled.numpy(), t_pooled.detach().numpy(), "pooled", rtol=1e-4, atol_scale=1e-5)
  assert_close(sentences.numpy(), t_sentences.detach().numpy(), "sentence embeddings", rtol=1e-4, atol_scale=1e-5)
  assert_close(model.encode(Tensor(ids), Tensor(mask), Tensor(types)).numpy(), t_sentences.detach().numpy(), "encode",
               rtol=1e-4, atol_scale=1e-5)
  target = np.random.default_rng(5).standard_normal((3, CONFIG.hidden_size)).astype(np.float32)
  loss = (sentences * Tensor(target)).sum() + pooled.square().mean()
  t_loss = (t_sentences * to_torch(target)).sum() + t_pooled.square().mean()
  np.testing.assert_allclose(loss.item(), t_loss.item(), rtol=1e-4, atol=1e-5)
  loss.backward(), t_loss.backward()
  assert assert_same_grads(model, twin) == 5 + 16 * CONFIG.num_hidden_layers + 2


def test_masking_ignores_what_padding_holds(tmp_path):
  """A sequence's embedding doesn't depend on its padding tokens or on how much padding follows it."""
  model, _ = twin_pair(tmp_path)
  ids, mask, _ = batch()
  alone = model.encode(Tensor(ids[1:2, :5]), Tensor(mask[1:2, :5])).numpy()
  other_padding = ids.copy()
  other_padding[1, 5:] = 7
  padded = model.encode(Tensor(other_padding), Tensor(mask)).numpy()[1:2]
  np.testing.assert_allclose(padded, alone, rtol=1e-5, atol=1e-6)


def test_adamw_steps_match_pytorch(tmp_path):
  model, twin = twin_pair(tmp_path)
  ids, mask, types = batch(1)
  target = np.random.default_rng(6).standard_normal((3, CONFIG.hidden_size)).astype(np.float32)

  def loss(m): return (m.encode(Tensor(ids), Tensor(mask), Tensor(types)) - Tensor(target)).square().mean()

  def t_loss(t):
    hidden = t(to_torch(ids), to_torch(mask), to_torch(types))[0]
    return (t_encode(hidden, to_torch(mask)) - to_torch(target)).square().mean()
  # the pooler gets no gradient from this loss: PyTorch's AdamW skips it, ours must leave it alone too
  losses = assert_same_training(model, twin, loss, t_loss, lambda m: AdamW(m.parameters(), lr=1e-2),
                                lambda t: torch.optim.AdamW(t.parameters(), lr=1e-2))
  assert losses[-1] < losses[0]
  np.testing.assert_allclose(model.pooler.dense.weight.numpy(), twin.pooler.dense.weight.detach().numpy(), rtol=1e-6)


def test_load_and_input_errors(tmp_path):
  twin = TBert(CONFIG)
  path = tmp_path / "other.safetensors"
  save_file({k: v.contiguous() for k, v in twin.state_dict().items() if "pooler" not in k}, str(path))
  with pytest.raises(RuntimeError, match=r"missing keys .*pooler\.dense\.weight"): BertModel(CONFIG, weights=path)
  assert BertModel(BertConfig(**{**vars(CONFIG), "add_pooling_layer": False}), weights=path).pooler is None
  model = BertModel(CONFIG)
  with pytest.raises(ValueError, match="integer token ids"): model(Tensor.zeros(2, 3))
  with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 4\), input_ids \(2, 3\)"):
    model(Tensor.zeros(2, 3, dtype="int32"), Tensor.ones(2, 4))
  with pytest.raises(ValueError, match="sequence length 20 is above max_position_embeddings 16"):
    model(Tensor.zeros(1, 20, dtype="int32"))
