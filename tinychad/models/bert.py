"""BERT, the bidirectional transformer encoder (Devlin et al. 2018), with Hugging Face's names, and mean
pooling for sentence embeddings.

in: token ids (B, T) int, optional attention_mask (B, T) (1 = a real token, 0 = padding) and token_type_ids
out: BertModel(...) -> the last hidden states (B, T, hidden); .pooler_output(h) -> tanh(dense(h[:, 0])) as
     Hugging Face's pooler; .encode(ids, mask) -> one embedding per sentence, the mean of its real tokens'
     hidden states (sentence-transformers' mean pooling), L2-normalised unless normalize=False.
Post-LN blocks as in the paper: x = LayerNorm(x + attention(x)); x = LayerNorm(x + output(gelu(intermediate(x)))).
Names follow transformers' BertModel: embeddings.word_embeddings / position_embeddings / token_type_embeddings /
LayerNorm, encoder.layer.N.attention.self.query / key / value, encoder.layer.N.attention.output.dense /
LayerNorm, encoder.layer.N.intermediate.dense, encoder.layer.N.output.dense / LayerNorm, pooler.dense.
BertModel(config, weights="model.safetensors") loads a Hugging Face checkpoint: the names go through hf_name,
which drops a leading "bert." (BertFor... checkpoints), the old TF names gamma / beta, the pre-training heads
(cls.*) and the position_ids buffer older checkpoints carry. BertConfig.mini_lm() is all-MiniLM-L6-v2's shape
(a common sentence-embedding model); BertConfig.tiny() is Google's BERT-Tiny (2 layers, 128 wide).

Padding: the mask is given to scaled_dot_product_attention as a boolean mask, so padding keys get no weight.
A sequence that is all padding gets zero attention output here, where Hugging Face's finite -3.4e38 mask
averages its values; its mean-pooled embedding is zero in both.
"""
from __future__ import annotations
import os
from dataclasses import dataclass
from tinychad import nn
from tinychad.dtype import dtypes
from tinychad.nn import functional as F
from tinychad.nn.state import load_weights
from tinychad.tensor import Tensor


@dataclass
class BertConfig:
  vocab_size: int = 30522
  hidden_size: int = 768
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  hidden_dropout_prob: float = 0.1
  attention_probs_dropout_prob: float = 0.1
  pad_token_id: int = 0
  add_pooling_layer: bool = True

  @staticmethod
  def base(**kw) -> BertConfig: return BertConfig(**kw)

  @staticmethod
  def mini_lm(**kw) -> BertConfig:
    return BertConfig(**{"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536,
                         **kw})

  @staticmethod
  def tiny(**kw) -> BertConfig:
    return BertConfig(**{"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512,
                         **kw})


class BertEmbeddings(nn.Module):
  """token + position + token type embeddings, summed, then LayerNorm and dropout."""
  def __init__(self, config: BertConfig):
    self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
    self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
    self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
    self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
    self.dropout = nn.Dropout(config.hidden_dropout_prob)

  def forward(self, input_ids: Tensor, token_type_ids: Tensor) -> Tensor:
    positions = Tensor.arange(input_ids.shape[1], device=input_ids.device).reshape(1, -1)
    x = self.word_embeddings(input_ids) + self.position_embeddings(positions) + self.token_type_embeddings(token_type_ids)
    return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
  def __init__(self, config: BertConfig):
    if config.hidden_size % config.num_attention_heads:
      raise ValueError(f"BERT: hidden_size {config.hidden_size} must divide by "
                       f"num_attention_heads {config.num_attention_heads}")
    self.num_heads, self.dropout_p = config.num_attention_heads, config.attention_probs_dropout_prob
    self.query = nn.Linear(config.hidden_size, config.hidden_size)
    self.key = nn.Linear(config.hidden_size, config.hidden_size)
    self.value = nn.Linear(config.hidden_size, config.hidden_size)

  def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
    B, T, C = x.shape
    q, k, v = (proj(x).reshape(B, T, self.num_heads, C // self.num_heads).transpose(1, 2)
               for proj in (self.query, self.key, self.value))
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout_p if self.training else 0.0)
    return y.transpose(1, 2).reshape(B, T, C)


class BertSelfOutput(nn.Module):
  """LayerNorm(residual + dropout(dense(x))): the attention block's output projection and its post-LN."""
  def __init__(self, config: BertConfig, in_features: int):
    self.dense = nn.Linear(in_features, config.hidden_size)
    self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
    self.dropout = nn.Dropout(config.hidden_dropout_prob)

  def forward(self, x: Tensor, residual: Tensor) -> Tensor: return self.LayerNorm(residual + self.dropout(self.dense(x)))


class BertAttention(nn.Module):
  def __init__(self, config: BertConfig):
    self.self = BertSelfAttention(config)
    self.output = BertSelfOutput(config, config.hidden_size)

  def forward(self, x: Tensor, mask: Tensor | None) -> Tensor: return self.output(self.self(x, mask), x)


class BertIntermediate(nn.Module):
  def __init__(self, config: BertConfig): self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
  def forward(self, x: Tensor) -> Tensor: return self.dense(x).gelu()   # exact (erf) GELU, as BERT's "gelu"


class BertLayer(nn.Module):
  def __init__(self, config: BertConfig):
    self.attention = BertAttention(config)
    self.intermediate = BertIntermediate(config)
    self.output = BertSelfOutput(config, config.intermediate_size)   # Hugging Face's BertOutput: the same shape

  def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
    x = self.attention(x, mask)
    return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
  def __init__(self, config: BertConfig):
    self.layer = nn.ModuleList([BertLayer(config) for _ in range(config.num_hidden_layers)])

  def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
    for layer in self.layer: x = layer(x, mask)
    return x


class BertPooler(nn.Module):
  def __init__(self, config: BertConfig): self.dense = nn.Linear(config.hidden_size, config.hidden_size)
  def forward(self, hidden: Tensor) -> Tensor: return self.dense(hidden[:, 0]).tanh()


def hf_name(name: str) -> str | None:
  """A Hugging Face BERT checkpoint's name -> BertModel's, or None for the tensors BertModel doesn't have."""
  name = name.removeprefix("bert.")
  if name.startswith("cls.") or name == "embeddings.position_ids": return None
  return name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")


class BertModel(nn.Module):
  """embeddings -> encoder (num_hidden_layers BertLayers) -> last hidden states; pooler and mean pooling on top."""
  def __init__(self, config: BertConfig | None = None, weights: str | os.PathLike | dict | None = None):
    self.config = config = config or BertConfig()
    self.embeddings = BertEmbeddings(config)
    self.encoder = BertEncoder(config)
    self.pooler = BertPooler(config) if config.add_pooling_layer else None
    # BERT's init: every weight N(0, 0.02), biases 0, LayerNorms the identity, the padding row zero
    for module in self.modules():
      if isinstance(module, (nn.Linear, nn.Embedding)):
        module.weight.assign(Tensor.normal(*module.weight.shape, std=0.02)).realize()
      if isinstance(module, nn.Linear): module.bias.assign(Tensor.zeros(*module.bias.shape)).realize()
    pad = config.pad_token_id
    words = self.embeddings.word_embeddings.weight
    words.assign((Tensor.arange(config.vocab_size).reshape(-1, 1) != pad).where(words, 0)).realize()
    if weights is not None: load_weights(self, weights, rename=hf_name)

  def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None) -> Tensor:
    if input_ids.ndim != 2 or input_ids.dtype.is_float:
      raise ValueError(f"BertModel: input_ids must be integer token ids (B, T), "
                       f"got {input_ids.dtype} of shape {tuple(input_ids.shape)}")
    B, T = input_ids.shape
    if T > self.config.max_position_embeddings:
      raise ValueError(f"BertModel: sequence length {T} is above "
                       f"max_position_embeddings {self.config.max_position_embeddings}")
    for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
      if t is not None and tuple(t.shape) != (B, T):
        raise ValueError(f"BertModel: {name} has shape {tuple(t.shape)}, input_ids {(B, T)}")
    if token_type_ids is None: token_type_ids = Tensor.zeros(B, T, dtype=dtypes.int32, device=input_ids.device)
    # (B, 1, 1, T): every query of a sequence may attend to that sequence's real tokens only
    mask = (attention_mask != 0).reshape(B, 1, 1, T) if attention_mask is not None else None
    return self.encoder(self.embeddings(input_ids, token_type_ids), mask)

  def pooler_output(self, hidden: Tensor) -> Tensor:
    """Hugging Face's pooled output: tanh(dense(the first token's hidden state))."""
    if self.pooler is None: raise ValueError("BertModel: built with add_pooling_layer=False, so it has no pooler")
    return self.pooler(hidden)

  def encode(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
             normalize: bool = True) -> Tensor:
    """Sentence embeddings (B, hidden): the mean of each sequence's real tokens' hidden states."""
    hidden = self(input_ids, attention_mask, token_type_ids)
    return mean_pool(hidden, attention_mask, normalize)


def mean_pool(hidden: Tensor, attention_mask: Tensor | None = None, normalize: bool = False) -> Tensor:
  """(B, T, H) hidden states, (B, T) mask -> (B, H) mean over the unmasked positions (sentence-transformers'
  pooling: the count is clamped at 1e-9, so an all-padding row gives zeros), L2-normalised if asked."""
  if attention_mask is None: pooled = hidden.mean(1)
  else:
    weights = (attention_mask != 0).cast(hidden.dtype).unsqueeze(-1)
    pooled = (hidden * weights).sum(1) / weights.sum(1).maximum(1e-9)
  if not normalize: return pooled
  # F.normalize's: x / max(||x||, 1e-12)
  return pooled / (pooled.square().sum(-1, keepdim=True).sqrt().maximum(1e-12))
