"""Indexing: t[...] reads, t[...] = v writes, gather and scatter.

in: a Tensor and a Python index (ints, slices with steps, None, ..., integer/bool tensors or lists)
out: a Tensor. Basic indices become movement ops (shrink, flip, pad+reshape for steps), so they
never copy; tensor indices become one flat row index into the indexed axes, and a GATHER load reads
those rows (an embedding lookup reads 1 row, not all of them through a one-hot sum); its gradient is
the one-hot sum. gather/scatter along a dim keep the one-hot form.
"""
from __future__ import annotations
import numpy as np
from tinychad import function as F
from tinychad.dtype import dtypes
from tinychad.tensor import Tensor, _shape_str


SMALL_INDEX = 64   # out_of_bounds checks an index of at most this many values in Python


def out_of_bounds(index: Tensor, size: int, negative: bool = False, ignore: int | None = None) -> int | None:
  """The first value of the integer tensor `index` outside [0, size) ([-size, size) with negative=True;
  values equal to `ignore` pass), or None. Every index read (getitem, gather, scatter, nll_loss's targets)
  checks here on the host before building its graph: a kernel can't raise, so an out-of-range index
  would read another row (GATHER) or match no class (a one-hot), silently."""
  values = index.numpy()
  if ignore is not None: values = values[values != ignore]
  low = -size if negative else 0
  if values.size == 0: return None
  if values.size <= SMALL_INDEX:
    # a decoding step's token or position: Python's min and max of a short list cost less than numpy's calls
    items = values.reshape(-1).tolist()
    lowest, highest = min(items), max(items)
  else: lowest, highest = values.min(), values.max()
  if lowest >= low and highest < size: return None
  return int(values[(values < low) | (values >= size)].flat[0])


def _normalize(t: Tensor, index) -> list:
  """One entry per item, with Ellipsis expanded and lists/arrays turned into Tensors."""
  items = list(index) if isinstance(index, tuple) else [index]
  items = [Tensor(np.asarray(i)) if isinstance(i, (list, np.ndarray)) else i for i in items]
  for i in items:
    if not (i is None or i is Ellipsis or isinstance(i, (int, np.integer, slice, Tensor))) or isinstance(i, bool):
      raise TypeError(f"getitem: unsupported index {i!r} of type {type(i).__name__} for tensor of shape {_shape_str(t.shape)}")
  if sum(1 for i in items if i is Ellipsis) > 1: raise IndexError("getitem: an index can only have a single ellipsis ('...')")
  consumed = sum(i.ndim if isinstance(i, Tensor) and i.dtype == dtypes.bool else (0 if i is None or i is Ellipsis else 1) for i in items)
  if consumed > t.ndim:
    raise IndexError(f"getitem: too many indices for tensor of shape {_shape_str(t.shape)}: {consumed} given")
  if Ellipsis in [i for i in items if not isinstance(i, Tensor)]:
    pos = next(k for k, i in enumerate(items) if i is Ellipsis)
    items[pos:pos + 1] = [slice(None)] * (t.ndim - consumed)
  else:
    items += [slice(None)] * (t.ndim - consumed)
  # a bool mask becomes integer indices for each dim it covers (data dependent, so realized here)
  out, dim = [], 0
  for i in items:
    if isinstance(i, Tensor) and i.dtype == dtypes.bool:
      covered = t.shape[dim:dim + i.ndim]
      if i.shape != covered:
        raise IndexError(f"getitem: mask of shape {_shape_str(i.shape)} doesn't match dims {_shape_str(covered)} of tensor shape {_shape_str(t.shape)}")
      out.extend(Tensor(n.astype(np.int64), device=t.device) for n in np.nonzero(i.numpy()))
      dim += i.ndim
    else:
      out.append(i)
      dim += 0 if i is None else 1
  return out


def _take_every(t: Tensor, dim: int, step: int) -> Tensor:
  """Every `step`-th element of dim, starting at 0: pad to a multiple, split, keep column 0."""
  size = t.shape[dim]
  count = (size + step - 1) // step
  t = t.pad(tuple((0, count * step - size) if d == dim else (0, 0) for d in range(t.ndim)))
  t = t.reshape(t.shape[:dim] + (count, step) + t.shape[dim + 1:])
  t = t.shrink(tuple((0, 1) if d == dim + 1 else (0, s) for d, s in enumerate(t.shape)))
  return t.reshape(t.shape[:dim + 1] + t.shape[dim + 2:])


def getitem(t: Tensor, index) -> Tensor:
  items = _normalize(t, index)
  window, flips, steps, out_shape_ops, tensor_dims = [], [], [], [], []
  dim = 0
  for item in items:
    if item is None:
      out_shape_ops.append("new")
      continue
    size = t.shape[dim]
    if isinstance(item, (int, np.integer)):
      i = int(item)
      if not -size <= i < size: raise IndexError(f"getitem: index {i} is out of bounds for dim {dim} with size {size} (shape {_shape_str(t.shape)})")
      i %= size
      window.append((i, i + 1)); out_shape_ops.append("drop")
    elif isinstance(item, slice):
      start, stop, step = item.indices(size)
      count = len(range(start, stop, step))
      if count == 0: window.append((0, 0))
      elif step > 0: window.append((start, start + (count - 1) * step + 1))
      else: window.append((start - (count - 1) * (-step), start + 1)); flips.append(dim)
      if abs(step) > 1 and count > 0: steps.append((dim, abs(step)))
      out_shape_ops.append("keep")
    else:
      window.append((0, size)); out_shape_ops.append("tensor"); tensor_dims.append((dim, item))
    dim += 1
  x = t.shrink(tuple(window)) if window else t
  if flips: x = x.flip(*flips)
  for d, step in steps: x = _take_every(x, d, step)
  # apply int drops and None insertions; remember where tensor-indexed dims land
  new_shape, tensor_positions, src_dim = [], [], 0
  for op in out_shape_ops:
    if op == "new": new_shape.append(1)
    elif op == "drop": src_dim += 1
    else:
      if op == "tensor": tensor_positions.append(len(new_shape))
      new_shape.append(x.shape[src_dim]); src_dim += 1
  x = x.reshape(tuple(new_shape))
  if not tensor_dims: return x
  return _tensor_index(x, tensor_positions, [idx for _, idx in tensor_dims], t.shape)


def _tensor_index(x: Tensor, positions: list[int], indices: list[Tensor], orig_shape) -> Tensor:
  from tinychad.tensor import _broadcast_shape
  for idx in indices:
    if idx.dtype.category != 1: raise IndexError(f"getitem: tensors used as indices must be integer or bool, got {idx.dtype}")
  bshape = ()
  for idx in indices: bshape = _broadcast_shape(bshape, idx.shape, "getitem")
  flat, stride = None, 1
  for pos, idx in reversed(list(zip(positions, indices))):
    size = x.shape[pos]
    if (bad := out_of_bounds(idx, size, negative=True)) is not None:
      raise IndexError(f"getitem: index {bad} is out of bounds for dim with size {size} (tensor shape {_shape_str(orig_shape)})")
    idx = idx.cast(dtypes.int64)
    idx = (idx < 0).where(idx + size, idx)
    term = idx * stride if stride != 1 else idx
    flat = term if flat is None else flat + term
    stride *= size
  flat = flat.expand(bshape)
  rest = [d for d in range(x.ndim) if d not in positions]
  moved = x.permute(positions + rest)
  rest_shape = tuple(x.shape[d] for d in rest)
  moved = moved.reshape((stride,) + rest_shape)
  out = F.Gather.apply(moved, flat)
  consecutive = positions == list(range(positions[0], positions[0] + len(positions)))
  if consecutive and positions[0] > 0:
    nb, first = len(bshape), positions[0]
    order = list(range(nb, nb + first)) + list(range(nb)) + list(range(nb + first, out.ndim))
    out = out.permute(order)
  return out


def setitem(t: Tensor, index, value) -> None:
  """Write into a tensor: computed on the host from its realized value, then loaded back."""
  if t.requires_grad and t._ctx is None:
    raise RuntimeError("setitem: a leaf tensor that requires grad can't be modified in place")
  array = t.numpy().copy()
  host_index = tuple(i.numpy() if isinstance(i, Tensor) else i for i in (index if isinstance(index, tuple) else (index,)))
  new = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
  try:
    array[host_index] = new
  except IndexError as err:
    raise IndexError(f"setitem: {err} (tensor shape {_shape_str(t.shape)})") from None
  except ValueError as err:
    raise ValueError(f"setitem: value of shape {_shape_str(new.shape)} can't be written to that index of a tensor of shape {_shape_str(t.shape)}: {err}") from None
  from tinychad.lazy import LazyBuffer
  t.lazydata = LazyBuffer.from_numpy(array, t.device)


def _check_index_tensor(t: Tensor, dim: int, index: Tensor, op: str) -> None:
  if not isinstance(index, Tensor) or index.dtype.category != 1:
    raise TypeError(f"{op}: index must be an integer Tensor, got {getattr(index, 'dtype', type(index).__name__)}")
  if index.ndim != t.ndim:
    raise ValueError(f"{op}: index shape {_shape_str(index.shape)} needs as many dims as input shape {_shape_str(t.shape)}")
  for d, (a, b) in enumerate(zip(index.shape, t.shape)):
    if d != dim and a > b: raise ValueError(f"{op}: index shape {_shape_str(index.shape)} is larger than input shape {_shape_str(t.shape)} in dim {d}")
  if (bad := out_of_bounds(index, t.shape[dim])) is not None:
    raise IndexError(f"{op}: index {bad} is out of bounds for dim {dim} with size {t.shape[dim]}")


def gather(t: Tensor, dim: int, index: Tensor) -> Tensor:
  """out[i][j] = t[i][index[i][j]] (for dim=1): a one-hot mask against arange, then a sum."""
  dim = t._axis(dim, "gather")
  _check_index_tensor(t, dim, index, "gather")
  size = t.shape[dim]
  window = tuple((0, s) if d == dim else (0, index.shape[d]) for d, s in enumerate(t.shape))
  source = t.shrink(window).unsqueeze(-1).transpose(dim, -1)          # size at the end, 1 at dim
  source = source.expand(index.shape + (size,))
  one_hot = index.unsqueeze(-1) == Tensor.arange(size, device=t.device)
  return one_hot.where(source, 0).sum(-1, dtype=t.dtype)


def scatter(t: Tensor, dim: int, index: Tensor, src, reduce: str | None = None) -> Tensor:
  """out = t with out[index[i][j]][j] = src[i][j] (for dim=0); reduce 'add' or 'multiply' combines instead."""
  dim = t._axis(dim, "scatter")
  _check_index_tensor(t, dim, index, "scatter")
  size = t.shape[dim]
  src = src if isinstance(src, Tensor) else Tensor.full(index.shape, src, dtype=t.dtype, device=t.device)
  src = src.shrink(tuple((0, s) for s in index.shape)).cast(t.dtype)
  one_hot = index.unsqueeze(-1) == Tensor.arange(size, device=t.device)       # index.shape + (size,)
  pad_rest = tuple((0, 0) if d == dim else (0, t.shape[d] - index.shape[d]) for d in range(t.ndim))

  def to_target(x: Tensor) -> Tensor:
    # (index.shape + (size,)) reduced over `dim`, then the target size moved back into `dim`
    return x.transpose(dim, -1).squeeze(-1).pad(pad_rest)

  if reduce not in (None, "add", "multiply"): raise ValueError(f"scatter: reduce must be None, 'add' or 'multiply', got {reduce!r}")
  if 0 in index.shape: return t
  written = to_target(one_hot.any(dim, keepdim=True))
  if reduce == "multiply":
    factors = one_hot.where(src.unsqueeze(-1), 1).prod(dim, keepdim=True)
    return written.where(t * to_target(factors), t)
  if reduce is None:
    # several writes to one place: the last one (the largest position along dim) wins, as on PyTorch's CPU
    positions = Tensor.arange(1, index.shape[dim] + 1, device=t.device).reshape(tuple(-1 if d == dim else 1 for d in range(t.ndim + 1)))
    rank = one_hot.where(positions, 0)
    one_hot = one_hot & (rank == rank.max(dim, keepdim=True))
  contributions = to_target(one_hot.where(src.unsqueeze(-1), 0).sum(dim, keepdim=True, dtype=t.dtype))
  return t + contributions if reduce == "add" else written.where(contributions, t)
