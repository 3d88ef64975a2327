"""Neural-network functions built from Tensor ops: convolutions, pooling, einsum, losses, attention.

in: Tensors (PyTorch's layouts: NCHW activations, (out, in/groups, kh, kw) conv weights)
out: Tensors. A convolution is a windowed view of the input (movement ops only: `pool_windows`)
multiplied by the weight and summed: one reduce kernel, no im2col copy. It is one autograd node
(`Conv`) whose backward is two more such window sums (or, for the input gradient of a small image
with a wide kernel or of a strided convolution, a matmul, or for a depthwise one a product, and a sum
of shifted views), so no gradient scatters overlapping windows.
"""
from __future__ import annotations
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
import numpy as np
from tinychad.dtype import dtypes, promote_types
from tinychad.function import Function
from tinychad.lazy import LazyBuffer
from tinychad.ops import LoadOps
from tinychad.tensor import Tensor, _shape_str


def _tuple(value, n: int, name: str, op: str, positive: bool = False) -> tuple[int, ...]:
  out = (value,) * n if isinstance(value, int) else tuple(value)
  if len(out) != n: raise ValueError(f"{op}: {name} must be an int or {n} ints, got {value}")
  # a zero stride or dilation would divide by zero further on; a negative one would make no sense
  if positive and any(v <= 0 for v in out): raise ValueError(f"{op}: {name} must be positive, got {value}")
  if not positive and any(v < 0 for v in out): raise ValueError(f"{op}: {name} must not be negative, got {value}")
  return out


def _check_pool_padding(pads, kernel, dilation, op: str) -> None:
  """PyTorch's limit: padding at most half the (dilated) kernel, so no window lies wholly in the padding (a max
  pool would return -inf there)."""
  for (before, after), k, d in zip(pads, kernel, dilation):
    if max(before, after) * 2 > d * (k - 1) + 1:
      raise ValueError(f"{op}: padding {pads} should be at most half of the kernel {tuple(kernel)} (dilation {tuple(dilation)})")


def _check_windows(x_shape, pads, kernel, dilation, op: str) -> None:
  """Every spatial dim, padded, must hold at least one window (PyTorch raises too: an empty output hides a bug)."""
  spatial = x_shape[len(x_shape) - len(kernel):]
  for size, (before, after), k, d in zip(spatial, pads, kernel, dilation):
    if size + before + after < d * (k - 1) + 1:
      raise ValueError(f"{op}: kernel {_shape_str(kernel)} (dilation {dilation}) is larger than the padded input "
                       f"{_shape_str(x_shape)} with padding {pads}")


def pool_windows(x: Tensor, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]) -> Tensor:
  """(..., *spatial) -> (..., *out, *kernel): every window of the last len(kernel) dims, as a view."""
  n = len(kernel)
  lead, spatial = x.shape[:-n], x.shape[-n:]
  outs = [(i - d * (k - 1) - 1) // s + 1 for i, k, s, d in zip(spatial, kernel, stride, dilation)]
  nl = len(lead)
  if all(k == s for k, s in zip(kernel, stride)) and all(d == 1 for d in dilation):
    # non-overlapping windows: crop to whole windows, split each dim into (out, kernel)
    x = x.shrink(tuple((0, s) for s in lead) + tuple((0, o * k) for o, k in zip(outs, kernel)))
    x = x.reshape(lead + tuple(v for o, k in zip(outs, kernel) for v in (o, k)))
    return x.permute(tuple(range(nl)) + tuple(nl + 2 * i for i in range(n)) + tuple(nl + 2 * i + 1 for i in range(n)))
  # overlapping windows: repeat each dim e times, so that the row r of a (kernel, i+d) reshape starts
  # r*d further into the input; a stride s step is then every s-th column
  repeats = [math.ceil(k * (i + d) / i) for i, k, d in zip(spatial, kernel, dilation)]
  x = x.repeat((1,) * nl + tuple(repeats))
  x = x.shrink(tuple((0, s) for s in lead) + tuple((0, k * (i + d)) for i, k, d in zip(spatial, kernel, dilation)))
  x = x.reshape(lead + tuple(v for i, k, d in zip(spatial, kernel, dilation) for v in (k, i + d)))
  fit = [(0, 0)] * nl + [p for i, d, o, s in zip(spatial, dilation, outs, stride) for p in ((0, 0), (0, o * s - (i + d)))]
  x = x.pad(tuple(fit))
  x = x.reshape(lead + tuple(v for k, o, s in zip(kernel, outs, stride) for v in (k, o, s)))
  x = x.shrink(tuple((0, s) for s in lead) + tuple(w for k, o in zip(kernel, outs) for w in ((0, k), (0, o), (0, 1))))
  x = x.reshape(lead + tuple(v for k, o in zip(kernel, outs) for v in (k, o)))
  return x.permute(tuple(range(nl)) + tuple(nl + 2 * i + 1 for i in range(n)) + tuple(nl + 2 * i for i in range(n)))


def _padding_pairs(padding, kernel, dilation, n: int, op: str) -> tuple[tuple[int, int], ...]:
  if padding == "valid": return ((0, 0),) * n
  if padding == "same":
    total = [d * (k - 1) for k, d in zip(kernel, dilation)]
    return tuple((t // 2, t - t // 2) for t in total)
  if isinstance(padding, (tuple, list)) and padding and isinstance(padding[0], (tuple, list)): return tuple(tuple(p) for p in padding)
  return tuple((p, p) for p in _tuple(padding, n, "padding", op))


@dataclass(frozen=True)
class ConvGeometry:
  stride: tuple[int, ...]
  pads: tuple[tuple[int, int], ...]      # (before, after) per spatial dim
  dilation: tuple[int, ...]
  groups: int


def _dense(x: Tensor) -> Tensor:
  """x in its own contiguous buffer, unless it is a view of a constant (the gradient of a sum): a
  kernel reads a constant through any view, padding included, without memory."""
  base = x.lazydata.base
  return x if base.op is LoadOps.CONST and base.realized is None else x.contiguous()


def _padded(x: Tensor, pads: tuple[tuple[int, int], ...]) -> Tensor:
  """(bs, c, *spatial) zero-padded by `pads`, in its own buffer: a padded read is a masked load, which the
  code generator can only do lane by lane (and whose window view needs div/mod index math); a dense
  padded copy costs one pass over the input and lets every window reduction over it run in SIMD."""
  if all(p == (0, 0) for p in pads): return x
  return _dense(x.pad(((0, 0), (0, 0)) + pads))


# output channels per group below which a convolution's sum is laid out NCHW, SIMD lanes along the
# output width, instead of channels-last: a channels-last sum runs its lanes over the output channels of
# one group, and with too few of them (a depthwise convolution has one) the lanes gather the input from
# channel planes apart, one element at a time. 8 (half an AVX-512 vector) still fill lanes along the
# channels for any image width, where the width may divide no vector (NCHW would then be scalar)
CHANNELS_LAST_MIN_OUT_GROUP = 8


def _window_product(x: Tensor, weight: Tensor, geo: ConvGeometry) -> Tensor:
  """The convolution itself: windows of the padded input times the weight, summed. (bs, cin, *in) -> (bs, cout, *out)

  With at least CHANNELS_LAST_MIN_OUT_GROUP output channels per group, the sum is laid out
  channels-last, (bs, *out, cout), and returned as an NCHW view of it: output channels are the
  contiguous axis of both the sum and a (channels-last) copy of the weight, while the input is the same
  along it, so SIMD lanes run over output channels for any image width, and each weight vector is
  reused across neighbouring output positions (the same register tile as a matmul). With fewer (a
  depthwise convolution), it is laid out NCHW: the input's windows and the sum are both contiguous
  along the output width (at stride 1), the lanes run there, and the weight is one value per lane.
  """
  n, bs = len(geo.stride), x.shape[0]
  cout, cin_group = weight.shape[:2]
  kernel = weight.shape[2:]
  x = _padded(x, geo.pads)
  windows = pool_windows(x, kernel, geo.stride, geo.dilation)                 # (bs, cin, *out, *kernel)
  outs = windows.shape[2:2 + n]
  out_group = cout // geo.groups
  windows = windows.reshape((bs, geo.groups, cin_group) + outs + kernel)
  w = weight.reshape((geo.groups, out_group, cin_group) + kernel)
  spatial, taps = tuple(3 + i for i in range(n)), tuple(3 + n + i for i in range(n))
  if out_group < CHANNELS_LAST_MIN_OUT_GROUP:
    # windows as (bs, groups, 1, *out, cin_group, *kernel), weight as (1, groups, out_group, *1, cin_group, *kernel)
    windows = windows.permute((0, 1) + spatial + (2,) + taps).reshape((bs, geo.groups, 1) + outs + (cin_group,) + kernel)
    w = w.reshape((1, geo.groups, out_group) + (1,) * n + (cin_group,) + kernel)
    return (windows * w).sum(tuple(range(-1 - n, 0))).reshape((bs, cout) + outs)
  # windows as (bs, *out, groups, 1, cin_group, *kernel), weight as (1, *1, groups, out_group, cin_group, *kernel)
  windows = windows.permute((0,) + spatial + (1, 2) + taps).reshape((bs,) + outs + (geo.groups, 1, cin_group) + kernel)
  w = w.permute((0, 2) + tuple(3 + i for i in range(n)) + (1,)).contiguous()    # (groups, cin_group, *kernel, out_group)
  w = w.permute((0, 2 + n, 1) + tuple(2 + i for i in range(n))).reshape((1,) * (1 + n) + (geo.groups, out_group, cin_group) + kernel)
  out = (windows * w).sum(tuple(range(-1 - n, 0))).reshape((bs,) + outs + (cout,))
  # (bs, cout, *out) as a view of the channels-last sum: elementwise ops and reductions on it (bias,
  # ReLU, pooling) keep that layout (lazy.py), with SIMD lanes along the channels
  return out.permute((0, n + 1) + tuple(1 + i for i in range(n)))


def _spread(x: Tensor, stride: tuple[int, ...]) -> Tensor:
  """(bs, c, *spatial) with stride-1 zeros between neighbours: the input of a transposed convolution."""
  if all(s == 1 for s in stride): return x
  bs, c, spatial = x.shape[0], x.shape[1], x.shape[2:]
  x = x.reshape((bs, c) + tuple(v for i in spatial for v in (i, 1)))
  x = x.pad(((0, 0), (0, 0)) + tuple(p for s in stride for p in ((0, 0), (0, s - 1))))
  x = x.reshape((bs, c) + tuple(i * s for i, s in zip(spatial, stride)))
  return x.shrink(((0, bs), (0, c)) + tuple((0, (i - 1) * s + 1) for i, s in zip(spatial, stride)))


def _flipped_transposed(weight: Tensor, groups: int) -> Tensor:
  """(cout, cin/groups, *k) -> (cin, cout/groups, *k) with every kernel flipped: the weight of the transposed convolution."""
  cout, cin_group = weight.shape[:2]
  kernel = weight.shape[2:]
  w = weight.reshape((groups, cout // groups, cin_group) + kernel).transpose(1, 2)
  return w.flip(*range(3, 3 + len(kernel))).reshape((groups * cin_group, cout // groups) + kernel)


# a channels-last copy of the output gradient pays for itself when each of its elements feeds this
# many multiply-adds of the weight gradient (cin/groups * kernel size); below, the copy costs more
CHANNELS_LAST_GRAD_MIN_WORK = 128
# the weight gradient re-reads the whole output gradient once per register tile of weights: from L2 when
# it is at most this big (half of this Xeon's 2 MiB L2), else the batch is summed in parts that fit
WEIGHT_GRAD_PART_BYTES = 1 << 20


def _weight_gradient_is_channels_last(weight: Tensor, grad: Tensor) -> bool:
  """Whether the weight gradient reads a channels-last copy of the output gradient (see below)."""
  # a gradient that is channels-last already (the ops after the convolution kept its layout) needs no
  # copy for that path, and an NCHW copy of it is a transposing kernel that doesn't vectorize (3.7 ms
  # of a 24 ms CNN step): it always takes that path
  return weight.numel() // weight.shape[0] >= CHANNELS_LAST_GRAD_MIN_WORK or grad.lazydata.st.permuted_order is not None


def _weight_gradient(windows: Tensor, grad: Tensor, groups: int, out_group: int, grad_cl: Tensor | None) -> Tensor:
  """Windows (bs, groups, cin_group, *out, *kernel) times the output gradient (bs, cout, *out), summed over
  batch and positions: (groups, out_group, cin_group, *kernel), as a view. `grad_cl` is the gradient's
  channels-last copy when the caller has made one."""
  bs, cin_group = windows.shape[0], windows.shape[2]
  n = (windows.ndim - 3) // 2
  outs, kernel = windows.shape[3:3 + n], windows.shape[3 + n:]
  # (bs, *out) go last, to be reduced
  windows = windows.permute((1, 2) + tuple(3 + n + i for i in range(n)) + (0,) + tuple(3 + i for i in range(n)))
  if grad_cl is None:
    # outputs (groups, out_group, cin_group, *kernel): SIMD lanes run along the output width, a reduce axis
    # summed over the batch in parts that fit L2, as below
    parts = _batch_parts(bs, math.prod(outs) * groups * out_group * grad.dtype.itemsize)
    windows = windows.reshape((groups, 1, cin_group) + kernel + (parts, bs // parts) + outs)
    windows = windows.permute((3 + n,) + tuple(i for i in range(windows.ndim) if i != 3 + n))
    grad_r = grad.reshape((bs, groups, out_group) + outs).permute((1, 2, 0) + tuple(3 + i for i in range(n)))
    grad_r = grad_r.reshape((groups, out_group, parts, bs // parts) + outs).permute((2, 0, 1) + tuple(range(3, 4 + n)))
    grad_r = grad_r.reshape((parts, groups, out_group, 1) + (1,) * n + (bs // parts,) + outs)
    return (windows * grad_r).sum(tuple(range(-1 - n, 0))).sum(0)
  # outputs (groups, cin_group, *kernel, out_group): like the forward, SIMD lanes run over output channels,
  # contiguous in a channels-last copy of the gradient, and each gradient vector serves several weights
  # the batch is cut into `parts` (an outer, parallel axis) whose weight gradients are summed after:
  # each part's gradient then stays in L2 while every register tile of weights streams over it
  parts = _batch_parts(bs, math.prod(outs) * groups * out_group * grad.dtype.itemsize)
  windows = windows.reshape((groups, cin_group) + kernel + (parts, bs // parts) + outs)
  windows = windows.permute((2 + n,) + tuple(i for i in range(windows.ndim) if i != 2 + n))
  windows = windows.reshape((parts, groups, cin_group) + kernel + (1, bs // parts) + outs)
  grad_cl = grad_cl.reshape((bs,) + outs + (groups, out_group))
  grad_cl = grad_cl.permute((1 + n, 2 + n, 0) + tuple(1 + i for i in range(n)))      # (groups, out_group, bs, *outs)
  grad_cl = grad_cl.reshape((groups, out_group, parts, bs // parts) + outs).permute((2, 0, 1) + tuple(range(3, 4 + n)))
  grad_cl = grad_cl.reshape((parts, groups, 1) + (1,) * n + (out_group, bs // parts) + outs)
  out = (windows * grad_cl).sum(tuple(range(-1 - n, 0))).sum(0)
  return out.permute((0, 2 + n, 1) + tuple(2 + i for i in range(n)))


# the input gradient as one convolution over the zero-padded (and, with a stride, spread) output
# gradient multiplies every tap at every input position; for a small image and a wide kernel most of
# those land in the padding (5x5 on 8x8 outputs: 144 positions x 25 taps where 64 x 25 are real), and
# with stride 2 three in four land between the strides. At this much waste it is computed tap by tap
# instead (_input_gradient_by_taps), which does only the real products but writes a buffer of every
# output position times every tap and input channel, so it is capped
TAPWISE_MIN_WASTE = 1.5
TAPWISE_MAX_BYTES = 256 << 20


def _channels_last(grad: Tensor) -> Tensor:
  """(bs, c, *spatial) -> (bs, *spatial, c), contiguous (a constant gradient stays a view: no memory)."""
  n = grad.ndim - 2
  return _dense(grad.permute((0,) + tuple(2 + i for i in range(n)) + (1,)))


def _tapwise_pays(x_shape: tuple[int, ...], weight: Tensor, grad: Tensor, geo: ConvGeometry) -> bool:
  """Whether the input gradient should go tap by tap: a one-group or depthwise (one output channel per
  group) convolution whose full-correlation form (over every input position, the gradient spread by
  the stride) would waste TAPWISE_MIN_WASTE times the needed work, with a product buffer under
  TAPWISE_MAX_BYTES."""
  if geo.groups != 1 and weight.shape[0] != geo.groups: return False
  ins, outs = x_shape[2:], grad.shape[2:]
  products = x_shape[0] * math.prod(outs) * weight.numel() // weight.shape[0]
  return math.prod(ins) >= TAPWISE_MIN_WASTE * math.prod(outs) and products * grad.dtype.itemsize <= TAPWISE_MAX_BYTES


def _tap_products(grad_cl: Tensor, weight: Tensor, groups: int) -> Callable[[tuple[int, ...]], tuple[Tensor, Tensor | None]]:
  """For a tap, every output position's contribution through it to every input channel, from the
  channels-last output gradient (bs, *out, cout):
  products[b, *o, ci] = sum over the co of ci's group of grad[b, *o, co] * weight[co, ci % cin_group, *tap],
  as tap -> (values (bs, *out, cin), factor (cin,) or None): products = values * factor."""
  n = grad_cl.ndim - 2
  lead = grad_cl.shape[:-1]
  cout, cin_group = weight.shape[:2]
  kernel = weight.shape[2:]
  if groups == 1:
    # one matmul for all taps: (cout, *kernel, cin), a product row over taps, then input channels (SIMD
    # lanes of the tap sum); copied, as the matmul's lanes need them contiguous
    weight_rows = weight.permute((0,) + tuple(2 + i for i in range(n)) + (1,)).contiguous().reshape(cout, -1)
    products = (grad_cl.reshape(-1, cout) @ weight_rows).reshape(lead + kernel + (cin_group,))
    def tap_slice(tap: tuple[int, ...]) -> tuple[Tensor, Tensor | None]:
      piece = products.shrink(tuple((0, size) for size in lead) + tuple((k, k + 1) for k in tap) + ((0, cin_group),))
      return piece.reshape(lead + (cin_group,)), None
    return tap_slice
  # depthwise (one output channel per group): nothing to sum, each channel's gradient times its tap
  # weight. The factor stays apart so the tap sum shifts the gradient itself, a view of memory, and
  # multiplies as it reads (a product per tap would be a buffer as big as the gradient)
  spread_over_group = grad_cl.reshape(lead + (cout, 1)).expand(lead + (cout, cin_group)).reshape(lead + (cout * cin_group,))
  # (*kernel, cin): each tap's factors contiguous, like the SIMD lanes that read them
  taps = weight.permute(tuple(2 + i for i in range(n)) + (0, 1)).contiguous().reshape(kernel + (cout * cin_group,))
  def tap_factor(tap: tuple[int, ...]) -> tuple[Tensor, Tensor | None]:
    return spread_over_group, taps.shrink(tuple((k, k + 1) for k in tap) + ((0, cout * cin_group),)).reshape(cout * cin_group)
  return tap_factor


def _input_gradient_by_taps(grad_cl: Tensor, weight: Tensor, geo: ConvGeometry, x_shape: tuple[int, ...]) -> Tensor:
  """The input gradient of a one-group or depthwise convolution from its channels-last output gradient (bs, *out, cout).

  _tap_products gives every output position's contribution through every tap (one matmul with one
  group, a broadcast product for a depthwise convolution), and each input position
  y = o*stride + k*dilation - pad_before sums the products that reach it. Each input axis is seen as
  (q, r) with y = q*stride + r: a tap reaches one r only, and moves q one step per output position, so
  its products are one shifted, zero-padded view, and all taps add up in one elementwise kernel.
  Returns (bs, cin, *in), a view of channels-last memory."""
  n, bs, cin = len(geo.stride), x_shape[0], x_shape[1]
  ins, outs = x_shape[2:], grad_cl.shape[1:1 + n]
  kernel = weight.shape[2:]
  products_at = _tap_products(grad_cl, weight, geo.groups)
  rows = [-(-size // s) for size, s in zip(ins, geo.stride)]      # q's extent per axis
  total = None
  for tap in itertools.product(*(range(k) for k in kernel)):
    keep, pads = [], []
    for o, k, d, (before, _), s, q_size in zip(outs, tap, geo.dilation, geo.pads, geo.stride, rows):
      r = (k * d - before) % s
      shift = (k * d - before - r) // s       # the q that output position 0 reaches
      lo, hi = max(0, -shift), min(o, q_size - shift)
      keep.append((lo, hi))
      pads += [(lo + shift, q_size - hi - shift), (r, s - 1 - r)]
    if any(lo >= hi for lo, hi in keep): continue   # a tap that reaches only padding
    values, factor = products_at(tap)
    piece = values.shrink(((0, bs),) + tuple(keep) + ((0, cin),))
    piece = piece.reshape((bs,) + tuple(v for lo, hi in keep for v in (hi - lo, 1)) + (cin,))
    piece = piece.pad(((0, 0),) + tuple(pads) + ((0, 0),))
    if factor is not None: piece = piece * factor
    total = piece if total is None else total + piece
  if total is None:     # every window lies in the padding (or between the strides): no gradient reaches x
    return Tensor.zeros((bs, cin) + ins, dtype=grad_cl.dtype, device=grad_cl.device)
  total = total.reshape((bs,) + tuple(q * s for q, s in zip(rows, geo.stride)) + (cin,))
  total = total.shrink(((0, bs),) + tuple((0, size) for size in ins) + ((0, cin),))
  return total.permute((0, n + 1) + tuple(1 + i for i in range(n)))


def _batch_parts(bs: int, sample_bytes: int) -> int:
  """The fewest parts (a divisor of bs) whose share of the output gradient fits WEIGHT_GRAD_PART_BYTES."""
  return next((p for p in range(1, bs + 1) if bs % p == 0 and bs // p * sample_bytes <= WEIGHT_GRAD_PART_BYTES), bs)


class Conv(Function):
  """A convolution as one autograd node, so that its backward is made of convolutions too (as in PyTorch).

  Left to the movement ops' own rules, the input gradient would scatter-add overlapping windows back
  into place, a kernel whose index math (div/mod through stacked views) can't be vectorized. Here:
    input gradient  = the output gradient, spread by the stride, convolved with the flipped weight;
    weight gradient = the input's windows times the output gradient, summed over batch and positions.
  Both are window reductions like the forward. Where most of the input gradient's products would fall
  in the zero padding or between the strides, it is computed tap by tap instead (_input_gradient_by_taps). (No second
  derivatives: backward builds no graph.)
  """
  def forward(self, x: LazyBuffer, weight: LazyBuffer, geo: ConvGeometry) -> LazyBuffer:
    # a channels-last input (the previous convolution's output, kept in its layout through ReLU) is
    # copied to NCHW once: both window sums of this convolution read it many times over
    if x.st.permuted_order is not None: x = x.contiguous()
    self.x, self.weight, self.geo = Tensor(x, requires_grad=False), Tensor(weight, requires_grad=False), geo
    # the padded input is made once: the weight gradient's windows read the same copy
    self.x_padded = _padded(self.x, geo.pads)
    unpadded = ConvGeometry(geo.stride, ((0, 0),) * len(geo.stride), geo.dilation, geo.groups)
    return _window_product(self.x_padded, self.weight, unpadded).lazydata

  def backward(self, grad_lazy: LazyBuffer) -> tuple[LazyBuffer | None, LazyBuffer | None]:
    grad, geo, n = Tensor(grad_lazy, requires_grad=False), self.geo, len(self.geo.stride)
    kernel, outs = self.weight.shape[2:], grad.shape[2:]
    grad_x = grad_w = None
    tapwise = self.needs_input_grad[0] and _tapwise_pays(self.x.shape, self.weight, grad, geo)
    weight_reads_cl = self.needs_input_grad[1] and _weight_gradient_is_channels_last(self.weight, grad)
    # both gradients may read a channels-last copy of the output gradient: it is made once
    grad_cl = _channels_last(grad) if tapwise or weight_reads_cl else None
    if tapwise:
      grad_x = _input_gradient_by_taps(grad_cl, self.weight, geo, self.x.shape).lazydata
    elif self.needs_input_grad[0]:
      # pad the spread gradient so the "full" correlation lands exactly on the unpadded input
      spread = _spread(grad, geo.stride)
      pads = []
      for size, k, d, (before, after), o, s in zip(self.x.shape[2:], kernel, geo.dilation, geo.pads, outs, geo.stride):
        uncovered = size + before + after - ((o - 1) * s + d * (k - 1) + 1)     # trailing rows no window reached
        pads.append((d * (k - 1) - before, d * (k - 1) - after + uncovered))
      grad_x = _window_product(spread, _flipped_transposed(self.weight, geo.groups),
                               ConvGeometry((1,) * n, tuple(pads), geo.dilation, geo.groups)).lazydata
    if self.needs_input_grad[1]:
      bs, cin = self.x.shape[:2]
      cout, cin_group = self.weight.shape[:2]
      out_group = cout // geo.groups
      windows = pool_windows(self.x_padded, kernel, geo.stride, geo.dilation)
      windows = windows.reshape((bs, geo.groups, cin_group) + outs + kernel)
      grad_w = _weight_gradient(windows, grad, geo.groups, out_group, grad_cl if weight_reads_cl else None).reshape(self.weight.shape).lazydata
    return grad_x, grad_w


def conv(x: Tensor, weight: Tensor, bias: Tensor | None, stride, padding, dilation, groups: int, n: int, op: str) -> Tensor:
  unbatched = x.ndim == n + 1
  if unbatched: x = x.unsqueeze(0)
  if x.ndim != n + 2 or weight.ndim != n + 2:
    raise ValueError(f"{op}: expected input of {n + 2} dims and weight of {n + 2} dims, got input {_shape_str(x.shape)} ({x.dtype}) and weight {_shape_str(weight.shape)} ({weight.dtype})")
  cin = x.shape[1]
  cout, cin_group = weight.shape[:2]
  kernel = weight.shape[2:]
  if not isinstance(groups, int) or groups <= 0: raise ValueError(f"{op}: groups must be a positive int, got {groups!r}")
  if cin % groups or cout % groups or cin // groups != cin_group:
    raise ValueError(f"{op}: input {_shape_str(x.shape)} has {cin} channels but weight {_shape_str(weight.shape)} expects {cin_group}x{groups} groups")
  if any(k <= 0 for k in kernel): raise ValueError(f"{op}: weight {_shape_str(weight.shape)} has an empty kernel")
  stride, dilation = _tuple(stride, n, "stride", op, positive=True), _tuple(dilation, n, "dilation", op, positive=True)
  pads = _padding_pairs(padding, kernel, dilation, n, op)
  _check_windows(x.shape, pads, kernel, dilation, op)
  if x.dtype != weight.dtype:
    common = promote_types(x.dtype, weight.dtype)
    x, weight = x.cast(common), weight.cast(common)
  out = Conv.apply(x, weight, geo=ConvGeometry(stride, pads, dilation, groups))
  if bias is not None: out = out + bias.reshape((1, -1) + (1,) * n)
  return out.squeeze(0) if unbatched else out


def conv_transpose(x: Tensor, weight: Tensor, bias: Tensor | None, stride, padding, output_padding, groups: int, dilation, n: int) -> Tensor:
  """The gradient of a convolution: spread the input by `stride` (zeros between), then a convolution
  with the flipped, channel-swapped weight and padding dilation*(k-1)-padding. Where that convolution
  would mostly multiply the zeros between the strides (stride 2: three in four products in 2-D), it
  is the input gradient of the convolution this one transposes, computed tap by tap instead
  (_input_gradient_by_taps; 64 -> 32 channels, 28x28 -> 56x56, batch 32, forward and backward:
  103 -> 47-50 ms, PyTorch 36-44 ms)."""
  op = f"conv_transpose{n}d"
  if x.ndim == n + 1: return conv_transpose(x.unsqueeze(0), weight, bias, stride, padding, output_padding, groups, dilation, n).squeeze(0)
  if x.ndim != n + 2 or weight.ndim != n + 2:
    raise ValueError(f"{op}: expected input and weight of {n + 2} dims, got {_shape_str(x.shape)} and {_shape_str(weight.shape)}")
  cin, out_group = weight.shape[:2]
  kernel = weight.shape[2:]
  if not isinstance(groups, int) or groups <= 0: raise ValueError(f"{op}: groups must be a positive int, got {groups!r}")
  if x.shape[1] != cin or cin % groups:
    raise ValueError(f"{op}: input {_shape_str(x.shape)} has {x.shape[1]} channels, weight {_shape_str(weight.shape)} expects {cin}")
  stride, dilation = _tuple(stride, n, "stride", op, positive=True), _tuple(dilation, n, "dilation", op, positive=True)
  padding, output_padding = _tuple(padding, n, "padding", op), _tuple(output_padding, n, "output_padding", op)
  # the convolution this one transposes: from our output's shape to x's
  geo = ConvGeometry(stride, tuple((p, p) for p in padding), dilation, groups)
  sizes = tuple((size - 1) * s - 2 * p + d * (k - 1) + extra + 1
                for size, s, p, d, k, extra in zip(x.shape[2:], stride, padding, dilation, kernel, output_padding))
  out_shape = (x.shape[0], out_group * groups) + sizes
  if all(size > 0 for size in sizes) and _tapwise_pays(out_shape, weight, x, geo):
    out = _input_gradient_by_taps(_channels_last(x), weight, geo, out_shape)
    return out if bias is None else out + bias.reshape((1, -1) + (1,) * n)
  x, w = _spread(x, stride), _flipped_transposed(weight, groups)
  pads = tuple((d * (k - 1) - p, d * (k - 1) - p + op_) for k, d, p, op_ in zip(kernel, dilation, padding, output_padding))
  return conv(x, w, bias, 1, pads, dilation, groups, n, op)


def _pool(x: Tensor, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...], reduce) -> Tensor:
  """`reduce` (Tensor.max or Tensor.sum) over every window of the last len(kernel) dims."""
  n = len(kernel)
  if kernel != stride or any(d != 1 for d in dilation):
    return reduce(pool_windows(x, kernel, stride, dilation), tuple(range(-n, 0)))
  # non-overlapping windows: reduce the (out, kernel) split in place, without pool_windows' permute, so
  # the gradient (the result expanded over each window) is an affine view of a contiguous layout
  lead, outs = x.shape[:-n], [size // k for size, k in zip(x.shape[-n:], kernel)]
  x = x.shrink(tuple((0, s) for s in lead) + tuple((0, o * k) for o, k in zip(outs, kernel)))
  x = x.reshape(lead + tuple(v for o, k in zip(outs, kernel) for v in (o, k)))
  # a channels-last input (a convolution's output) is pooled in its own layout; the smaller result
  # goes back to NCHW, which the next convolution's windows and a flatten read without index math
  return reduce(x, tuple(len(lead) + 2 * i + 1 for i in range(n))).contiguous()


def max_pool(x: Tensor, kernel_size, stride, padding, dilation, n: int) -> Tensor:
  op = f"max_pool{n}d"
  if x.ndim < n + 1: raise ValueError(f"{op}: input of shape {_shape_str(x.shape)} needs at least {n + 1} dims")
  kernel = _tuple(kernel_size, n, "kernel_size", op, positive=True)
  stride = kernel if stride is None else _tuple(stride, n, "stride", op, positive=True)
  dilation = _tuple(dilation, n, "dilation", op, positive=True)
  pads = _padding_pairs(padding, kernel, dilation, n, op)
  _check_pool_padding(pads, kernel, dilation, op)
  _check_windows(x.shape, pads, kernel, dilation, op)
  fill = -math.inf if x.dtype.is_float else int(-2 ** (8 * x.dtype.itemsize - 1))
  x = x.pad(((0, 0),) * (x.ndim - n) + pads, value=fill)
  return _pool(x, kernel, stride, dilation, Tensor.max)


def avg_pool(x: Tensor, kernel_size, stride, padding, count_include_pad: bool, n: int) -> Tensor:
  op = f"avg_pool{n}d"
  if x.ndim < n + 1: raise ValueError(f"{op}: input of shape {_shape_str(x.shape)} needs at least {n + 1} dims")
  kernel = _tuple(kernel_size, n, "kernel_size", op, positive=True)
  stride = kernel if stride is None else _tuple(stride, n, "stride", op, positive=True)
  pads = ((0, 0),) * (x.ndim - n) + _padding_pairs(padding, kernel, (1,) * n, n, op)
  _check_pool_padding(pads[-n:], kernel, (1,) * n, op)
  _check_windows(x.shape, pads[-n:], kernel, (1,) * n, op)
  total = _pool(x.pad(pads), kernel, stride, (1,) * n, Tensor.sum)
  if count_include_pad: return total / math.prod(kernel)
  counts = _pool(Tensor.ones(x.shape[-n:], device=x.device).pad(pads[-n:]), kernel, stride, (1,) * n, Tensor.sum)
  return total / counts


def _diagonal(t: Tensor, dim0: int, dim1: int) -> Tensor:
  """The diagonal of dims dim0 and dim1 (same size n), as the last dim: a view that reads every (n+1)-th element."""
  n = t.shape[dim0]
  rest = [d for d in range(t.ndim) if d not in (dim0, dim1)]
  lead = tuple(t.shape[d] for d in rest)
  flat = t.permute(rest + [dim0, dim1]).reshape(lead + (n * n,))
  rows = flat.pad(((0, 0),) * len(lead) + ((0, n),)).reshape(lead + (n, n + 1))
  return rows.shrink(tuple((0, s) for s in lead) + ((0, n), (0, 1))).reshape(lead + (n,))


def _expand_ellipsis(terms: list[str], output: str | None, operands, formula: str) -> tuple[list[str], str | None]:
  """'...' becomes unused letters for the broadcast dims, right-aligned across the operands."""
  counts = [t.ndim - (len(term) - 3) for term, t in zip(terms, operands) if "..." in term]
  if any(c < 0 for c in counts): raise ValueError(f"einsum: an operand has fewer dims than {formula!r} names")
  free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" if c not in formula][:max(counts, default=0)]
  ellipsis = "".join(free)
  terms = [term.replace("...", ellipsis[len(ellipsis) - (t.ndim - (len(term) - 3)):]) if "..." in term else term
           for term, t in zip(terms, operands)]
  return terms, None if output is None else output.replace("...", ellipsis)


def einsum(formula: str, *operands: Tensor) -> Tensor:
  """Einstein summation: diagonals first (repeated letters in a term), then every operand broadcast to all
  letters, multiplied, and summed over the letters not in the output. '...' names the broadcast dims."""
  operands = tuple(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) else operands
  formula = formula.replace(" ", "")
  inputs, arrow, output = formula.partition("->")
  terms = inputs.split(",")
  if len(terms) != len(operands): raise ValueError(f"einsum: {formula!r} names {len(terms)} operands, got {len(operands)}")
  ellipsis = ""
  if "..." in formula:
    before = set(inputs)
    terms, output = _expand_ellipsis(terms, output if arrow else None, operands, formula)
    ellipsis = "".join(sorted({c for term in terms for c in term} - before))
  if not arrow:
    # PyTorch's implicit output: the broadcast dims, then the letters used once, sorted
    joined = "".join(terms)
    output = ellipsis + "".join(sorted(c for c in set(joined) if joined.count(c) == 1 and c not in ellipsis))
  sizes: dict[str, int] = {}
  diagonal_terms, diagonal_operands = [], []
  for term, t in zip(terms, operands):
    if len(term) != t.ndim: raise ValueError(f"einsum: term {term!r} has {len(term)} letters but operand has shape {_shape_str(t.shape)}")
    while len(set(term)) != len(term):
      letter = next(c for c in term if term.count(c) > 1)
      first, second = term.index(letter), term.index(letter, term.index(letter) + 1)
      if t.shape[first] != t.shape[second]: raise ValueError(f"einsum: repeated letter {letter!r} in {term!r} has sizes {t.shape[first]} and {t.shape[second]}")
      t = _diagonal(t, first, second)
      term = "".join(c for i, c in enumerate(term) if i not in (first, second)) + letter
    for letter, size in zip(term, t.shape):
      if sizes.setdefault(letter, size) != size and size != 1 and sizes[letter] != 1:
        raise ValueError(f"einsum: letter {letter!r} has sizes {sizes[letter]} and {size} in {formula!r}")
      sizes[letter] = max(sizes[letter], size)
    diagonal_terms.append(term)
    diagonal_operands.append(t)
  letters = sorted(sizes)
  product = None
  for term, t in zip(diagonal_terms, diagonal_operands):
    order = sorted(range(len(term)), key=lambda i: letters.index(term[i]))
    t = t.permute(order) if order else t
    shape = tuple(t.shape[sorted(term, key=letters.index).index(letter)] if letter in term else 1 for letter in letters)
    t = t.reshape(shape).expand(tuple(sizes[letter] for letter in letters))
    product = t if product is None else product * t
  summed = tuple(i for i, letter in enumerate(letters) if letter not in output)
  out = product.sum(summed) if summed else product
  remaining = [letter for letter in letters if letter in output]
  return out.permute(tuple(remaining.index(letter) for letter in output)) if output else out


# ---- losses ----
def _reduce(loss: Tensor, reduction: str, op: str) -> Tensor:
  if reduction == "mean": return loss.mean()
  if reduction == "sum": return loss.sum()
  if reduction == "none": return loss
  raise ValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _class_mask(target: Tensor, classes: int, ndim: int) -> Tensor:
  """One-hot of class indices along dim 1: (N, *rest) -> (N, C, *rest) bool."""
  arange = Tensor.arange(classes, device=target.device).reshape((1, classes) + (1,) * (ndim - 2))
  return target.unsqueeze(1) == arange


def nll_loss(logp: Tensor, target: Tensor, reduction: str = "mean", ignore_index: int = -100, weight: Tensor | None = None) -> Tensor:
  if not isinstance(target, Tensor): target = Tensor(target)
  if logp.ndim == 1:
    loss = nll_loss(logp.unsqueeze(0), target.reshape(1), reduction, ignore_index, weight)
    return loss.reshape(()) if reduction == "none" else loss
  if target.dtype.category != 1:
    raise TypeError(f"nll_loss: target must hold class indices (an integer tensor), got {target.dtype}")
  if target.shape != (logp.shape[0],) + logp.shape[2:]:
    raise ValueError(f"nll_loss: target shape {_shape_str(target.shape)} doesn't match input shape {_shape_str(logp.shape)}")
  classes = logp.shape[1]
  values = target.numpy()
  bad = values[(values != ignore_index) & ((values < 0) | (values >= classes))]
  if bad.size: raise IndexError(f"nll_loss: target {bad.flat[0]} is out of bounds for {classes} classes")
  mask = _class_mask(target, classes, logp.ndim)
  picked = -mask.where(logp, 0).sum(1)
  keep = (target != ignore_index).cast(logp.dtype)
  weights = keep if weight is None else mask.where(weight.reshape((1, classes) + (1,) * (logp.ndim - 2)), 0).sum(1) * keep
  loss = picked * weights
  if reduction == "mean": return loss.sum() / weights.sum()
  return _reduce(loss, reduction, "nll_loss")


def cross_entropy(x: Tensor, target: Tensor, reduction: str = "mean", label_smoothing: float = 0.0, ignore_index: int = -100) -> Tensor:
  if not 0.0 <= label_smoothing <= 1.0: raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
  if not isinstance(target, Tensor): target = Tensor(target)
  class_dim = 0 if x.ndim == 1 else 1
  logp = x.log_softmax(class_dim)
  classes = x.shape[class_dim]
  if target.dtype.is_float:
    if target.shape != x.shape: raise ValueError(f"cross_entropy: probability target shape {_shape_str(target.shape)} != input shape {_shape_str(x.shape)}")
    smoothed = target * (1 - label_smoothing) + label_smoothing / classes
    return _reduce(-(smoothed * logp).sum(class_dim), reduction, "cross_entropy")
  nll = nll_loss(logp, target, "none", ignore_index)
  keep = (target != ignore_index).cast(logp.dtype)
  if label_smoothing > 0:
    nll = (1 - label_smoothing) * nll + label_smoothing * -logp.mean(class_dim) * keep
  if reduction == "mean": return nll.sum() / keep.sum()
  return _reduce(nll, reduction, "cross_entropy")


def binary_cross_entropy(p: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
  if p.shape != target.shape: raise ValueError(f"binary_cross_entropy: input {_shape_str(p.shape)} and target {_shape_str(target.shape)} differ")
  # PyTorch clamps the logs at -100 so p = 0 or 1 gives a finite loss
  log_p, log_not_p = p.log().maximum(-100), (1 - p).log().maximum(-100)
  return _reduce(-(target * log_p + (1 - target) * log_not_p), reduction, "binary_cross_entropy")


def binary_cross_entropy_with_logits(x: Tensor, target: Tensor, reduction: str = "mean", pos_weight: Tensor | None = None) -> Tensor:
  if x.shape != target.shape: raise ValueError(f"binary_cross_entropy_with_logits: input {_shape_str(x.shape)} and target {_shape_str(target.shape)} differ")
  # log(1 + exp(-x)) written stably as softplus(-x)
  softplus_neg = (-x).relu() + (-(x.abs())).exp().log1p()
  weight = 1 if pos_weight is None else 1 + (pos_weight - 1) * target
  return _reduce((1 - target) * x + weight * softplus_neg, reduction, "binary_cross_entropy_with_logits")


def mse_loss(x: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
  """Input and target broadcast against each other, as in PyTorch."""
  return _reduce((x - target).square(), reduction, "mse_loss")


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None) -> Tensor:
  if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
    raise ValueError(f"scaled_dot_product_attention: q {_shape_str(q.shape)}, k {_shape_str(k.shape)}, v {_shape_str(v.shape)} don't fit")
  scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
  # keys as (..., dim, source), contiguous along source: the score matmul then runs SIMD lanes along
  # its output; read through the transposed view, its only contiguous axis is the reduce
  scores = (q @ k.transpose(-1, -2).contiguous()) * scale
  if is_causal:
    length, source = q.shape[-2], k.shape[-2]
    causal = Tensor.ones(length, source, dtype=dtypes.bool, device=q.device).tril()
    scores = causal.where(scores, -math.inf)
  if attn_mask is not None:
    scores = attn_mask.where(scores, -math.inf) if attn_mask.dtype == dtypes.bool else scores + attn_mask
  # the softmax, written out so its row maximum also tells which queries see no key: those get zero
  # weights (PyTorch's math backend), not the 0/0 of a softmax over -inf
  top = scores.max(-1, keepdim=True).detach()
  shifted = (scores - top).exp()
  weights = (top == -math.inf).where(0.0, shifted * shifted.sum(-1, keepdim=True).reciprocal())
  if dropout_p > 0: weights = weights.dropout(dropout_p)
  if weights.ndim != 4 or v.ndim != 4: return weights @ v
  # (batch, heads, L, E) computed in memory as (batch, L, heads, E), returned as a permuted view:
  # the usual next step, out.transpose(1, 2).reshape(batch, L, heads * E), is then free instead of a
  # strided read of every head inside the output projection's matmul
  batch, heads, length, source = weights.shape
  rows = weights.permute(0, 2, 1, 3).reshape(batch, length, heads, source, 1)
  values = v.expand(batch, heads, source, v.shape[-1]).reshape(batch, 1, heads, source, v.shape[-1])
  return (rows * values).sum(3).permute(0, 2, 1, 3)


# ---- PyTorch's functional names (torch.nn.functional) for the Tensor methods ----
def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
  """PyTorch's linear: x @ weight.T + bias, weight (out_features, in_features) (Tensor.linear is tinygrad's (in, out))."""
  out = x.matmul(weight.T if weight.ndim > 1 else weight)   # a 1-d weight is a dot product, as torch's
  return out + bias if bias is not None else out


def dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
  """PyTorch's F.dropout: drops unless training=False (pass self.training from a module's forward)."""
  return x.dropout(p, training)


def relu(x: Tensor) -> Tensor: return x.relu()
def gelu(x: Tensor, approximate: str = "none") -> Tensor: return x.gelu(approximate)
def silu(x: Tensor) -> Tensor: return x.silu()
def softmax(x: Tensor, dim: int = -1, dtype=None) -> Tensor: return x.softmax(dim, dtype)
def log_softmax(x: Tensor, dim: int = -1, dtype=None) -> Tensor: return x.log_softmax(dim, dtype)
def one_hot(x: Tensor, num_classes: int = -1) -> Tensor: return x.one_hot(num_classes)
def pad(x: Tensor, pad, mode: str = "constant", value: float = 0.0) -> Tensor: return x.pad(pad, mode, value)


def layer_norm(x: Tensor, normalized_shape, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
  n = 1 if isinstance(normalized_shape, int) else len(normalized_shape)
  out = x.layernorm(tuple(range(-n, 0)), eps)
  if weight is not None: out = out * weight
  return out + bias if bias is not None else out


def embedding(idx: Tensor, weight: Tensor) -> Tensor:
  if idx.dtype.is_float: raise TypeError(f"embedding: indices must be integers, got {idx.dtype}")
  return weight[idx]


def pixel_shuffle(x: Tensor, upscale_factor: int) -> Tensor:
  """(..., C*r*r, H, W) -> (..., C, H*r, W*r), PyTorch's channel order."""
  r = upscale_factor
  if not isinstance(r, int) or r <= 0: raise ValueError(f"pixel_shuffle: upscale_factor must be a positive int, got {r!r}")
  if x.ndim < 3 or x.shape[-3] % (r * r):
    raise ValueError(f"pixel_shuffle: input {_shape_str(x.shape)} needs a channel dim (-3) divisible by {r * r}")
  *lead, c, h, w = x.shape
  x = x.reshape(*lead, c // (r * r), r, r, h, w)
  n = len(lead)
  x = x.permute(*range(n), n, n + 3, n + 1, n + 4, n + 2)
  return x.reshape(*lead, c // (r * r), h * r, w * r)


def _resize_matrix(size_in: int, size_out: int, mode: str, align_corners: bool | None, scale: float | None) -> np.ndarray:
  """(size_in, size_out) weights: output j is sum_i x[i] * m[i, j], PyTorch's source-index rules. `scale` is
  the user's scale_factor, which PyTorch uses (rather than size_in / size_out) when it was given."""
  m = np.zeros((size_in, size_out), dtype=np.float64)
  ratio = 1 / scale if scale else size_in / size_out
  j = np.arange(size_out)
  if mode == "nearest":
    m[np.minimum(np.floor(j * ratio).astype(np.int64), size_in - 1), j] = 1
    return m
  if align_corners: src = j * ((size_in - 1) / (size_out - 1) if size_out > 1 else 0.0)
  else: src = np.maximum((j + 0.5) * ratio - 0.5, 0)
  lo = np.minimum(np.floor(src).astype(np.int64), size_in - 1)
  hi = np.minimum(lo + 1, size_in - 1)
  frac = src - lo
  np.add.at(m, (lo, j), 1 - frac)
  np.add.at(m, (hi, j), frac)
  return m


def interpolate(x: Tensor, size=None, scale_factor=None, mode: str = "nearest", align_corners: bool | None = None) -> Tensor:
  """Resize the spatial dims (all dims after N, C): nearest, or linear / bilinear with align_corners either way.
  Each dim is a matmul with a fixed weight matrix, so the gradient is the transposed matmul."""
  n = x.ndim - 2
  if n < 1: raise ValueError(f"interpolate: input {_shape_str(x.shape)} needs (N, C, *spatial) dims")
  if mode not in ("nearest", "linear", "bilinear"): raise NotImplementedError(f"interpolate: mode {mode!r} is not supported")
  if mode == "nearest" and align_corners is not None: raise ValueError("interpolate: align_corners only goes with linear modes")
  if (size is None) == (scale_factor is None): raise ValueError("interpolate: give exactly one of size and scale_factor")
  spatial = x.shape[2:]
  scales = (None,) * n if scale_factor is None else _float_tuple(scale_factor, n)
  sizes = _tuple(size, n, "size", "interpolate", positive=True) if size is not None else \
    tuple(int(math.floor(s * f)) for s, f in zip(spatial, scales))
  if any(s <= 0 for s in sizes) or any(s <= 0 for s in spatial):
    raise ValueError(f"interpolate: input {_shape_str(x.shape)} to size {sizes}: every size must be positive")
  out = x._float()
  for d, (size_in, size_out, scale) in enumerate(zip(spatial, sizes, scales)):
    m = Tensor(_resize_matrix(size_in, size_out, mode, align_corners, scale).astype(out.dtype.np), device=x.device, requires_grad=False)
    axis = 2 + d
    out = out.transpose(axis, -1).matmul(m).transpose(axis, -1)
  return out


def _float_tuple(value, n: int) -> tuple[float, ...]:
  out = (float(value),) * n if isinstance(value, (int, float)) else tuple(float(v) for v in value)
  if len(out) != n or any(v <= 0 for v in out): raise ValueError(f"interpolate: scale_factor must be {n} positive numbers, got {value}")
  return out


def adaptive_avg_pool2d(x: Tensor, output_size) -> Tensor:
  """Output cell j of a dim of size i averages inputs floor(j*i/o) .. ceil((j+1)*i/o) - 1 (PyTorch's windows),
  a matmul with a fixed averaging matrix per dim. None in output_size keeps that dim."""
  if x.ndim not in (3, 4): raise ValueError(f"adaptive_avg_pool2d: expected a 3-d or 4-d input, got {_shape_str(x.shape)}")
  sizes = (output_size,) * 2 if isinstance(output_size, int) or output_size is None else tuple(output_size)
  if len(sizes) != 2: raise ValueError(f"adaptive_avg_pool2d: output_size must be an int or 2 ints, got {output_size}")
  out = x._float()
  for axis, size_out in zip((-2, -1), sizes):
    size_in = x.shape[axis]
    size_out = size_in if size_out is None else size_out
    if size_out <= 0 or size_in <= 0: raise ValueError(f"adaptive_avg_pool2d: input {_shape_str(x.shape)} to output_size {output_size}")
    m = np.zeros((size_in, size_out), dtype=np.float64)
    for j in range(size_out):
      lo, hi = (j * size_in) // size_out, -((-(j + 1) * size_in) // size_out)
      m[lo:hi, j] = 1 / (hi - lo)
    out = out.transpose(axis, -1).matmul(Tensor(m.astype(out.dtype.np), device=x.device, requires_grad=False)).transpose(axis, -1)
  return out
