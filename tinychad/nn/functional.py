"""Neural-network functions built from Tensor ops: convolutions, pooling, einsum, losses, attention.

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


def _pool_arguments(x: Tensor, kernel_size, stride, padding, dilation, n: int, op: str):
  """A pooling's arguments checked against x and spelled out: kernel, stride and dilation as n-tuples
  (stride defaults to the kernel, as in PyTorch), and (before, after) pad pairs for every dim of x."""
  if x.ndim < n + 1: raise ValueError(f"{op}: input of shape {_shape_str(x.shape)} needs at least {n + 1} dims")
  kernel = _tuple(kernel_size, n, "kernel_size", op, positive=True)
  stride = kernel if stride is None else _tuple(stride, n, "stride", op, positive=True)
  dilation = _tuple(dilation, n, "dilation", op, positive=True)
  pads = _padding_pairs(padding, kernel, dilation, n, op)
  _check_pool_padding(pads, kernel, dilation, op)
  _check_windows(x.shape, pads, kernel, dilation, op)
  return kernel, stride, dilation, ((0, 0),) * (x.ndim - n) + pads


def max_pool(x: Tensor, kernel_size, stride, padding, dilation, n: int) -> Tensor:
  kernel, stride, dilation, pads = _pool_arguments(x, kernel_size, stride, padding, dilation, n, f"max_pool{n}d")
  fill = -math.inf if x.dtype.is_float else int(-2 ** (8 * x.dtype.itemsize - 1))
  return _pool(x.pad(pads, value=fill), kernel, stride, dilation, Tensor.max)


def avg_pool(x: Tensor, kernel_size, stride, padding, count_include_pad: bool, n: int) -> Tensor:
  kernel, stride, dilation, pads = _pool_arguments(x, kernel_size, stride, padding, 1, n, f"avg_pool{n}d")
  total = _pool(x.pad(pads), kernel, stride, dilation, Tensor.sum)
  if count_include_pad: return total / math.prod(kernel)
  counts = _pool(Tensor.ones(x.shape[-n:], device=x.device).pad(pads[-n:]), kernel, stride, dilation, Tensor.sum)
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
  if (bad := out_of_bounds(target, classes, ignore=ignore_index)) is not None:
    raise IndexError(f"nll_loss: target {bad} is out of bounds for {classes} classes")
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
  """softmax(q k^T * scale + mask) v, as PyTorch's: attn_mask is bool (True = may attend) or float (added)."""
  return attention(q, k, v, attn_mask, dropout_p, is_causal, scale)[0]


def attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
              is_causal: bool = False, scale: float | None = None) -> tuple[Tensor, Tensor]:
  """scaled_dot_product_attention's output and the attention weights it used (after dropout, as
  MultiheadAttention returns them). Both are lazy: a caller that drops the weights computes nothing more."""
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
  # as PyTorch's: dropout_p is applied whenever it is above 0 (callers pass 0 in eval mode)
  if dropout_p > 0: weights = weights.dropout(dropout_p, training=True)
  if weights.ndim != 4 or v.ndim != 4: return weights @ v, weights
  # (batch, heads, L, E) computed in memory as (batch, L, heads, E), returned as a permuted view:
  # the usual next step, out.transpose(1, 2).reshape(batch, L, heads * E), is then free instead of a
  # strided read of every head inside the output projection's matmul
  batch, heads, length, source = weights.shape
  rows = weights.permute(0, 2, 1, 3).reshape(batch, length, heads, source, 1)
  values = v.expand(batch, heads, source, v.shape[-1]).reshape(batch, 1, heads, source, v.shape[-1])
  return (rows * values).sum(3).permute(0, 2, 1, 3), weights


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
