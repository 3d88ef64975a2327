"""Neural-network functions built from Tensor ops: convolutions, pooling (ceil_mode, indices, adaptive), im2col, einsum,
losses (PyTorch's and tinygrad's names), normalisations, resizing, attention, and PyTorch's functional activation names.

in: Tensors (PyTorch's layouts: NCHW activations, (out, in/groups, kh, kw) conv weights)
out: Tensors. Arguments are checked here, at the user's call; a convolution and a transposed one are
each one autograd node (function.py's Conv and ConvTranspose, with the window sums they compute and
their backward), and pooling reduces over function.py's `pool_windows` views.
"""
from __future__ import annotations
import math
import numpy as np
from tinychad import function as F
from tinychad.dtype import dtypes, promote_types
from tinychad.function import ConvGeometry, pool_windows
from tinychad.indexing import out_of_bounds
from tinychad.tensor import Tensor, _broadcast_shape, _shape_str


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


def _padding_pairs(padding, kernel, dilation, n: int, op: str) -> tuple[tuple[int, int], ...]:
  if padding == "valid": return ((0, 0),) * n
  if padding == "same":
    total = [d * (k - 1) for k, d in zip(kernel, dilation)]
    return tuple((t // 2, t - t // 2) for t in total)
  if isinstance(padding, (tuple, list)) and padding and isinstance(padding[0], (tuple, list)): return tuple(tuple(p) for p in padding)
  return tuple((p, p) for p in _tuple(padding, n, "padding", op))


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
  out = F.Conv.apply(x, weight, geo=ConvGeometry(stride, pads, dilation, groups))
  if bias is not None: out = out + bias.reshape((1, -1) + (1,) * n)
  return out.squeeze(0) if unbatched else out


def conv_transpose(x: Tensor, weight: Tensor, bias: Tensor | None, stride, padding, output_padding, groups: int, dilation, n: int) -> Tensor:
  """The gradient of a convolution (F.ConvTranspose): PyTorch's conv_transpose{n}d."""
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
  sizes = tuple((size - 1) * s - 2 * p + d * (k - 1) + extra + 1
                for size, s, p, d, k, extra in zip(x.shape[2:], stride, padding, dilation, kernel, output_padding))
  if any(size <= 0 for size in sizes):
    raise ValueError(f"{op}: input {_shape_str(x.shape)} with kernel {_shape_str(kernel)}, stride {stride}, padding {padding}, "
                     f"dilation {dilation} and output_padding {output_padding} gives output size {sizes}")
  if x.dtype != weight.dtype:
    common = promote_types(x.dtype, weight.dtype)
    x, weight = x.cast(common), weight.cast(common)
  # the convolution this one transposes: from our output's shape to x's
  geo = ConvGeometry(stride, tuple((p, p) for p in padding), dilation, groups)
  out = F.ConvTranspose.apply(x, weight, geo=geo, out_shape=(x.shape[0], out_group * groups) + sizes)
  return out if bias is None else out + bias.reshape((1, -1) + (1,) * n)


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


def _pool_arguments(x: Tensor, kernel_size, stride, padding, dilation, n: int, op: str, ceil_mode: bool = False):
  """A pooling's arguments checked against x and spelled out: kernel, stride and dilation as n-tuples
  (stride defaults to the kernel, as in PyTorch), and (before, after) pad pairs for every dim of x. ceil_mode
  (PyTorch's) adds the padding after each dim that makes room for one more, partial, window where the input
  leaves one: `extra`, per spatial dim, is that padding alone (pooling must not count it as input)."""
  if x.ndim < n + 1: raise ValueError(f"{op}: input of shape {_shape_str(x.shape)} needs at least {n + 1} dims")
  kernel = _tuple(kernel_size, n, "kernel_size", op, positive=True)
  stride = kernel if stride is None else _tuple(stride, n, "stride", op, positive=True)
  dilation = _tuple(dilation, n, "dilation", op, positive=True)
  pads = _padding_pairs(padding, kernel, dilation, n, op)
  _check_pool_padding(pads, kernel, dilation, op)
  _check_windows(x.shape, pads, kernel, dilation, op)
  extra = [0] * n
  if ceil_mode:
    for i, (size, (before, after), k, s, d) in enumerate(zip(x.shape[-n:], pads, kernel, stride, dilation)):
      span = size + before + after - d * (k - 1) - 1
      outs = -(-span // s) + 1
      # PyTorch's rule: the last window must start inside the input or the padding before it
      if (outs - 1) * s >= size + before: outs -= 1
      extra[i] = max(0, (outs - 1) * s + d * (k - 1) + 1 - (size + before + after))
    pads = tuple((before, after + e) for (before, after), e in zip(pads, extra))
  return kernel, stride, dilation, ((0, 0),) * (x.ndim - n) + pads, extra


def max_pool(x: Tensor, kernel_size, stride, padding, dilation, n: int, ceil_mode: bool = False, return_indices: bool = False):
  """The max of each window; return_indices also gives, as PyTorch does, the flat index (into each input's spatial
  dims) of the first element holding each maximum."""
  op = f"max_pool{n}d"
  kernel, stride, dilation, pads, _ = _pool_arguments(x, kernel_size, stride, padding, dilation, n, op, ceil_mode)
  fill = -math.inf if x.dtype.is_float else int(-2 ** (8 * x.dtype.itemsize - 1))
  if kernel != stride or any(d != 1 for d in dilation):
    # overlapping windows: one autograd node, whose gradient is no scatter of the windows (function.MaxPool)
    out = F.MaxPool.apply(x, kernel=kernel, stride=stride, dilation=dilation, pads=pads[-n:], fill=fill)
  else: out = _pool(x.pad(pads, value=fill), kernel, stride, dilation, Tensor.max)
  if not return_indices: return out
  spatial = x.shape[-n:]
  windows = pool_windows(x.pad(pads, value=fill), kernel, stride, dilation)
  windows = windows.reshape(windows.shape[:-n] + (-1,))
  flat = Tensor.arange(math.prod(spatial), device=x.device).reshape(spatial).pad(pads[-n:], value=-1)
  flat = pool_windows(flat, kernel, stride, dilation)
  flat = flat.reshape(flat.shape[:-n] + (-1,))
  first = windows.detach().argmax(-1, keepdim=True)
  indices = flat.reshape((1,) * (windows.ndim - flat.ndim) + flat.shape).expand(windows.shape).gather(-1, first).squeeze(-1)
  return out, indices


def avg_pool(x: Tensor, kernel_size, stride, padding, count_include_pad: bool, n: int, ceil_mode: bool = False) -> Tensor:
  """The mean of each window. Its divisor counts the padding (count_include_pad) or not, never ceil_mode's extra."""
  kernel, stride, dilation, pads, extra = _pool_arguments(x, kernel_size, stride, padding, 1, n, f"avg_pool{n}d", ceil_mode)
  total = _pool(x.pad(pads), kernel, stride, dilation, Tensor.sum)
  if count_include_pad and not any(extra): return total / math.prod(kernel)
  counted = Tensor.ones(x.shape[-n:], device=x.device)
  if count_include_pad: counted = counted.pad(tuple((b, a - e) for (b, a), e in zip(pads[-n:], extra)), value=1.0)
  inner = tuple((0, e) for e in extra) if count_include_pad else pads[-n:]
  counts = _pool(counted.pad(inner), kernel, stride, dilation, Tensor.sum)
  return total / counts


def max_pool1d(x: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False, return_indices: bool = False):
  return max_pool(x, kernel_size, stride, padding, dilation, 1, ceil_mode, return_indices)
def max_pool2d(x: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False, return_indices: bool = False):
  return max_pool(x, kernel_size, stride, padding, dilation, 2, ceil_mode, return_indices)
def avg_pool1d(x: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
  return avg_pool(x, kernel_size, stride, padding, count_include_pad, 1, ceil_mode)
def avg_pool2d(x: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
  return avg_pool(x, kernel_size, stride, padding, count_include_pad, 2, ceil_mode)


def unfold(x: Tensor, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
  """PyTorch's F.unfold (im2col): (N, C, H, W) -> (N, C * kh * kw, L), each column one window, L windows."""
  if x.ndim not in (3, 4): raise ValueError(f"unfold: expected a 3-d or 4-d input, got shape {_shape_str(x.shape)} ({x.dtype})")
  if x.ndim == 3: return unfold(x.unsqueeze(0), kernel_size, dilation, padding, stride).squeeze(0)
  kernel = _tuple(kernel_size, 2, "kernel_size", "unfold", positive=True)
  dilation, stride = _tuple(dilation, 2, "dilation", "unfold", positive=True), _tuple(stride, 2, "stride", "unfold", positive=True)
  pads = tuple((p, p) for p in _tuple(padding, 2, "padding", "unfold"))
  _check_windows(x.shape, pads, kernel, dilation, "unfold")
  windows = pool_windows(x.pad(((0, 0), (0, 0)) + pads), kernel, stride, dilation)   # (N, C, oh, ow, kh, kw)
  n, c, oh, ow = windows.shape[:4]
  return windows.permute(0, 1, 4, 5, 2, 3).reshape(n, c * kernel[0] * kernel[1], oh * ow)


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


def _class_mask(target: Tensor, classes: int, ndim: int, ignore_index: int) -> Tensor:
  """One-hot of class indices along dim 1: (N, *rest) -> (N, C, *rest) bool. The target's values are checked already
  (each a class or ignore_index): where those fit int32, the comparison runs in int32, whose SIMD lanes are twice
  as many as int64's, over the (N, C) mask that a language model's loss computes forward and backward."""
  arange = Tensor.arange(classes, device=target.device, dtype=dtypes.int32).reshape((1, classes) + (1,) * (ndim - 2))
  if target.dtype.itemsize > 4 and -2**31 <= ignore_index < 2**31: target = target.cast(dtypes.int32)
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
  if (bad := out_of_bounds(target, classes, ignore=ignore_index)) is not None:
    raise IndexError(f"nll_loss: target {bad} is out of bounds for {classes} classes")
  mask = _class_mask(target, classes, logp.ndim, ignore_index)
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


def sparse_categorical_crossentropy(x: Tensor, Y: Tensor, ignore_index: int = -1, label_smoothing: float = 0.0,
                                    reduction: str = "mean") -> Tensor:
  """tinygrad's name and arguments: the classes on the last dim of x, Y one class index per row; the labels equal to
  ignore_index (any int, -1 too) add nothing and are not counted by the mean. cross_entropy with PyTorch's layout."""
  if not isinstance(Y, Tensor): Y = Tensor(Y)
  if x.ndim == 0: raise ValueError(f"sparse_categorical_crossentropy: input needs a class dim, got shape {_shape_str(x.shape)}")
  if Y.shape != x.shape[:-1]:
    raise ValueError(f"sparse_categorical_crossentropy: labels of shape {_shape_str(Y.shape)} for input {_shape_str(x.shape)} "
                     f"(expected {_shape_str(x.shape[:-1])})")
  logits = x if x.ndim <= 2 else x.movedim(-1, 1)
  return cross_entropy(logits, Y, reduction, label_smoothing, ignore_index)


def l1_loss(x: Tensor, target: Tensor, reduction: str = "mean") -> Tensor: return _reduce((x - target).abs(), reduction, "l1_loss")


def smooth_l1_loss(x: Tensor, target: Tensor, reduction: str = "mean", beta: float = 1.0) -> Tensor:
  diff = (x - target).abs()
  if beta == 0: return _reduce(diff, reduction, "smooth_l1_loss")
  return _reduce((diff < beta).where(0.5 * diff.square() / beta, diff - 0.5 * beta), reduction, "smooth_l1_loss")


def huber_loss(x: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0) -> Tensor:
  diff = (x - target).abs()
  return _reduce((diff < delta).where(0.5 * diff.square(), delta * (diff - 0.5 * delta)), reduction, "huber_loss")


def kl_div(x: Tensor, target: Tensor, reduction: str = "mean", log_target: bool = False) -> Tensor:
  """PyTorch's: x holds log-probabilities; target probabilities (log-probabilities with log_target)."""
  if log_target: loss = target.exp() * (target - x)
  else: loss = (target > 0).where(target * (target.maximum(1e-45).log() - x), 0)
  if reduction == "batchmean": return loss.sum() / (x.shape[0] if x.ndim else 1)
  return _reduce(loss, reduction, "kl_div")


def mse_loss(x: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
  """Input and target broadcast against each other, as in PyTorch."""
  return _reduce((x - target).square(), reduction, "mse_loss")


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
                                 window: int | None = None) -> Tensor:
  """softmax(q k^T * scale + mask) v, as PyTorch's, on (..., heads, L, D) queries and (..., kv heads, S, D) keys and
  (..., kv heads, S, E) values (2-d and 3-d inputs too). attn_mask is bool (True = may attend) or float (added to the
  scaled scores), broadcast to (..., heads, L, S); is_causal lets query i see keys j <= i (PyTorch's top-left
  alignment when L != S), and can be combined with a mask. enable_gqa: each of the kv heads serves heads // kv heads
  consecutive query heads (PyTorch's grouped-query attention); one kv head serves all without it. window=w (tinychad's):
  query i sees keys j with i - w < j <= i (a sliding window; it implies is_causal's j <= i). A query that sees no key
  gets zeros, as in PyTorch. Computed flash-style (function.py's Attention): the forward and backward passes never
  store the L x S scores, except as the gradient of a float mask that requires one. dropout_p > 0 (weights dropped at
  random) takes the materialized path of `attention`."""
  if dropout_p > 0: return attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, window)[0]
  q4, k4, v4, mask4, out_shape, scale = _attention_inputs(q, k, v, attn_mask, scale, enable_gqa, window)
  dtype = q4.dtype
  if dtype not in (dtypes.float32, dtypes.float64):
    # float16 and bfloat16 compute in float32 (the kernels sum in the inputs' dtype) and round once at the end
    q4, k4, v4 = q4.float(), k4.float(), v4.float()
    if mask4 is not None and mask4.dtype != dtypes.bool: mask4 = mask4.float()
  out = F.Attention.apply(q4, k4, v4, *(() if mask4 is None else (mask4,)), scale=scale, causal=bool(is_causal),
                          window=window or 0)
  return out.cast(dtype).reshape(out_shape)


def _attention_inputs(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float | None, enable_gqa: bool,
                      window: int | None):
  """The checked inputs of an attention as (batch, heads, L, D) q, (batch, kv heads, S, D) k and (..., E) v, the mask
  as (1 or batch, heads or 1, L or 1, S or 1), the output's shape, and the scale."""
  op = "scaled_dot_product_attention"
  # the shapes in an error message, put in words only when one is raised (this runs for every decoded token)
  given = q.shape, k.shape, v.shape
  def shapes() -> str: return ", ".join(f"{name} {_shape_str(shape)}" for name, shape in zip("qkv", given))
  if not (q.ndim == k.ndim == v.ndim and q.ndim >= 2):
    raise ValueError(f"{op}: q, k and v need the same number of dims (at least 2), got {shapes()}")
  if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
    raise ValueError(f"{op}: q and k need one last dim and k and v one length, got {shapes()}")
  if not (q.dtype == k.dtype == v.dtype) or not q.dtype.is_float:
    raise TypeError(f"{op}: q, k and v need one float dtype, got {q.dtype.name}, {k.dtype.name}, {v.dtype.name}")
  if window is not None and (not isinstance(window, int) or window < 1):
    raise ValueError(f"{op}: window must be a positive int (keys i - window < j <= i), got {window!r}")
  flat = q.ndim == 2
  if flat: q, k, v = q.reshape(1, *q.shape), k.reshape(1, *k.shape), v.reshape(1, *v.shape)
  heads, kv_heads = q.shape[-3], k.shape[-3]
  if v.shape[-3] != kv_heads or (heads != kv_heads and kv_heads != 1 and not (enable_gqa and heads % kv_heads == 0)):
    need = "a divisor of q's heads (enable_gqa=True)" if enable_gqa else "q's heads, or 1 (or pass enable_gqa=True)"
    raise ValueError(f"{op}: k and v's heads (dim -3) must be {need}, got {shapes()}")
  try:
    batch = _broadcast_shape(_broadcast_shape(q.shape[:-3], k.shape[:-3], op), v.shape[:-3], op)
  except ValueError:
    raise ValueError(f"{op}: the batch dims of {shapes()} don't broadcast") from None
  size = math.prod(batch)
  L, S, D, E = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
  q4 = q.expand(*batch, *q.shape[-3:]).reshape(size, heads, L, D)
  k4 = k.expand(*batch, *k.shape[-3:]).reshape(size, kv_heads, S, D)
  v4 = v.expand(*batch, *v.shape[-3:]).reshape(size, kv_heads, S, E)
  mask4 = None
  if mask is not None:
    if mask.dtype != dtypes.bool and not mask.dtype.is_float:
      raise TypeError(f"{op}: attn_mask must be bool or float, got {mask.dtype.name}")
    full = batch + (heads, L, S)
    if mask.ndim > len(full) or any(m not in (1, n) for m, n in zip(reversed(mask.shape), reversed(full))):
      raise ValueError(f"{op}: attn_mask {_shape_str(mask.shape)} doesn't broadcast to {_shape_str(full)} ({shapes()})")
    aligned = (1,) * (len(full) - mask.ndim) + tuple(mask.shape)
    mask4 = mask.reshape(aligned)
    if any(n != 1 for n in aligned[:-3]): mask4 = mask4.expand(*batch, *aligned[-3:]).reshape(size, *aligned[-3:])
    else: mask4 = mask4.reshape(1, *aligned[-3:])
    if mask4.dtype != dtypes.bool and mask4.dtype != q.dtype: mask4 = mask4.cast(q.dtype)
  out_shape = (L, E) if flat else batch + (heads, L, E)
  return q4, k4, v4, mask4, out_shape, 1 / math.sqrt(D) if scale is None else scale


def attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
              is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
              window: int | None = None) -> tuple[Tensor, Tensor]:
  """scaled_dot_product_attention's output and the attention weights (batch, heads, L, S) it used (after dropout, as
  MultiheadAttention returns them), computed with the whole score matrix: the path for a caller that asks for the
  weights, and for dropout. Both are lazy: a caller that drops the weights computes nothing more."""
  q4, k4, v4, mask4, out_shape, scale = _attention_inputs(q, k, v, attn_mask, scale, enable_gqa, window)
  (batch, heads, length, _), (kv_heads, source) = q4.shape, k4.shape[1:3]
  if kv_heads != heads:
    group = heads // kv_heads
    k4, v4 = (x.reshape(batch, kv_heads, 1, source, x.shape[-1]).expand(batch, kv_heads, group, source, x.shape[-1])
              .reshape(batch, heads, source, x.shape[-1]) for x in (k4, v4))
  # keys as (..., dim, source), contiguous along source: the score matmul then runs SIMD lanes along
  # its output; read through the transposed view, its only contiguous axis is the reduce
  scores = (q4 @ k4.transpose(-1, -2).contiguous()) * scale
  if is_causal or window:
    i, j = Tensor.arange(length, device=q.device).reshape(length, 1), Tensor.arange(source, device=q.device).reshape(1, source)
    visible = j <= i
    if window: visible = visible & (j > i - window)
    scores = visible.where(scores, -math.inf)
  if mask4 is not None:
    scores = mask4.where(scores, -math.inf) if mask4.dtype == dtypes.bool else scores + mask4
  # the softmax, written out so its row maximum also tells which queries see no key: those get zero
  # weights (PyTorch's math backend), not the 0/0 of a softmax over -inf
  top = scores.max(-1, keepdim=True).detach()
  shifted = (scores - top).exp()
  weights = (top == -math.inf).where(0.0, shifted * shifted.sum(-1, keepdim=True).reciprocal())
  # as PyTorch's: dropout_p is applied whenever it is above 0 (callers pass 0 in eval mode)
  if dropout_p > 0: weights = weights.dropout(dropout_p, training=True)
  weights_shape = out_shape[:-1] + (source,)
  # (batch, heads, L, E) computed in memory as (batch, L, heads, E), returned as a permuted view:
  # the usual next step, out.transpose(1, 2).reshape(batch, L, heads * E), is then free instead of a
  # strided read of every head inside the output projection's matmul
  rows = weights.permute(0, 2, 1, 3).reshape(batch, length, heads, source, 1)
  values = v4.reshape(batch, 1, heads, source, v4.shape[-1])
  out = (rows * values).sum(3).permute(0, 2, 1, 3)
  return out.reshape(out_shape), weights.reshape(weights_shape)


# ---- PyTorch's functional names (torch.nn.functional) for the Tensor methods ----
def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
  """PyTorch's linear: x @ weight.T + bias, weight (out_features, in_features) (Tensor.linear is tinygrad's (in, out))."""
  dtype, device = x.dtype, x.device
  if weight.ndim == 2 and x.ndim >= 1 and x.shape[-1] == weight.shape[1] and dtype != dtypes.bool and \
     weight.dtype == dtype and weight.device == device:
    if bias is None: return F.Linear.apply(x, weight)
    if bias.dtype == dtype and bias.device == device and bias.shape == weight.shape[:1]: return F.Linear.apply(x, weight, bias)
  # the rest (a 1-d weight, a dot product as torch's; mixed dtypes; bad shapes) as the ops it is made of
  out = x.matmul(weight.T if weight.ndim > 1 else weight)
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
def sigmoid(x: Tensor) -> Tensor: return x.sigmoid()
def tanh(x: Tensor) -> Tensor: return x.tanh()
def relu6(x: Tensor) -> Tensor: return x.relu6()
def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor: return x.leaky_relu(negative_slope)
def elu(x: Tensor, alpha: float = 1.0) -> Tensor: return x.elu(alpha)
def selu(x: Tensor) -> Tensor: return x.selu()
def celu(x: Tensor, alpha: float = 1.0) -> Tensor: return x.celu(alpha)
def softplus(x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor: return x.softplus(beta, threshold)
def mish(x: Tensor) -> Tensor: return x.mish()
def hardswish(x: Tensor) -> Tensor: return x.hardswish()
def hardsigmoid(x: Tensor) -> Tensor: return x.hardsigmoid()
def hardtanh(x: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor: return x.hardtanh(min_val, max_val)
def logsigmoid(x: Tensor) -> Tensor: return x.logsigmoid()
def softsign(x: Tensor) -> Tensor: return x.softsign()
def tanhshrink(x: Tensor) -> Tensor: return x - x.tanh()
def softmin(x: Tensor, dim: int = -1, dtype=None) -> Tensor: return (-x).softmax(dim, dtype)
def glu(x: Tensor, dim: int = -1) -> Tensor:
  """The first half of dim gated by the sigmoid of the second."""
  a, b = x.chunk(2, dim)
  if a.shape != b.shape: raise ValueError(f"glu: dim {dim} of shape {_shape_str(x.shape)} must have an even size")
  return a * b.sigmoid()
def normalize(x: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
  """x divided by its p-norm along dim (at least eps)."""
  return x / x.norm(p, dim, keepdim=True).maximum(eps)
def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
  """PyTorch's: sum(x1 * x2) / sqrt(max(|x1|^2 |x2|^2, eps^2)) along dim."""
  dot = (x1 * x2).sum(dim)
  return dot / (x1.square().sum(dim) * x2.square().sum(dim)).maximum(eps * eps).sqrt()


def layer_norm(x: Tensor, normalized_shape, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
  """Normalise over the trailing normalized_shape, then times weight and plus bias: one autograd op
  (function.LayerNorm), computed in the dtype all three promote to."""
  shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
  if x.shape[x.ndim - len(shape):] != shape or len(shape) > x.ndim:
    raise ValueError(f"layer_norm: normalized_shape {shape} doesn't match the last dims of input {_shape_str(x.shape)} ({x.dtype})")
  params = [p for p in (weight, bias) if p is not None]
  for p in params:
    if p.shape != shape or p.device != x.device:
      raise ValueError(f"layer_norm: weight and bias must be of shape {shape} on {x.device}, got {_shape_str(p.shape)} "
                       f"({p.dtype}) on {p.device} for input {_shape_str(x.shape)} ({x.dtype})")
  x = x._float()
  dtype = promote_types(x.dtype, *(p.dtype for p in params))
  axes = tuple(range(x.ndim - len(shape), x.ndim))
  return F.LayerNorm.apply(x.cast(dtype), *(p.cast(dtype) for p in params), axes=axes, eps=eps,
                           affine=(weight is not None, bias is not None))


def embedding(idx: Tensor, weight: Tensor) -> Tensor:
  """The rows of weight (num_embeddings, embedding_dim) at integer indices of any shape: (*idx.shape, embedding_dim).
  As in PyTorch an index outside [0, num_embeddings) raises, negative ones too (tensor indexing would wrap those).
  One Gather, without indexing's general machinery: a decoding step looks up two embeddings per token."""
  if not idx.dtype.is_int: raise TypeError(f"embedding: indices must be integers, got {idx.dtype}")
  if weight.ndim != 2:
    raise ValueError(f"embedding: weight must be 2-d (num_embeddings, embedding_dim), got shape {_shape_str(weight.shape)}")
  if (bad := out_of_bounds(idx, weight.shape[0])) is not None:
    raise IndexError(f"embedding: index {bad} is out of range for {weight.shape[0]} embeddings (weight {_shape_str(weight.shape)})")
  return F.Gather.apply(weight, idx.cast(dtypes.int64))


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
  if mode in ("nearest", "nearest-exact"):
    # nearest-exact reads the source pixel whose centre is nearest, nearest (the old rule) its left edge
    src = (j + 0.5) * ratio if mode == "nearest-exact" else j * ratio
    m[np.minimum(np.floor(src).astype(np.int64), size_in - 1), j] = 1
    return m
  if mode == "area":   # adaptive average pooling: output j averages inputs [floor(j in/out), ceil((j+1) in/out))
    for k in range(size_out):
      start, end = (k * size_in) // size_out, -(-((k + 1) * size_in) // size_out)
      m[start:end, k] = 1 / (end - start)
    return m
  if align_corners: src = j * ((size_in - 1) / (size_out - 1) if size_out > 1 else 0.0)
  else: src = (j + 0.5) * ratio - 0.5
  if mode == "bicubic":
    # Keys' cubic convolution with PyTorch's A = -0.75 over 4 taps, the taps clamped to the border
    a, base = -0.75, np.floor(src)
    t = src - base
    weights = [((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a, ((a + 2) * t - (a + 3)) * t * t + 1,
               ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1, ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a]
    for k, w in enumerate(weights): np.add.at(m, (np.clip(base.astype(np.int64) - 1 + k, 0, size_in - 1), j), w)
    return m
  src = np.maximum(src, 0)
  lo = np.minimum(np.floor(src).astype(np.int64), size_in - 1)
  hi = np.minimum(lo + 1, size_in - 1)
  frac = src - lo
  np.add.at(m, (lo, j), 1 - frac)
  np.add.at(m, (hi, j), frac)
  return m


RESIZE_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "trilinear", "bicubic", "area")


def interpolate(x: Tensor, size=None, scale_factor=None, mode: str = "nearest", align_corners: bool | None = None) -> Tensor:
  """Resize the spatial dims (all dims after N, C): nearest, nearest-exact, area (adaptive average), or linear /
  bilinear / trilinear / bicubic with align_corners either way (linear modes interpolate every spatial dim).
  Each dim is a matmul with a fixed weight matrix, so the gradient is the transposed matmul."""
  n = x.ndim - 2
  if n < 1: raise ValueError(f"interpolate: input {_shape_str(x.shape)} needs (N, C, *spatial) dims")
  if mode not in RESIZE_MODES: raise ValueError(f"interpolate: mode must be one of {RESIZE_MODES}, got {mode!r}")
  if mode in ("nearest", "nearest-exact", "area") and align_corners is not None:
    raise ValueError("interpolate: align_corners only goes with the linear and cubic modes")
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


def adaptive_avg_pool1d(x: Tensor, output_size: int) -> Tensor:
  if x.ndim not in (2, 3): raise ValueError(f"adaptive_avg_pool1d: expected a 2-d or 3-d input, got {_shape_str(x.shape)}")
  return adaptive_avg_pool2d(x.unsqueeze(-2), (1, output_size)).squeeze(-2)


def adaptive_max_pool2d(x: Tensor, output_size) -> Tensor:
  """The max over PyTorch's adaptive windows (as adaptive_avg_pool2d's), dim by dim: a max is separable. Each dim
  compares every input with every output cell's window (in x out terms)."""
  if x.ndim not in (3, 4): raise ValueError(f"adaptive_max_pool2d: expected a 3-d or 4-d input, got {_shape_str(x.shape)}")
  sizes = (output_size,) * 2 if isinstance(output_size, int) or output_size is None else tuple(output_size)
  if len(sizes) != 2: raise ValueError(f"adaptive_max_pool2d: output_size must be an int or 2 ints, got {output_size}")
  fill = -math.inf if x.dtype.is_float else int(np.iinfo(x.dtype.np).min)
  out = x
  for axis, size_out in zip((-2, -1), sizes):
    size_in = x.shape[axis]
    size_out = size_in if size_out is None else size_out
    if size_out <= 0 or size_in <= 0: raise ValueError(f"adaptive_max_pool2d: input {_shape_str(x.shape)} to output_size {output_size}")
    inside = np.zeros((size_in, size_out), dtype=bool)
    for j in range(size_out): inside[(j * size_in) // size_out:-((-(j + 1) * size_in) // size_out), j] = True
    moved = out.transpose(axis, -1).unsqueeze(-1)   # (..., size_in, 1)
    out = Tensor(inside, device=x.device).where(moved, fill).cast(x.dtype).max(-2).transpose(axis, -1)
  return out


def pixel_unshuffle(x: Tensor, downscale_factor: int) -> Tensor:
  """(..., C, H*r, W*r) -> (..., C*r*r, H, W): pixel_shuffle undone."""
  r = downscale_factor
  if not isinstance(r, int) or r <= 0: raise ValueError(f"pixel_unshuffle: downscale_factor must be a positive int, got {r!r}")
  if x.ndim < 3 or x.shape[-1] % r or x.shape[-2] % r:
    raise ValueError(f"pixel_unshuffle: input {_shape_str(x.shape)} needs H and W divisible by {r}")
  *lead, c, h, w = x.shape
  n = len(lead)
  x = x.reshape(*lead, c, h // r, r, w // r, r).permute(*range(n), n, n + 2, n + 4, n + 1, n + 3)
  return x.reshape(*lead, c * r * r, h // r, w // r)


def _channel_shape(x: Tensor) -> tuple[int, ...]: return (1, -1) + (1,) * (x.ndim - 2)


def group_norm(x: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
  if x.ndim < 2 or num_groups <= 0 or x.shape[1] % num_groups:
    raise ValueError(f"group_norm: input {_shape_str(x.shape)} needs a channel dim (1) divisible by num_groups {num_groups}")
  out = x.reshape(x.shape[0], num_groups, -1).layernorm(-1, eps).reshape(x.shape)
  if weight is not None: out = out * weight.reshape(_channel_shape(x))
  return out + bias.reshape(_channel_shape(x)) if bias is not None else out


def rms_norm(x: Tensor, normalized_shape, weight: Tensor | None = None, eps: float | None = None) -> Tensor:
  """x / sqrt(mean(x^2) + eps) over the last dims; eps=None is the dtype's machine epsilon, as PyTorch's."""
  shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
  if len(shape) > x.ndim or x.shape[x.ndim - len(shape):] != shape:
    raise ValueError(f"rms_norm: normalized_shape {shape} doesn't match the last dims of input {_shape_str(x.shape)}")
  eps = float(np.finfo(x.dtype.np).eps) if eps is None else eps
  out = x * (x.square().mean(tuple(range(-len(shape), 0)), keepdim=True) + eps).rsqrt()
  return out * weight if weight is not None else out


def batch_norm(x: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None = None,
               bias: Tensor | None = None, training: bool = False, momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
  """PyTorch's F.batch_norm over dim 1: batch statistics when training (the running ones, if given, move toward
  them by `momentum`, the variance unbiased, as PyTorch's), else the running statistics."""
  if x.ndim < 2: raise ValueError(f"batch_norm: expected an input of at least 2 dims, got {_shape_str(x.shape)}")
  axes = tuple(d for d in range(x.ndim) if d != 1)
  if training:
    mean, var = x.mean(axes), x.var(axes, correction=0)
    if running_mean is not None and running_var is not None:
      count = x.numel() // x.shape[1]
      running_mean.assign((1 - momentum) * running_mean + momentum * mean.detach())
      running_var.assign((1 - momentum) * running_var + momentum * var.detach() * (count / max(count - 1, 1)))
  else:
    if running_mean is None or running_var is None: raise ValueError("batch_norm: training=False needs running_mean and running_var")
    mean, var = running_mean, running_var
  return x.batchnorm(weight, bias, mean, (var + eps).rsqrt())


def apply_rotary_emb(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
  """Rotary position embedding (RoPE) in the half-split layout of GPT-NeoX and Hugging Face's Llama: the last axis
  (size D) is two halves (x1, x2) rotated pairwise, x1*cos - x2*sin and x2*cos + x1*sin. cos and sin (..., T, D/2)
  broadcast against x (..., T, D): one angle per position and pair (nn.RotaryEmbedding makes them)."""
  half = x.shape[-1] // 2
  if x.shape[-1] % 2 or cos.shape[-1] != half or sin.shape != cos.shape:
    raise ValueError(f"apply_rotary_emb: x {_shape_str(x.shape)} needs an even last axis and cos, sin (..., {half}); "
                     f"got cos {_shape_str(cos.shape)}, sin {_shape_str(sin.shape)}")
  x1, x2 = x[..., :half], x[..., half:]
  return (x1 * cos - x2 * sin).cat(x2 * cos + x1 * sin, dim=-1)
