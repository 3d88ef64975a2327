"""Layers: nn.Modules whose Parameter attributes are the parameters (nn.state finds them by walking attributes).

in: Tensors  ->  out: Tensors. PyTorch's class names, argument names, weight shapes, attribute names and
initialisation, so a PyTorch state_dict loads as is (see nn/state.py). Lists and dicts of layers are fine:
their items are named `layers.0.weight` as in PyTorch. Each layer's forward() does the work; `layer(x)` calls it.
Train/eval is per module (nn/module.py has the rule and how it meets the global Tensor.training, which modules
never switched follow); nn.train(model) / nn.eval(model) also work for a model that is a plain object.
More layers with PyTorch's names (activations, pooling, reshaping, transformer) are in nn/layers.py.
nn.LSTM and nn.LSTMCell are in nn/lstm.py.
"""
from __future__ import annotations
import math
from collections.abc import Callable
from typing import Any
import numpy as np
from tinychad.dtype import dtypes
from tinychad.helpers import prod
from tinychad.nn import functional as F
from tinychad.tensor import Tensor
from tinychad.nn.module import Module, ModuleDict, ModuleList, Parameter
from tinychad.distributed import comm


def train(model: Any = None, mode: bool = True) -> Any:
  """Switch dropout and batchnorm to training behaviour (or back with mode=False); returns the model.
  A Module is switched with its submodules (Module.train); the global Tensor.training is set in any case."""
  if isinstance(model, Module): return model.train(mode)
  Tensor.training = mode
  return model


def eval(model: Any = None) -> Any:  # noqa: A001 -- PyTorch's name
  """Switch dropout off and batchnorm to its running statistics; returns the model."""
  return train(model, False)


def _check_sizes(layer: str, **sizes: int) -> None:
  for name, size in sizes.items():
    if not isinstance(size, int) or size <= 0: raise ValueError(f"{layer}: {name} must be a positive int, got {size!r}")


def _uniform(*shape: int, bound: float) -> Parameter:
  return Parameter(Tensor.uniform(*shape, low=-bound, high=bound))


class Linear(Module):
  """y = x @ weight.T + bias, weight (out_features, in_features), PyTorch's uniform init."""
  def __init__(self, in_features: int, out_features: int, bias: bool = True):
    _check_sizes("Linear", in_features=in_features, out_features=out_features)
    bound = 1 / math.sqrt(in_features)
    self.weight = _uniform(out_features, in_features, bound=bound)
    self.bias = _uniform(out_features, bound=bound) if bias else None

  def forward(self, x: Tensor) -> Tensor:
    if x.shape[-1] != self.weight.shape[1]:
      raise ValueError(f"Linear: input of shape {tuple(x.shape)} has {x.shape[-1]} features, the layer expects {self.weight.shape[1]}")
    return F.linear(x, self.weight, self.bias)


class _ConvNd(Module):
  """Weight (out_channels, in_channels/groups, *kernel_size); PyTorch's init: kaiming_uniform(a=sqrt(5)),
  which works out to uniform(+-1/sqrt(fan_in)) for the weight and the bias alike."""
  n = 0

  def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
               groups: int = 1, bias: bool = True):
    _check_sizes(type(self).__name__, in_channels=in_channels, out_channels=out_channels, groups=groups)
    if in_channels % groups or out_channels % groups:
      raise ValueError(f"{type(self).__name__}: in_channels {in_channels} and out_channels {out_channels} must divide by groups {groups}")
    self.kernel_size = (kernel_size,) * self.n if isinstance(kernel_size, int) else tuple(kernel_size)
    _check_sizes(type(self).__name__, **{f"kernel_size[{i}]": k for i, k in enumerate(self.kernel_size)})
    self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
    bound = 1 / math.sqrt(in_channels // groups * prod(self.kernel_size))
    self.weight = _uniform(out_channels, in_channels // groups, *self.kernel_size, bound=bound)
    self.bias = _uniform(out_channels, bound=bound) if bias else None

  def forward(self, x: Tensor) -> Tensor:
    return F.conv(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups, self.n,
                  f"conv{self.n}d")


class Conv1d(_ConvNd):
  """(N, C_in, L) -> (N, C_out, L_out)."""
  n = 1


class Conv2d(_ConvNd):
  """(N, C_in, H, W) -> (N, C_out, H_out, W_out)."""
  n = 2


class ConvTranspose2d(Module):
  """(N, C_in, H, W) -> (N, C_out, H_out, W_out); weight (in_channels, out_channels/groups, kh, kw) as in PyTorch,
  whose init takes fan_in from the weight's second dim."""
  def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0,
               groups: int = 1, bias: bool = True, dilation=1):
    self.kernel_size = (kernel_size,) * 2 if isinstance(kernel_size, int) else tuple(kernel_size)
    self.stride, self.padding, self.output_padding, self.groups, self.dilation = stride, padding, output_padding, groups, dilation
    bound = 1 / math.sqrt(out_channels // groups * prod(self.kernel_size))
    self.weight = _uniform(in_channels, out_channels // groups, *self.kernel_size, bound=bound)
    self.bias = _uniform(out_channels, bound=bound) if bias else None

  def forward(self, x: Tensor) -> Tensor:
    return x.conv_transpose2d(self.weight, self.bias, self.stride, self.padding, self.output_padding, self.groups, self.dilation)


class _BatchNorm(Module):
  """Normalise each channel (dim 1) by the batch's statistics while training, by the running ones in eval.

  Running stats follow PyTorch: running = (1 - momentum) * running + momentum * batch, with the unbiased
  batch variance; momentum=None means a cumulative average over num_batches_tracked batches.
  """
  def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
               track_running_stats: bool = True):
    self.num_features, self.eps, self.momentum, self.track_running_stats = num_features, eps, momentum, track_running_stats
    self.weight = Parameter(Tensor.ones(num_features)) if affine else None
    self.bias = Parameter(Tensor.zeros(num_features)) if affine else None
    if track_running_stats:
      self.register_buffer("running_mean", Tensor.zeros(num_features))
      self.register_buffer("running_var", Tensor.ones(num_features))
      self.register_buffer("num_batches_tracked", Tensor.zeros((), dtype=dtypes.int64))

  ndims: tuple[int, ...] = ()  # the input ranks each subclass accepts

  def forward(self, x: Tensor) -> Tensor:
    if x.ndim not in self.ndims: raise ValueError(f"{type(self).__name__}: expected a {' or '.join(map(str, self.ndims))}-d input, got shape {tuple(x.shape)}")
    if x.shape[1] != self.num_features:
      raise ValueError(f"{type(self).__name__}: input {tuple(x.shape)} has {x.shape[1]} channels, expected {self.num_features}")
    if self.training or not self.track_running_stats:
      mean, var, count = self._batch_stats(x, tuple(i for i in range(x.ndim) if i != 1))
      if self.training and self.track_running_stats: self._update_running(mean.detach(), var.detach(), count)
    else:
      mean, var = self.running_mean, self.running_var
    return x.batchnorm(self.weight, self.bias, mean, (var + self.eps).rsqrt())

  def _batch_stats(self, x: Tensor, axes: tuple[int, ...]) -> tuple[Tensor, Tensor, int]:
    """Per channel: the batch mean, the biased variance, and how many values each is over."""
    mean = x.mean(axes)
    var = (x - mean.reshape((1, -1) + (1,) * (x.ndim - 2))).square().mean(axes)
    return mean, var, x.numel() // x.shape[1]

  def _update_running(self, mean: Tensor, var: Tensor, count: int) -> None:
    self.num_batches_tracked.assign(self.num_batches_tracked + 1)
    momentum = self.momentum if self.momentum is not None else 1 / (self.num_batches_tracked.item())
    unbiased = var * (count / max(count - 1, 1))
    self.running_mean.assign((1 - momentum) * self.running_mean + momentum * mean)
    self.running_var.assign((1 - momentum) * self.running_var + momentum * unbiased)
    # realize now: otherwise each step's running stats would hang on to the whole previous graph
    Tensor.realize(self.running_mean, self.running_var, self.num_batches_tracked)


class BatchNorm1d(_BatchNorm):
  """(N, C) or (N, C, L)."""
  ndims = (2, 3)


class BatchNorm2d(_BatchNorm):
  """(N, C, H, W)."""
  ndims = (4,)


class SyncBatchNorm(_BatchNorm):
  """BatchNorm whose batch statistics cover every rank's batch (data-parallel training, tinychad.distributed):
  the same as one process normalising the whole batch. Two all-reduces per call, sums then squared
  deviations, so the variance is the same two-pass one BatchNorm computes; both are differentiable, so
  the gradient flows across ranks too. In a world of one it is a plain BatchNorm."""
  ndims = (2, 3, 4, 5)

  def _batch_stats(self, x: Tensor, axes: tuple[int, ...]) -> tuple[Tensor, Tensor, int]:
    count = (x.numel() // x.shape[1]) * comm.world_size()
    mean = comm.all_reduce_sum(x.sum(axes)) / count
    deviations = (x - mean.reshape((1, -1) + (1,) * (x.ndim - 2))).square().sum(axes)
    return mean, comm.all_reduce_sum(deviations) / count, count

  @classmethod
  def convert_sync_batchnorm(cls, module: Module) -> Module:
    """`module` with every BatchNorm1d/2d replaced by a SyncBatchNorm holding the same tensors (PyTorch's name)."""
    if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
      sync = cls.__new__(cls)
      sync.__dict__.update(module.__dict__)
      return sync
    # children live in attributes, and in the list (Sequential, ModuleList) or dict (ModuleDict) a module may be
    containers = [vars(module)] + [c for c in (module,) if isinstance(c, (list, dict))]
    for container in containers:
      for key, child in list(container.items() if isinstance(container, dict) else enumerate(container)):
        if isinstance(child, Module): container[key] = cls.convert_sync_batchnorm(child)
    return module


def _normalized_shape(shape) -> tuple[int, ...]:
  return (shape,) if isinstance(shape, int) else tuple(shape)


class LayerNorm(Module):
  """Normalise over the last len(normalized_shape) dims, then scale by weight and shift by bias."""
  def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True):
    self.normalized_shape, self.eps = _normalized_shape(normalized_shape), eps
    self.weight = Parameter(Tensor.ones(*self.normalized_shape)) if elementwise_affine else None
    self.bias = Parameter(Tensor.zeros(*self.normalized_shape)) if elementwise_affine and bias else None

  def forward(self, x: Tensor) -> Tensor: return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class GroupNorm(Module):
  """Split the channels (dim 1) into num_groups groups and normalise each group over its channels and positions."""
  def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
    _check_sizes("GroupNorm", num_groups=num_groups, num_channels=num_channels)
    if num_channels % num_groups: raise ValueError(f"GroupNorm: num_channels {num_channels} must divide by num_groups {num_groups}")
    self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
    self.weight = Parameter(Tensor.ones(num_channels)) if affine else None
    self.bias = Parameter(Tensor.zeros(num_channels)) if affine else None

  def forward(self, x: Tensor) -> Tensor:
    if x.ndim < 2 or x.shape[1] != self.num_channels:
      raise ValueError(f"GroupNorm: input {tuple(x.shape)} should have {self.num_channels} channels in dim 1")
    x = x.reshape(x.shape[0], self.num_groups, -1).layernorm(-1, self.eps).reshape(x.shape)
    if self.weight is None: return x
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return x * self.weight.reshape(shape) + self.bias.reshape(shape)


class RMSNorm(Module):
  """x / sqrt(mean(x^2) + eps) * weight over the last dims; eps=None means the dtype's machine epsilon, as PyTorch."""
  def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True):
    self.normalized_shape, self.eps = _normalized_shape(normalized_shape), eps
    self.weight = Parameter(Tensor.ones(*self.normalized_shape)) if elementwise_affine else None

  def forward(self, x: Tensor) -> Tensor:
    axes = tuple(range(-len(self.normalized_shape), 0))
    eps = self.eps if self.eps is not None else float(np.finfo(x.dtype.np).eps)
    x = x * (x.square().mean(axes, keepdim=True) + eps).rsqrt()
    return x * self.weight if self.weight is not None else x


class Embedding(Module):
  """Integer indices of any shape -> their rows of weight (num_embeddings, embedding_dim), init N(0, 1)."""
  def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None):
    self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
    self.weight = Parameter(Tensor.randn(num_embeddings, embedding_dim))
    if padding_idx is not None:
      # PyTorch zeroes the padding row at init (it also keeps its gradient at zero: see forward)
      self.weight.assign((Tensor.arange(num_embeddings).reshape(-1, 1) != padding_idx).where(self.weight, 0)).realize()

  def forward(self, idx: Tensor) -> Tensor:
    out = F.embedding(idx, self.weight)
    if self.padding_idx is None: return out
    return (idx != self.padding_idx).unsqueeze(-1).where(out, out.detach())


class Dropout(Module):
  """Zero each element with probability p while the module is training, scaling the rest by 1/(1-p)."""
  def __init__(self, p: float = 0.5):
    if not 0 <= p <= 1: raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
    self.p = p

  def forward(self, x: Tensor) -> Tensor: return x.dropout(self.p, self.training)


class MultiheadAttention(Module):
  """PyTorch's nn.MultiheadAttention (same-size query, key, value): in_proj_weight (3E, E) and in_proj_bias (3E)
  project q, k, v; out_proj is a Linear(E, E). Inputs (L, N, E), or (N, L, E) with batch_first.

  Returns (output, attention weights (N, L, S), averaged over heads unless average_attn_weights=False,
  or None when need_weights=False). attn_mask: bool (True = not allowed, as PyTorch) or float (added);
  key_padding_mask (N, S): True marks padding keys.
  """
  def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True, batch_first: bool = False):
    _check_sizes("MultiheadAttention", embed_dim=embed_dim, num_heads=num_heads)
    if embed_dim % num_heads: raise ValueError(f"MultiheadAttention: embed_dim {embed_dim} must divide by num_heads {num_heads}")
    self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
    self.in_proj_weight = Parameter(Tensor.glorot_uniform(3 * embed_dim, embed_dim))
    self.in_proj_bias = Parameter(Tensor.zeros(3 * embed_dim)) if bias else None
    self.out_proj = Linear(embed_dim, embed_dim, bias=bias)
    if bias: self.out_proj.bias = Parameter(Tensor.zeros(embed_dim))

  def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None,
               need_weights: bool = True, attn_mask: Tensor | None = None, average_attn_weights: bool = True,
               is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
    unbatched, packed = query.ndim == 2, query is key is value
    if unbatched: query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
    elif self.batch_first: query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
    (L, N, E), S, H = query.shape, key.shape[0], self.num_heads

    def heads(x: Tensor, length: int) -> Tensor:  # (len, N, E) -> (N, H, len, E/H)
      return x.reshape(length, N, H, E // H).permute(1, 2, 0, 3)
    if packed:
      # self-attention: one projection 3E wide, as PyTorch's packed in_proj (one matmul, one per gradient)
      q, k, v = (heads(x, L) for x in F.linear(query, self.in_proj_weight, self.in_proj_bias).chunk(3, -1))
    else:
      (wq, wk, wv), (bq, bk, bv) = self.in_proj_weight.chunk(3), \
        self.in_proj_bias.chunk(3) if self.in_proj_bias is not None else (None, None, None)
      q, k, v = heads(F.linear(query, wq, bq), L), heads(F.linear(key, wk, bk), S), heads(F.linear(value, wv, bv), S)
    mask = _merge_masks(attn_mask.reshape(N, H, L, S) if attn_mask is not None and attn_mask.ndim == 3 else attn_mask,
                        key_padding_mask.reshape(N, 1, 1, S) if key_padding_mask is not None else None)
    # an explicit attn_mask wins over the is_causal hint, as in PyTorch
    causal, dropout = is_causal and attn_mask is None, self.dropout if self.training else 0.0
    if need_weights or dropout > 0: attended, weights = F.attention(q, k, v, mask, dropout, causal)   # (N, H, L, E/H)
    else: attended, weights = F.scaled_dot_product_attention(q, k, v, mask, 0.0, causal), None     # flash-style
    out = self.out_proj(attended.permute(2, 0, 1, 3).reshape(L, N, E))
    if unbatched: out = out.squeeze(1)
    elif self.batch_first: out = out.transpose(0, 1)
    if not need_weights: return out, None
    weights = weights.mean(1) if average_attn_weights else weights
    return out, (weights.squeeze(0) if unbatched else weights)


def _merge_masks(attn_mask: Tensor | None, key_padding_mask: Tensor | None) -> Tensor | None:
  """MultiheadAttention's masks (bool True = may NOT attend, or float added to the scores) as one mask in
  scaled_dot_product_attention's terms (bool True = may attend, or float added)."""
  masks = [m.logical_not() if m.dtype == dtypes.bool else m for m in (attn_mask, key_padding_mask) if m is not None]
  if not masks: return None
  if len(masks) == 1: return masks[0]
  if all(m.dtype == dtypes.bool for m in masks): return masks[0] & masks[1]
  additive = [m.where(0.0, -math.inf) if m.dtype == dtypes.bool else m for m in masks]
  return additive[0] + additive[1]


class Sequential(Module, list):
  """Layers (or any callables) applied in order. A list, so its parameters are named `0.weight`, `1.bias`, ...
  (PyTorch's Sequential(OrderedDict(...)) form is not supported)."""
  def __init__(self, *layers):
    list.__init__(self, layers)

  def forward(self, x: Tensor) -> Tensor:
    for layer in self: x = layer(x)
    return x


from tinychad.nn.lstm import LSTM, LSTMCell  # noqa: E402,F401 -- nn.LSTM, nn.LSTMCell
from tinychad.nn.layers import (AdaptiveAvgPool2d, AvgPool2d, ConvTranspose1d, Flatten, GELU, Identity, LeakyReLU,  # noqa: E402
                                LogSoftmax, MaxPool2d, PixelShuffle, ReLU, Sigmoid, SiLU, Softmax, Tanh,
                                Unflatten, Upsample, RotaryEmbedding)
from tinychad.nn.layers import (AvgPool1d, ELU, GLU, Hardswish, LogSigmoid, MaxPool1d, Mish, ReLU6, Softplus,  # noqa: E402
                                Softsign, Unfold)


def _activation(activation: str | Callable) -> Callable[[Tensor], Tensor]:
  if callable(activation): return activation
  if activation == "relu": return Tensor.relu
  if activation == "gelu": return Tensor.gelu
  raise ValueError(f"TransformerEncoderLayer: activation must be 'relu', 'gelu' or a callable, got {activation!r}")


class TransformerEncoderLayer(Module):
  """PyTorch's: self-attention then a feed-forward block, each with dropout, a residual and a LayerNorm (after
  each block, or before it with norm_first). Inputs (S, N, E), or (N, S, E) with batch_first."""
  def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1, activation="relu",
               layer_norm_eps: float = 1e-5, batch_first: bool = False, norm_first: bool = False, bias: bool = True):
    self._args = dict(d_model=d_model, nhead=nhead, dim_feedforward=dim_feedforward, dropout=dropout, activation=activation,
                      layer_norm_eps=layer_norm_eps, batch_first=batch_first, norm_first=norm_first, bias=bias)
    self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first)
    self.linear1, self.dropout, self.linear2 = Linear(d_model, dim_feedforward, bias), Dropout(dropout), Linear(dim_feedforward, d_model, bias)
    self.norm_first = norm_first
    self.norm1, self.norm2 = LayerNorm(d_model, layer_norm_eps, bias=bias), LayerNorm(d_model, layer_norm_eps, bias=bias)
    self.dropout1, self.dropout2 = Dropout(dropout), Dropout(dropout)
    self.activation = _activation(activation)

  def _attend(self, x: Tensor, mask: Tensor | None, padding: Tensor | None, is_causal: bool) -> Tensor:
    out = self.self_attn(x, x, x, attn_mask=mask, key_padding_mask=padding, need_weights=False, is_causal=is_causal)[0]
    return self.dropout1(out)

  def _feed_forward(self, x: Tensor) -> Tensor:
    return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))

  def forward(self, src: Tensor, src_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
              is_causal: bool = False) -> Tensor:
    x = src
    if self.norm_first:
      x = x + self._attend(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
      return x + self._feed_forward(self.norm2(x))
    x = self.norm1(x + self._attend(x, src_mask, src_key_padding_mask, is_causal))
    return self.norm2(x + self._feed_forward(x))


class TransformerEncoder(Module):
  """num_layers copies of encoder_layer (same initial weights, as PyTorch's deep copies), then an optional norm."""
  def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm: Module | None = None):
    if num_layers <= 0: raise ValueError(f"TransformerEncoder: num_layers must be positive, got {num_layers}")
    self.layers = ModuleList(_copy_layer(encoder_layer) for _ in range(num_layers))
    self.num_layers, self.norm = num_layers, norm

  def forward(self, src: Tensor, mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
              is_causal: bool = False) -> Tensor:
    x = src
    for layer in self.layers: x = layer(x, mask, src_key_padding_mask, is_causal)
    return self.norm(x) if self.norm is not None else x


def _copy_layer(layer: TransformerEncoderLayer) -> TransformerEncoderLayer:
  copy = TransformerEncoderLayer(**layer._args)
  copy.load_state_dict({name: t.detach() for name, t in layer.state_dict().items()})
  copy._training = layer._training
  return copy
