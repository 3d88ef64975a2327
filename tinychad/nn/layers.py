"""Layers with PyTorch's names for what the Tensor methods and nn.functional already compute.

in: Tensors  ->  out: Tensors. Activations, pooling, reshaping, upsampling, a 1-d transposed convolution, the
transformer encoder and rotary position embedding; argument and attribute names as PyTorch's, so a PyTorch model's
file ports by its imports and its state_dict loads as is.
"""
from __future__ import annotations
import math
import numpy as np
from tinychad.helpers import prod
from tinychad.nn import functional as F
from tinychad.nn.module import Module, Parameter
from tinychad.tensor import Tensor


# ---- activations ----
class ReLU(Module):
  def __init__(self, inplace: bool = False): pass
  def forward(self, x: Tensor) -> Tensor: return x.relu()


class GELU(Module):
  def __init__(self, approximate: str = "none"): self.approximate = approximate
  def forward(self, x: Tensor) -> Tensor: return x.gelu(self.approximate)


class SiLU(Module):
  def __init__(self, inplace: bool = False): pass
  def forward(self, x: Tensor) -> Tensor: return x.silu()


class Tanh(Module):
  def forward(self, x: Tensor) -> Tensor: return x.tanh()


class Sigmoid(Module):
  def forward(self, x: Tensor) -> Tensor: return x.sigmoid()


class LeakyReLU(Module):
  def __init__(self, negative_slope: float = 0.01, inplace: bool = False): self.negative_slope = negative_slope
  def forward(self, x: Tensor) -> Tensor: return x.leaky_relu(self.negative_slope)


class Softmax(Module):
  def __init__(self, dim: int | None = None):
    if dim is None: raise ValueError("Softmax: give dim (PyTorch's implicit choice of dim is deprecated)")
    self.dim = dim
  def forward(self, x: Tensor) -> Tensor: return x.softmax(self.dim)


class LogSoftmax(Softmax):
  def forward(self, x: Tensor) -> Tensor: return x.log_softmax(self.dim)


class ReLU6(Module):
  def __init__(self, inplace: bool = False): pass
  def forward(self, x: Tensor) -> Tensor: return x.relu6()


class ELU(Module):
  def __init__(self, alpha: float = 1.0, inplace: bool = False): self.alpha = alpha
  def forward(self, x: Tensor) -> Tensor: return x.elu(self.alpha)


class Softplus(Module):
  def __init__(self, beta: float = 1.0, threshold: float = 20.0): self.beta, self.threshold = beta, threshold
  def forward(self, x: Tensor) -> Tensor: return x.softplus(self.beta, self.threshold)


class Mish(Module):
  def __init__(self, inplace: bool = False): pass
  def forward(self, x: Tensor) -> Tensor: return x.mish()


class Hardswish(Module):
  def __init__(self, inplace: bool = False): pass
  def forward(self, x: Tensor) -> Tensor: return x.hardswish()


class LogSigmoid(Module):
  def forward(self, x: Tensor) -> Tensor: return x.logsigmoid()


class Softsign(Module):
  def forward(self, x: Tensor) -> Tensor: return x.softsign()


class GLU(Module):
  def __init__(self, dim: int = -1): self.dim = dim
  def forward(self, x: Tensor) -> Tensor: return F.glu(x, self.dim)


class Identity(Module):
  def __init__(self, *args, **kwargs): pass
  def forward(self, x: Tensor) -> Tensor: return x


# ---- reshaping ----
class Flatten(Module):
  def __init__(self, start_dim: int = 1, end_dim: int = -1): self.start_dim, self.end_dim = start_dim, end_dim
  def forward(self, x: Tensor) -> Tensor: return x.flatten(self.start_dim, self.end_dim)


class Unflatten(Module):
  def __init__(self, dim: int, unflattened_size): self.dim, self.unflattened_size = dim, tuple(unflattened_size)
  def forward(self, x: Tensor) -> Tensor: return x.unflatten(self.dim, self.unflattened_size)


class PixelShuffle(Module):
  """(N, C*r*r, H, W) -> (N, C, H*r, W*r)."""
  def __init__(self, upscale_factor: int): self.upscale_factor = upscale_factor
  def forward(self, x: Tensor) -> Tensor: return F.pixel_shuffle(x, self.upscale_factor)


class Upsample(Module):
  """nearest or bilinear (align_corners both ways), by size or scale_factor: F.interpolate."""
  def __init__(self, size=None, scale_factor=None, mode: str = "nearest", align_corners: bool | None = None):
    self.size, self.scale_factor, self.mode, self.align_corners = size, scale_factor, mode, align_corners
  def forward(self, x: Tensor) -> Tensor: return F.interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners)


# ---- pooling ----
class MaxPool2d(Module):
  """return_indices=True returns (values, flat indices into each input's H*W), as PyTorch's."""
  n = 2
  def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices: bool = False, ceil_mode: bool = False):
    self.kernel_size, self.stride, self.padding, self.dilation = kernel_size, stride, padding, dilation
    self.return_indices, self.ceil_mode = return_indices, ceil_mode
  def forward(self, x: Tensor):
    return F.max_pool(x, self.kernel_size, self.stride, self.padding, self.dilation, self.n, self.ceil_mode, self.return_indices)


class MaxPool1d(MaxPool2d): n = 1


class AvgPool2d(Module):
  n = 2
  def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True):
    self.kernel_size, self.stride, self.padding, self.count_include_pad = kernel_size, stride, padding, count_include_pad
    self.ceil_mode = ceil_mode
  def forward(self, x: Tensor) -> Tensor:
    return F.avg_pool(x, self.kernel_size, self.stride, self.padding, self.count_include_pad, self.n, self.ceil_mode)


class AvgPool1d(AvgPool2d): n = 1


class Unfold(Module):
  """im2col: (N, C, H, W) -> (N, C * kh * kw, L), F.unfold."""
  def __init__(self, kernel_size, dilation=1, padding=0, stride=1):
    self.kernel_size, self.dilation, self.padding, self.stride = kernel_size, dilation, padding, stride
  def forward(self, x: Tensor) -> Tensor: return F.unfold(x, self.kernel_size, self.dilation, self.padding, self.stride)


class AdaptiveAvgPool2d(Module):
  def __init__(self, output_size): self.output_size = output_size
  def forward(self, x: Tensor) -> Tensor: return F.adaptive_avg_pool2d(x, self.output_size)


# ---- convolution ----
class ConvTranspose1d(Module):
  """(N, C_in, L) -> (N, C_out, L_out); weight (in_channels, out_channels/groups, k), PyTorch's init."""
  def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0,
               groups: int = 1, bias: bool = True, dilation=1):
    if groups <= 0 or in_channels % groups or out_channels % groups:
      raise ValueError(f"ConvTranspose1d: in_channels {in_channels} and out_channels {out_channels} must divide by groups {groups}")
    self.kernel_size = (kernel_size,) if isinstance(kernel_size, int) else tuple(kernel_size)
    self.stride, self.padding, self.output_padding, self.groups, self.dilation = stride, padding, output_padding, groups, dilation
    bound = 1 / math.sqrt(out_channels // groups * prod(self.kernel_size))
    self.weight = Parameter(Tensor.uniform(in_channels, out_channels // groups, *self.kernel_size, low=-bound, high=bound))
    self.bias = Parameter(Tensor.uniform(out_channels, low=-bound, high=bound)) if bias else None

  def forward(self, x: Tensor) -> Tensor:
    return F.conv_transpose(x, self.weight, self.bias, self.stride, self.padding, self.output_padding, self.groups, self.dilation, 1)


# ---- transformer ----


# ---- positions ----
class RotaryEmbedding(Module):
  """Rotary position embedding: angles pos * base^(-2i/dim) for positions < max_seq_len, kept as cos/sin tables
  (non-persistent buffers: not in the state dict). forward(x (..., T, dim), positions=None) rotates x as at
  positions 0..T-1, or at `positions` (an int Tensor of T entries, say a KV cache's write position onwards)."""
  def __init__(self, dim: int, max_seq_len: int = 2048, base: float = 10000.0):
    if dim % 2: raise ValueError(f"RotaryEmbedding: dim must be even, got {dim}")
    self.dim, self.max_seq_len, self.base = dim, max_seq_len, base
    angles = np.outer(np.arange(max_seq_len), base ** (-np.arange(0, dim, 2) / dim)).astype(np.float32)
    self.register_buffer("cos", Tensor(np.cos(angles), requires_grad=False), persistent=False)
    self.register_buffer("sin", Tensor(np.sin(angles), requires_grad=False), persistent=False)

  def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
    length = x.shape[-2]
    if positions is None:
      if length > self.max_seq_len: raise ValueError(f"RotaryEmbedding: {length} positions, max_seq_len is {self.max_seq_len}")
      cos, sin = self.cos[:length], self.sin[:length]
    else:
      cos, sin = self.cos[positions], self.sin[positions]
    return F.apply_rotary_emb(x, cos, sin)
