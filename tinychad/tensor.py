"""The front end: a PyTorch-like Tensor with autograd.

in: user calls (creation, math, movement, nn functions)
out: Tensors whose `lazydata` is a LazyBuffer graph; nothing runs until realize()/numpy()/item()/tolist().
Every method is composed from the autograd Functions in function.py (which sit on the primitive ops
of ops.py). Shapes, axes and dtypes are checked here, at the user's call, so errors name the op.

Where tinygrad's and PyTorch's habits meet, code written for either computes what it meant:
  - requires_grad is tinygrad's tri-state: None (Tensor(...)'s default: a leaf gets a gradient when a backward
    pass reaches it), True (always), False (never); requires_grad=False, detach(), buffers and no_grad() keep
    PyTorch's meaning. backward() of a non-scalar seeds with ones (see backward).
  - axis= (tinygrad) and dim= (PyTorch) are both accepted. x.max(axis) / x.max(axis=1) return the values, as in
    tinygrad; x.max(dim=1) returns PyTorch's (values, indices): the keyword tells which habit the caller has.
  - cat, stack and where take every tensor named, called as methods or on the class (a.stack(b), Tensor.stack(a, b),
    Tensor.stack([a, b], 1)).
  - Tensor.linear is tinygrad's (weight (in, out)); nn.functional.linear and nn.Linear are PyTorch's (out, in).
"""
from __future__ import annotations
import functools
import math
from contextlib import ContextDecorator
from typing import NamedTuple
import numpy as np
from tinychad import function as F
from tinychad.device import Device
from tinychad.dtype import DType, dtypes, result_type, scalar_dtype, promote_types
from tinychad.engine.jit import note_assign, note_random
from tinychad.engine.realize import realize
from tinychad.engine.schedule import create_schedule
from tinychad.helpers import argfix, prod
from tinychad.lazy import LazyBuffer
from tinychad.ops import BinaryOps, LoadOps
from tinychad.view import read_view

Scalar = int | float | bool
_NUMBERS = (int, float)
CUMSUM_BLOCK = 32   # a cumsum row longer than this is summed in blocks (Tensor._running_sum)
SORT_MAX = 8192     # sort/topk rank by n*n comparisons per row (and an n*n tie-break mask): refused beyond this


def _shape_str(shape) -> str: return str(tuple(int(s) for s in shape))


class Tensor:
  __slots__ = ("lazydata", "requires_grad", "grad", "_ctx", "__weakref__")
  training: bool = False   # dropout and batchnorm look at this
  no_grad: bool = False    # set by the no_grad() context: no graph for backward is recorded
  _rng: np.random.Generator = np.random.default_rng(0)

  def __init__(self, data, device: str | None = None, dtype: DType | str | None = None, requires_grad: bool | None = None):
    dtype = dtypes.from_any(dtype) if dtype is not None else None
    device = Device.canonicalize(device)
    if isinstance(data, LazyBuffer):
      lazydata = data if dtype is None else data.cast(dtype)
    elif isinstance(data, Tensor):
      lazydata = data.lazydata if dtype is None else data.lazydata.cast(dtype)
    elif isinstance(data, (bool, int, float)) and not isinstance(data, np.generic):
      lazydata = LazyBuffer.full(data, (), dtype or scalar_dtype(data), device)
    else:
      lazydata = LazyBuffer.from_numpy(_to_numpy(data, dtype), device)
    if lazydata.device != device and not isinstance(data, (LazyBuffer, Tensor)):
      lazydata = lazydata.copy_to_device(device)
    self.lazydata: LazyBuffer = lazydata
    self.requires_grad: bool | None = requires_grad
    self.grad: Tensor | None = None
    self._ctx: F.Function | None = None

  @staticmethod
  def from_lazy(lazydata: LazyBuffer, requires_grad: bool | None) -> Tensor:
    """Tensor(lazydata) without __init__'s checks: every op's result is made here, ~1 us less each."""
    out = object.__new__(Tensor)
    out.lazydata, out.requires_grad, out.grad, out._ctx = lazydata, requires_grad, None, None
    return out

  # ---- properties ----
  @property
  def shape(self) -> tuple[int, ...]: return self.lazydata.shape
  @property
  def dtype(self) -> DType: return self.lazydata.dtype
  @property
  def device(self) -> str: return self.lazydata.device
  @property
  def ndim(self) -> int: return len(self.lazydata.shape)
  def dim(self) -> int: return self.ndim
  def numel(self) -> int: return prod(self.shape)
  def size(self, dim: int | None = None):
    return self.shape if dim is None else self.shape[self._axis(dim, "size")]
  def element_size(self) -> int: return self.dtype.itemsize
  def __len__(self) -> int:
    if not self.shape: raise TypeError("len() of a 0-d tensor")
    return self.shape[0]
  @property
  def is_leaf(self) -> bool: return self._ctx is None

  def __repr__(self) -> str:
    values = np.array2string(self.numpy(), separator=", ", threshold=64, edgeitems=3, precision=4, prefix="tensor(")
    extra = f", dtype={self.dtype}" if self.dtype not in (dtypes.float32, dtypes.int64, dtypes.bool) else ""
    grad = ", requires_grad=True" if self.requires_grad else ""
    return f"tensor({values}{extra}, device={self.device!r}{grad})"

  def __hash__(self) -> int: return id(self)

  def __bool__(self) -> bool:
    if self.numel() != 1: raise RuntimeError(f"bool() of a tensor with {self.numel()} elements is ambiguous")
    return bool(self.item())

  # ---- running ----
  def realize(self, *others: Tensor) -> Tensor:
    """Compute this tensor (and `others`) now, in one schedule."""
    realize([self.lazydata, *[t.lazydata for t in others]] if others else [self.lazydata])
    return self

  def schedule(self) -> list:
    """The kernels a realize of this tensor would run, without running them."""
    return create_schedule([self.lazydata])

  def numpy(self) -> np.ndarray:
    """The values as a fresh numpy array of self.shape (realizes first; a constant needs no kernel)."""
    lb = self.lazydata
    base = lb.base
    if base.op is LoadOps.CONST and base.realized is None:
      return read_view(np.array([base.arg], dtype=lb.dtype.np), lb.st, lb.dtype).copy()
    realize([lb])
    return read_view(base.realized.as_numpy(), lb.st, lb.dtype).copy()
  def tolist(self): return self.numpy().tolist()
  def item(self) -> Scalar:
    if self.numel() != 1: raise ValueError(f"item() needs a tensor with one element, got shape {_shape_str(self.shape)}")
    return self.numpy().reshape(-1)[0].item()
  def data(self) -> np.ndarray: return self.numpy()

  def detach(self) -> Tensor: return Tensor(self.lazydata, requires_grad=False)
  def requires_grad_(self, requires_grad: bool = True) -> Tensor:
    self.requires_grad = requires_grad
    return self

  def to(self, device_or_dtype) -> Tensor:
    if isinstance(device_or_dtype, DType) or device_or_dtype in (bool, int, float): return self.cast(device_or_dtype)
    device = Device.canonicalize(device_or_dtype)
    if device == self.device: return self
    return F.Copy.apply(self, device=device)
  def cpu(self) -> Tensor: return self.to("CPU")

  def assign(self, other) -> Tensor:
    """Replace this tensor's value (used by optimizers); shapes and dtypes must match."""
    other = other if isinstance(other, Tensor) else Tensor(other, device=self.device, dtype=self.dtype)
    if other.shape != self.shape: raise ValueError(f"assign: shape {_shape_str(other.shape)} does not match {_shape_str(self.shape)}")
    note_assign(self)   # TinyJit learns which tensors a step updates, and which change between steps
    self.lazydata = other.lazydata.cast(self.dtype)
    return self

  # ---- creation ----
  @staticmethod
  def full(shape, fill_value: Scalar, dtype=None, device=None, requires_grad=None) -> Tensor:
    shape = argfix(shape) if not isinstance(shape, int) else (shape,)
    _check_shape(shape, "full")
    dtype = dtypes.from_any(dtype) if dtype is not None else scalar_dtype(fill_value)
    return Tensor(LazyBuffer.full(fill_value, shape, dtype, Device.canonicalize(device)), requires_grad=requires_grad)

  @staticmethod
  def zeros(*shape, dtype=None, device=None, requires_grad=None) -> Tensor:
    return Tensor.full(argfix(*shape), 0.0, dtype or dtypes.default_float, device, requires_grad)

  @staticmethod
  def ones(*shape, dtype=None, device=None, requires_grad=None) -> Tensor:
    return Tensor.full(argfix(*shape), 1.0, dtype or dtypes.default_float, device, requires_grad)

  @staticmethod
  def empty(*shape, dtype=None, device=None, requires_grad=None) -> Tensor:
    shape = argfix(*shape)
    _check_shape(shape, "empty")
    dtype = dtypes.from_any(dtype) if dtype is not None else dtypes.default_float
    return Tensor(LazyBuffer.empty(shape, dtype, Device.canonicalize(device)), requires_grad=requires_grad)

  def full_like(self, fill_value: Scalar, dtype=None, device=None, requires_grad=None) -> Tensor:
    return Tensor.full(self.shape, fill_value, dtype or self.dtype, device or self.device, requires_grad)
  def zeros_like(self, **kwargs) -> Tensor: return self.full_like(0, **kwargs)
  def ones_like(self, **kwargs) -> Tensor: return self.full_like(1, **kwargs)
  def empty_like(self, dtype=None, device=None) -> Tensor:
    return Tensor.empty(self.shape, dtype=dtype or self.dtype, device=device or self.device)
  def rand_like(self, dtype=None, device=None, requires_grad=None) -> Tensor:
    return Tensor.rand(self.shape, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)
  def randn_like(self, dtype=None, device=None, requires_grad=None) -> Tensor:
    return Tensor.randn(self.shape, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)

  @staticmethod
  def arange(start, stop=None, step=1, dtype=None, device=None, requires_grad=None) -> Tensor:
    if stop is None: start, stop = 0, start
    if step == 0: raise ValueError("arange: step must be nonzero")
    is_float = any(isinstance(v, float) for v in (start, stop, step))
    dtype = dtypes.from_any(dtype) if dtype is not None else (dtypes.default_float if is_float else dtypes.default_int)
    return Tensor(np.arange(start, stop, step).astype(dtype.np), device=device, requires_grad=requires_grad)

  @staticmethod
  def linspace(start: float, stop: float, steps: int, dtype=None, device=None, requires_grad=None) -> Tensor:
    if steps < 0: raise ValueError(f"linspace: steps must not be negative, got {steps}")
    dtype = dtypes.from_any(dtype) if dtype is not None else dtypes.default_float
    return Tensor(np.linspace(start, stop, steps).astype(dtype.np), device=device, requires_grad=requires_grad)

  @staticmethod
  def eye(n: int, m: int | None = None, dtype=None, device=None, requires_grad=None) -> Tensor:
    _check_shape((n,) if m is None else (n, m), "eye")
    dtype = dtypes.from_any(dtype) if dtype is not None else dtypes.default_float
    return Tensor(np.eye(n, m, dtype=dtype.np), device=device, requires_grad=requires_grad)

  # ---- random numbers: host generator, seeded by manual_seed ----
  @staticmethod
  def manual_seed(seed: int = 0) -> None: Tensor._rng = np.random.default_rng(seed)

  @staticmethod
  def _random(draw, dtype, device, requires_grad) -> Tensor:
    """A tensor of fresh random numbers from `draw()` (host generator); TinyJit re-draws them on replay."""
    dtype = dtypes.from_any(dtype) if dtype is not None else dtypes.default_float
    out = Tensor(draw().astype(dtype.np), device=device, requires_grad=requires_grad)
    note_random(out, lambda: draw().astype(dtype.np))   # a TinyJit replay draws them afresh
    return out

  @staticmethod
  def rand(*shape, dtype=None, device=None, requires_grad=None) -> Tensor:
    shape = argfix(*shape)
    _check_shape(shape, "rand")
    return Tensor._random(lambda: Tensor._rng.random(shape, dtype=np.float32), dtype, device, requires_grad)

  @staticmethod
  def randn(*shape, dtype=None, device=None, requires_grad=None) -> Tensor:
    shape = argfix(*shape)
    _check_shape(shape, "randn")
    return Tensor._random(lambda: Tensor._rng.standard_normal(shape, dtype=np.float32), dtype, device, requires_grad)

  @staticmethod
  def randint(low: int, high: int | None = None, size=(), dtype=None, device=None) -> Tensor:
    if high is None: low, high = 0, low
    _check_shape(argfix(size), "randint")
    return Tensor(Tensor._rng.integers(low, high, size=argfix(size)).astype((dtypes.from_any(dtype) if dtype else dtypes.int64).np), device=device)

  @staticmethod
  def uniform(*shape, low: float = 0.0, high: float = 1.0, dtype=None, device=None, requires_grad=None) -> Tensor:
    shape = argfix(*shape)
    _check_shape(shape, "uniform")
    return Tensor._random(lambda: Tensor._rng.uniform(low, high, shape), dtype, device, requires_grad)

  @staticmethod
  def normal(*shape, mean: float = 0.0, std: float = 1.0, dtype=None, device=None, requires_grad=None) -> Tensor:
    shape = argfix(*shape)
    _check_shape(shape, "normal")
    return Tensor._random(lambda: Tensor._rng.normal(mean, std, shape), dtype, device, requires_grad)

  @staticmethod
  def kaiming_uniform(*shape, a: float = 0.01, dtype=None, device=None, requires_grad=None) -> Tensor:
    """PyTorch's kaiming_uniform_ with leaky_relu gain: bound = gain * sqrt(3 / fan_in)."""
    shape = argfix(*shape)
    bound = math.sqrt(2.0 / (1 + a ** 2)) * math.sqrt(3.0 / prod(shape[1:]))
    return Tensor.uniform(*shape, low=-bound, high=bound, dtype=dtype, device=device, requires_grad=requires_grad)

  @staticmethod
  def glorot_uniform(*shape, dtype=None, device=None, requires_grad=None) -> Tensor:
    shape = argfix(*shape)
    bound = math.sqrt(6.0 / (shape[0] + prod(shape[1:])))
    return Tensor.uniform(*shape, low=-bound, high=bound, dtype=dtype, device=device, requires_grad=requires_grad)

  # ---- autograd ----
  def _toposort(self) -> list[Tensor]:
    order, seen = [], set()
    stack = [(self, False)]
    while stack:
      node, done = stack.pop()
      if done:
        order.append(node)
        continue
      if id(node) in seen: continue
      seen.add(id(node))
      stack.append((node, True))
      if node._ctx is not None:
        for parent in node._ctx.parents:
          if id(parent) not in seen: stack.append((parent, False))
    return order

  def backward(self, gradient: Tensor | None = None) -> Tensor:
    """Accumulate d(self)/d(leaf) into each leaf's .grad whose requires_grad is not False.

    requires_grad is tinygrad's tri-state: True (always gets a gradient, accumulated across passes as in PyTorch),
    None (the default of Tensor(...): gets this pass's gradient when the pass reaches it, replacing the last one, so
    an input reused by every step of a training loop doesn't grow an ever longer sum of unused gradients) or False
    (never: detach(), buffers, requires_grad=False, results made under no_grad()).
    Without `gradient`, a non-scalar output is seeded with ones, i.e. backward() of self.sum(), as shrimpgrad and
    tinygrad's early versions did (PyTorch raises): `x.dot(y).backward()` then gives x and y the gradients of the sum
    of the product, the one reading of an unseeded backward that needs no choice from the user.
    """
    if gradient is None: gradient = Tensor.ones(self.shape, dtype=self.dtype, device=self.device)
    if self._ctx is None and self.requires_grad is False:
      raise RuntimeError("backward: this tensor does not require grad and has no graph (requires_grad=False, detached "
                         "or made under no_grad())")
    if gradient.shape != self.shape: raise ValueError(f"backward: gradient shape {_shape_str(gradient.shape)} != tensor shape {_shape_str(self.shape)}")
    # each tensor's gradients from its users are collected, then added up (F.sum_gradients) when its turn comes
    grads: dict[int, list] = {id(self): [gradient.lazydata]}
    for node in reversed(self._toposort()):
      parts = grads.pop(id(node), None)
      if parts is None: continue
      grad = F.sum_gradients(parts)
      if node._ctx is None:
        if node.requires_grad is not False:
          new = Tensor(grad, requires_grad=False)
          node.grad = new if node.grad is None or node.requires_grad is None else (node.grad + new)
        continue
      parent_grads = node._ctx.backward(grad)
      if not isinstance(parent_grads, tuple): parent_grads = (parent_grads,)
      for parent, pgrad in zip(node._ctx.parents, parent_grads):
        if pgrad is None or parent.requires_grad is False: continue
        if pgrad.shape != parent.shape: raise RuntimeError(f"internal: gradient shape {pgrad.shape} for {parent.shape} in {type(node._ctx).__name__}")
        grads.setdefault(id(parent), []).append(pgrad)
      # free the graph as we go, as PyTorch does without retain_graph
      if node is not self: node._ctx = None
    self._ctx = None
    return self

  # ---- helpers for argument checking ----
  def _axis(self, axis: int, op: str, ndim: int | None = None) -> int:
    ndim = len(self.lazydata.shape) if ndim is None else ndim
    # the common case first (a Python int in range): every movement a model records asks this
    if type(axis) is int and -ndim <= axis < ndim: return axis % ndim
    if not isinstance(axis, (int, np.integer)): raise TypeError(f"{op}: axis must be an int, got {type(axis).__name__}")
    lo, hi = (-ndim, ndim - 1) if ndim > 0 else (-1, 0)
    if not lo <= axis <= hi:
      raise IndexError(f"{op}: dimension {axis} out of range [{lo}, {hi}] for tensor of shape {_shape_str(self.shape)}")
    return int(axis) % max(ndim, 1)

  def _axes(self, axis, op: str) -> tuple[int, ...]:
    if axis is None: return tuple(range(self.ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = tuple(self._axis(a, op) for a in axes)
    if len(set(out)) != len(out): raise ValueError(f"{op}: axis {axis} repeats a dimension")
    return out

  # ---- movement ----
  def reshape(self, *shape) -> Tensor:
    shape = argfix(*shape)
    if shape == self.shape: return self
    # one pass over the sizes: this runs for nearly every op a model records
    known, wildcard, plain = 1, None, True
    for axis, size in enumerate(shape):
      if type(size) is not int:
        if not isinstance(size, (int, np.integer)): raise ValueError(f"reshape: invalid shape {_shape_str(shape)}")
        plain = False
      if size < -1: raise ValueError(f"reshape: invalid shape {_shape_str(shape)}")
      if size != -1: known *= size
      elif wildcard is None: wildcard = axis
      else: raise ValueError(f"reshape: only one dimension can be -1, got {_shape_str(shape)}")
    numel = self.numel()
    if wildcard is not None:
      if known == 0 or numel % known: raise ValueError(f"reshape: shape {_shape_str(shape)} is invalid for input of size {numel} (shape {_shape_str(self.shape)})")
      shape = shape[:wildcard] + (numel // known,) + shape[wildcard + 1:]
    elif known != numel: raise ValueError(f"reshape: shape {_shape_str(shape)} is invalid for input of size {numel} (shape {_shape_str(self.shape)})")
    if not plain: shape = tuple(int(size) for size in shape)
    return self if shape == self.shape else F.Reshape.apply(self, shape=shape)
  view = reshape

  def permute(self, *order) -> Tensor:
    order = argfix(*order)
    ndim, natural = len(self.lazydata.shape), tuple(range(len(self.lazydata.shape)))
    # the common case, a permutation of 0..ndim-1 as Python ints, needs no normalizing (negative axes, checks)
    if len(order) != ndim or set(order) != set(natural) or not all(type(o) is int for o in order):
      if len(order) != ndim: raise ValueError(f"permute: order {order} has {len(order)} dims but tensor of shape {_shape_str(self.shape)} has {ndim}")
      order = tuple(self._axis(o, "permute") for o in order)
      if len(set(order)) != ndim: raise ValueError(f"permute: {order} is not a permutation of the dims of shape {_shape_str(self.shape)}")
    return self if order == natural else F.Permute.apply(self, order=order)

  def expand(self, *shape) -> Tensor:
    shape = argfix(*shape)
    if shape == self.shape: return self
    if len(shape) < self.ndim: raise ValueError(f"expand: shape {_shape_str(shape)} has fewer dims than tensor of shape {_shape_str(self.shape)}")
    padded = (1,) * (len(shape) - self.ndim) + self.shape
    if any(s < -1 for s in shape): raise ValueError(f"expand: invalid shape {_shape_str(shape)} for tensor of shape {_shape_str(self.shape)}")
    new = tuple(p if s == -1 else s for s, p in zip(shape, padded))
    for p, s in zip(padded, new):
      if p != s and p != 1: raise ValueError(f"expand: cannot expand shape {_shape_str(self.shape)} to {_shape_str(shape)}")
    return self._broadcast_to(new)
  broadcast_to = expand

  def _broadcast_to(self, shape: tuple[int, ...]) -> Tensor:
    """expand() to a shape already checked (by the caller) to be a broadcast of self.shape."""
    lb = self.lazydata
    if shape == lb.shape: return self
    # one op (F.Expand pads the dims itself), unless only dims of 1 are added: then a reshape is all it is
    if prod(shape) == lb.size: return F.Reshape.apply(self, shape=shape)
    return F.Expand.apply(self, shape=shape)

  def pad(self, padding, mode: str = "constant", value: float = 0.0) -> Tensor:
    """`padding` is PyTorch's flat form (last dim first: (left, right, top, bottom, ...)) or one (before, after) pair per dim."""
    pairs = _pad_pairs(padding, self.ndim, self.shape)
    if mode not in ("constant", "reflect", "replicate", "circular"): raise ValueError(f"pad: unknown mode {mode!r}")
    if mode == "reflect": return self._pad_reflect(pairs)
    if mode == "replicate" or mode == "circular": return self._pad_edges(pairs, mode)
    # negative padding crops
    if any(b < 0 or a < 0 for b, a in pairs):
      crop = tuple((max(0, -b), s - max(0, -a)) for (b, a), s in zip(pairs, self.shape))
      return self.shrink(crop).pad(tuple((max(0, b), max(0, a)) for b, a in pairs), value=value)
    if all(b == 0 and a == 0 for b, a in pairs): return self
    out = F.Pad.apply(self, arg=pairs)
    if value == 0: return out
    inside = Tensor.ones(self.shape, dtype=dtypes.bool, device=self.device).pad(pairs)
    return inside.where(out, value)

  def _pad_reflect(self, pairs) -> Tensor:
    x = self
    for dim, (before, after) in enumerate(pairs):
      size = x.shape[dim]
      if before >= size or after >= size:
        raise ValueError(f"pad: reflect padding ({before}, {after}) must be smaller than dim {dim} of shape {_shape_str(self.shape)}")
      parts = []
      if before: parts.append(x._slice_dim(dim, 1, before + 1).flip(dim))
      parts.append(x)
      if after: parts.append(x._slice_dim(dim, size - after - 1, size - 1).flip(dim))
      x = Tensor.cat(*parts, dim=dim) if len(parts) > 1 else x
    return x

  def _pad_edges(self, pairs, mode: str) -> Tensor:
    x = self
    for dim, (before, after) in enumerate(pairs):
      size = x.shape[dim]
      if mode == "replicate":
        left, right = x._slice_dim(dim, 0, 1), x._slice_dim(dim, size - 1, size)
        parts = [left.expand(*[before if d == dim else -1 for d in range(x.ndim)])] if before else []
        parts += [x] + ([right.expand(*[after if d == dim else -1 for d in range(x.ndim)])] if after else [])
      else:
        parts = ([x._slice_dim(dim, size - before, size)] if before else []) + [x] + ([x._slice_dim(dim, 0, after)] if after else [])
      x = Tensor.cat(*parts, dim=dim) if len(parts) > 1 else x
    return x

  def _slice_dim(self, dim: int, start: int, end: int) -> Tensor:
    windows = [(0, s) for s in self.lazydata.shape]
    windows[dim] = (start, end)
    return self.shrink(windows)

  def shrink(self, arg) -> Tensor:
    """Keep window (start, end) of each dim; None keeps the whole dim."""
    arg, shape = tuple(arg), self.lazydata.shape
    windows, whole = [], True
    # one pass over the dims: split, chunk and every slice of a model come here
    for window, size in zip(arg, shape):
      start, end = (0, size) if window is None else window
      if not 0 <= start <= end <= size:
        raise ValueError(f"shrink: window {arg} is out of bounds for shape {_shape_str(shape)}")
      whole = whole and start == 0 and end == size
      windows.append((start, end))
    if len(arg) != len(shape):
      raise ValueError(f"shrink: need one window per dim of shape {_shape_str(shape)}, got {arg}")
    return self if whole else F.Shrink.apply(self, arg=tuple(windows))

  def flip(self, *axes, dims=None) -> Tensor:
    dims = self._axes(argfix(*axes) if dims is None else dims, "flip")
    flags = tuple(i in dims for i in range(self.ndim))
    return F.Flip.apply(self, axes=flags) if any(flags) else self

  def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
    dim0, dim1 = self._axis(dim0, "transpose"), self._axis(dim1, "transpose")
    if self.ndim == 0 or dim0 == dim1: return self
    order = list(range(self.ndim))
    order[dim0], order[dim1] = order[dim1], order[dim0]
    return F.Permute.apply(self, order=tuple(order))

  @property
  def T(self) -> Tensor: return self.permute(tuple(reversed(range(self.ndim))))

  def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if self.ndim == 0: return self.reshape(1)
    start, end = self._axis(start_dim, "flatten"), self._axis(end_dim, "flatten")
    return self.reshape(self.shape[:start] + (prod(self.shape[start:end + 1]),) + self.shape[end + 1:])

  def unflatten(self, dim: int, sizes) -> Tensor:
    dim = self._axis(dim, "unflatten")
    return self.reshape(self.shape[:dim] + tuple(sizes) + self.shape[dim + 1:])

  def squeeze(self, dim=None) -> Tensor:
    """Drop size-1 dims: all of them, or those of `dim` (an int or a tuple of ints) that have size 1."""
    dims = self._axes(dim, "squeeze")
    return self.reshape(tuple(s for i, s in enumerate(self.shape) if i not in dims or s != 1))

  def unsqueeze(self, dim: int) -> Tensor:
    dim = self._axis(dim, "unsqueeze", self.ndim + 1)
    return self.reshape(self.shape[:dim] + (1,) + self.shape[dim:])

  def repeat(self, *repeats) -> Tensor:
    repeats = argfix(*repeats)
    if len(repeats) < self.ndim: raise ValueError(f"repeat: {len(repeats)} repeats for tensor of shape {_shape_str(self.shape)}")
    if any(r < 0 for r in repeats): raise ValueError(f"repeat: repeats {repeats} must not be negative (tensor of shape {_shape_str(self.shape)})")
    base = (1,) * (len(repeats) - self.ndim) + self.shape
    x = self.reshape(tuple(v for s in base for v in (1, s)))
    x = x.expand(tuple(v for r, s in zip(repeats, base) for v in (r, s)))
    return x.reshape(tuple(r * s for r, s in zip(repeats, base)))

  def contiguous(self) -> Tensor: return F.Contiguous.apply(self)

  def cat(self, *others: Tensor, dim: int = 0) -> Tensor:
    """Tensor.cat(a, b, dim=d), a.cat(b, dim=d) (tinygrad's forms) or PyTorch's Tensor.cat([a, b], d): every tensor
    named is included, `self` too."""
    self, others, dim = _joined(self, others, dim, "cat")
    tensors = (self,) + others
    dim = self._axis(dim, "cat")
    for t in others:
      if t.ndim != self.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, self.shape)) if i != dim):
        raise ValueError(f"cat: shapes {[_shape_str(x.shape) for x in tensors]} differ outside dim {dim}")
    dtype = promote_types(*[t.dtype for t in tensors])
    return F.Cat.apply(*[t.cast(dtype) for t in tensors], axis=dim)

  def stack(self, *others: Tensor, dim: int = 0) -> Tensor:
    """Tensor.stack(a, b, dim=d), a.stack(b, dim=d) (tinygrad's forms) or PyTorch's Tensor.stack([a, b], d): a method,
    not a staticmethod, so that `a.stack(b)` includes `a`."""
    first, others, dim = _joined(self, others, dim, "stack")
    tensors = (first,) + others
    for t in others:
      if t.shape != first.shape: raise ValueError(f"stack: all tensors need the same shape, got {[_shape_str(x.shape) for x in tensors]}")
    dim = first._axis(dim, "stack", first.ndim + 1)
    return Tensor.cat(*[t.unsqueeze(dim) for t in tensors], dim=dim)

  def split(self, split_size, dim: int = 0) -> list[Tensor]:
    dim = self._axis(dim, "split")
    size = self.shape[dim]
    if isinstance(split_size, int):
      if split_size <= 0: raise ValueError(f"split: split_size must be positive, got {split_size}")
      sizes = [min(split_size, size - i) for i in range(0, size, split_size)] or [0]
    else:
      sizes = list(split_size)
      if sum(sizes) != size: raise ValueError(f"split: sizes {sizes} don't add up to dim {dim} of shape {_shape_str(self.shape)}")
    out, start = [], 0
    for s in sizes:
      out.append(self._slice_dim(dim, start, start + s))
      start += s
    return out

  def chunk(self, chunks: int, dim: int = 0) -> list[Tensor]:
    dim = self._axis(dim, "chunk")
    if not isinstance(chunks, (int, np.integer)) or chunks <= 0:
      raise ValueError(f"chunk: chunks must be a positive int, got {chunks!r} (tensor of shape {_shape_str(self.shape)})")
    return self.split(max(1, math.ceil(self.shape[dim] / chunks)), dim)

  # ---- indexing ----
  def __getitem__(self, index) -> Tensor:
    from tinychad.indexing import getitem
    return getitem(self, index)

  def __setitem__(self, index, value) -> None:
    from tinychad.indexing import setitem
    setitem(self, index, value)

  def gather(self, dim: int, index: Tensor) -> Tensor:
    from tinychad.indexing import gather
    return gather(self, dim, index)

  def scatter(self, dim: int, index: Tensor, src, reduce: str | None = None) -> Tensor:
    from tinychad.indexing import scatter
    return scatter(self, dim, index, src, reduce)

  def masked_fill(self, mask: Tensor, value) -> Tensor:
    """self where mask is False, else value (cast to self's dtype, as PyTorch does)."""
    value = value.cast(self.dtype) if isinstance(value, Tensor) else Tensor.full((), value, dtype=self.dtype, device=self.device)
    return Tensor.where(mask, value, self)

  def one_hot(self, num_classes: int = -1) -> Tensor:
    """Classes must lie in [0, num_classes) (checked on the host, as indices are: a row of zeros would hide the bug)."""
    from tinychad.indexing import out_of_bounds
    if self.dtype.category != 1: raise TypeError(f"one_hot: needs an integer tensor, got {self.dtype}")
    if num_classes == -1: num_classes = int(self.max().item()) + 1 if self.numel() else 0
    if (bad := out_of_bounds(self, num_classes)) is not None:
      raise ValueError(f"one_hot: class {bad} is outside [0, {num_classes}) (tensor of shape {_shape_str(self.shape)}, {self.dtype})")
    return (self.unsqueeze(-1) == Tensor.arange(num_classes, device=self.device)).cast(dtypes.int64)

  # ---- broadcasting and type promotion for binary ops ----
  def _broadcasted(self, other, op: str, reverse: bool = False) -> tuple[Tensor, Tensor]:
    x: Tensor = self
    if isinstance(other, Tensor):
      # the common case, two tensors alike, read straight off their LazyBuffers (no property calls)
      mine, theirs = x.lazydata, other.lazydata
      if theirs.dtype is mine.dtype and theirs.shape == mine.shape and theirs.device == mine.device:
        return (other, x) if reverse else (x, other)
      y = other
      if theirs.device != mine.device: raise ValueError(f"{op}: tensors are on different devices {x.device} and {y.device}")
      if theirs.dtype is mine.dtype: dtype = mine.dtype
      else:
        groups = ([], [], [])
        for t in (x, y): groups[0 if t.ndim else 1].append(t.dtype)
        dtype = result_type(*groups)
    elif isinstance(other, (bool, int, float, np.generic)):
      other = other.item() if isinstance(other, np.generic) else other
      mine = x.lazydata
      # a float tensor keeps its dtype with a Python int or float (the common case, without the promotion rules)
      if mine.dtype.category == 2 and type(other) in _NUMBERS: dtype = mine.dtype
      else: dtype = _scalar_promotion(mine.dtype, len(mine.shape) > 0, scalar_dtype(other))
      # a scalar has no gradient and broadcasts to x's shape: it is made at that shape directly, a
      # constant seen through one zero-stride view, instead of a 0-d tensor reshaped and expanded by
      # two recorded ops (most scalar ops in a composite like erf or gelu cost a third less)
      y = Tensor.from_lazy(LazyBuffer.operand(other, mine.shape, dtype, mine.device), None)
      if dtype is not mine.dtype: x = x.cast(dtype)
      return (y, x) if reverse else (x, y)
    else:
      raise TypeError(f"{op}: unsupported operand type {type(other).__name__} with Tensor")
    if reverse: x, y = y, x
    x, y = x.cast(dtype), y.cast(dtype)
    shape = _broadcast_shape(x.lazydata.shape, y.lazydata.shape, op)
    return x._broadcast_to(shape), y._broadcast_to(shape)

  # ---- elementwise math ----
  def _float(self) -> Tensor: return self if self.lazydata.dtype.is_float else self.cast(dtypes.default_float)

  def neg(self) -> Tensor:
    if self.dtype == dtypes.bool: raise TypeError("neg: negation of a bool tensor is not supported, use ~ or logical_not()")
    return F.Neg.apply(self)
  def __neg__(self) -> Tensor: return self.neg()
  def __abs__(self) -> Tensor: return self.abs()
  def reciprocal(self) -> Tensor: return F.Reciprocal.apply(self._float())
  def sqrt(self) -> Tensor: return F.Sqrt.apply(self._float())
  def rsqrt(self) -> Tensor: return self.sqrt().reciprocal()
  def exp(self) -> Tensor: return F.Exp.apply(self._float())
  def exp2(self) -> Tensor: return (self._float() * math.log(2)).exp()
  def log(self) -> Tensor: return F.Log.apply(self._float())
  def log2(self) -> Tensor: return self.log() / math.log(2)
  def log10(self) -> Tensor: return self.log() / math.log(10)
  def log1p(self) -> Tensor:
    """log(u) + (x - (u - 1)) / u with u = 1 + x: the second term adds back what rounding 1 + x lost, so small x keep
    their precision (log(1 + 1e-8) is 1e-8, not 0); its gradient is 1/u up to rounding."""
    x = self._float()
    u = x + 1
    # the correction is 0/0 at u = 0 and inf - inf at u = inf: it is left out there (the log is exact), and reads
    # safe values so that its gradient is no NaN either
    ok = ((u > 0) & (u < math.inf)).detach()
    return u.log() + ok.where(x - (u - 1), 0) / ok.where(u, 1)
  def expm1(self) -> Tensor:
    """exp(x) - 1, with |x| < 1/2 summed as its Taylor series (to x^9, error < 3e-9 relative) so small x keep their
    precision; the series reads x clipped to +-1/2 so the branch not taken stays finite, gradient included."""
    x = self._float()
    small = x.clip(-0.5, 0.5)
    series, term = small, small
    for k in range(2, 10):
      term = term * small * (1 / k)
      series = series + term
    return (x.abs() < 0.5).detach().where(series, x.exp() - 1)
  def sin(self) -> Tensor: return F.Sin.apply(self._float())
  def cos(self) -> Tensor: return ((math.pi / 2) - self._float()).sin()
  def tan(self) -> Tensor: return self.sin() / self.cos()
  def sigmoid(self) -> Tensor: return F.Sigmoid.apply(self._float())
  def relu(self) -> Tensor: return F.Relu.apply(self)
  def trunc(self) -> Tensor: return F.Trunc.apply(self) if self.dtype.is_float else self
  def floor(self) -> Tensor:
    if not self.dtype.is_float: return self
    t = self.trunc()
    return (self < t).where(t - 1, t)
  def ceil(self) -> Tensor:
    if not self.dtype.is_float: return self
    t = self.trunc()
    return (self > t).where(t + 1, t)
  def round(self) -> Tensor:
    """Round half to even, as PyTorch does."""
    if not self.dtype.is_float: return self
    down = self.floor()
    diff = self - down
    even_down = (down * 0.5).floor() * 2 == down
    return (diff > 0.5).where(down + 1, (diff < 0.5).where(down, even_down.where(down, down + 1)))
  def abs(self) -> Tensor:
    if self.dtype.is_unsigned: return self
    return self.relu() + (-self).relu()
  def sign(self) -> Tensor:
    if self.dtype == dtypes.bool: return self
    # sign(nan) is 0 as in PyTorch; the zero gradient still reaches self
    return (self > 0).cast(self.dtype) - (self < 0).cast(self.dtype) + self._graph_zeros()
  def _graph_zeros(self) -> Tensor:
    """Zeros (also where self is inf or nan) that keep self in the graph, so self gets a zero gradient."""
    return (self.abs() < math.inf).where(self * 0, 0)
  def square(self) -> Tensor: return self * self
  def tanh(self) -> Tensor: return 2.0 * (2.0 * self._float()).sigmoid() - 1.0
  def sinh(self) -> Tensor: return (self.exp() - (-self._float()).exp()) / 2
  def cosh(self) -> Tensor: return (self.exp() + (-self._float()).exp()) / 2
  def atanh(self) -> Tensor: return ((1 + self._float()) / (1 - self._float())).log() / 2
  def asinh(self) -> Tensor: return (self._float() + (self.square() + 1).sqrt()).log()
  def acosh(self) -> Tensor: return (self._float() + (self.square() - 1).sqrt()).log()
  # the piecewise functions below pick PyTorch's gradient at their kinks: the x <= 0 side at 0
  def leaky_relu(self, negative_slope: float = 0.01) -> Tensor: return (self > 0).where(self, self * negative_slope)
  def elu(self, alpha: float = 1.0) -> Tensor: return (self > 0).where(self, alpha * (self.exp() - 1))
  def celu(self, alpha: float = 1.0) -> Tensor: return self.maximum(0) + (alpha * ((self / alpha).exp() - 1)).minimum(0)
  def selu(self, alpha: float = 1.67326, gamma: float = 1.0507) -> Tensor: return gamma * (self >= 0).detach().where(self, alpha * (self.exp() - 1))
  def swish(self) -> Tensor: return self * self.sigmoid()
  silu = swish
  def relu6(self) -> Tensor: return self.hardtanh(0, 6)
  def hardswish(self) -> Tensor: return self * (self + 3).relu6() * (1 / 6)
  def hardsigmoid(self) -> Tensor: return (self + 3).relu6() / 6
  def hardtanh(self, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    """clip, but with a zero gradient on the bounds themselves (clip passes it there), as in PyTorch."""
    return ((self > min_val) & (self < max_val)).where(self, self.clip(min_val, max_val).detach())
  def softplus(self, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    scaled = self._float() * beta
    # log(1+exp(x)) computed stably as max(x,0) + log(1+exp(-|x|)); linear above the threshold as in PyTorch.
    # maximum splits the gradient at 0, which gives exactly sigmoid(0) = 1/2 there
    soft = (scaled.maximum(0) + (-(scaled.abs())).exp().log1p()) / beta
    return (scaled > threshold).detach().where(self._float(), soft)
  def mish(self) -> Tensor: return self * self.softplus().tanh()
  def quick_gelu(self) -> Tensor: return self * (self * 1.702).sigmoid()
  def gelu(self, approximate: str = "none") -> Tensor:
    if approximate == "tanh":
      return 0.5 * self * (1 + (math.sqrt(2 / math.pi) * (self + 0.044715 * self * self * self)).tanh())
    return F.Gelu.apply(self._float())
  def erf(self) -> Tensor:
    """erf by piecewise fits (engine/erf.py). float64 inputs: in float64, within 3e-13 (relative below |x| 1.5,
    absolute above). Others: in float32 (float16 rounds the result), within 1 ulp as PyTorch's float32 erf: 0.857 ulp
    at most over every float32, alike on every device."""
    return F.Erf.apply(self._float())
  def clip(self, min_=None, max_=None) -> Tensor:
    """Bounds count as inside: the gradient passes on them, as in PyTorch (NaN stays NaN)."""
    if min_ is None and max_ is None: raise ValueError("clip: at least one of min and max must be given")
    x = self
    if min_ is not None: x = (x < min_).where(min_, x)
    if max_ is not None: x = (x > max_).where(max_, x)
    return x
  clamp = clip
  def logical_not(self) -> Tensor: return self.cast(dtypes.bool) ^ True
  def __invert__(self) -> Tensor:
    if self.dtype.is_float: raise TypeError(f"bitwise_not: not defined for {self.dtype}")
    return self ^ (True if self.dtype == dtypes.bool else -1)
  def lerp(self, end: Tensor, weight) -> Tensor: return self + (end - self) * weight

  def cast(self, dtype) -> Tensor:
    if dtype is self.lazydata.dtype: return self
    dtype = dtypes.from_any(dtype)
    if dtype == self.dtype: return self
    # integers and bools carry no gradient, as in PyTorch
    return F.Cast.apply(self if dtype.is_float else self.detach(), dtype=dtype)
  def float(self) -> Tensor: return self.cast(dtypes.float32)
  def half(self) -> Tensor: return self.cast(dtypes.float16)
  def double(self) -> Tensor: return self.cast(dtypes.float64)
  def int(self) -> Tensor: return self.cast(dtypes.int32)
  def long(self) -> Tensor: return self.cast(dtypes.int64)
  def bool(self) -> Tensor: return self.cast(dtypes.bool)
  def bitcast(self, dtype) -> Tensor:
    dtype = dtypes.from_any(dtype)
    if dtype.itemsize != self.dtype.itemsize: raise TypeError(f"bitcast: {self.dtype} and {dtype} differ in size")
    return Tensor(self.lazydata.e(F.UnaryOps.BITCAST, arg=dtype) if dtype != self.dtype else self.lazydata)

  # ---- binary ops ----
  def add(self, other, reverse: bool = False) -> Tensor:
    x, y = self._broadcasted(other, "add", reverse)
    if x.lazydata.dtype is dtypes.bool: return x | y
    return F.Add.apply(x, y)
  def sub(self, other, reverse: bool = False) -> Tensor:
    x, y = self._broadcasted(other, "sub", reverse)
    if x.lazydata.dtype is dtypes.bool: raise TypeError("sub: subtraction of bool tensors is not supported, use ^ or logical_xor()")
    return F.Sub.apply(x, y)
  def mul(self, other, reverse: bool = False) -> Tensor:
    x, y = self._broadcasted(other, "mul", reverse)
    if x.lazydata.dtype is dtypes.bool: return x & y
    return F.Mul.apply(x, y)
  def div(self, other, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
    if rounding_mode == "floor": return self.floor_divide(other, reverse)
    if rounding_mode == "trunc":
      x, y = self._broadcasted(other, "div", reverse)
      return F.NoGradBinary.apply(x, y, op=BinaryOps.DIV) if not x.dtype.is_float else (x / y).trunc()
    x, y = self._broadcasted(other, "div", reverse)
    return F.Div.apply(x._float(), y._float())
  def floor_divide(self, other, reverse: bool = False) -> Tensor:
    x, y = self._broadcasted(other, "floor_divide", reverse)
    if x.dtype.is_float: return x._floor_divide_float(y)
    quotient = F.NoGradBinary.apply(x, y, op=BinaryOps.DIV)
    remainder = F.NoGradBinary.apply(x, y, op=BinaryOps.MOD)
    # C truncates toward zero; Python and PyTorch floor: step down when the signs differ and it isn't exact
    adjust = (remainder != 0) & ((remainder < 0) != (y < 0))
    return adjust.where(quotient - 1, quotient)
  def _floor_divide_float(self, y: Tensor) -> Tensor:
    """PyTorch's div_floor: (x - fmod(x, y)) / y stepped down when the signs differ, then rounded to the
    nearest whole number (exact where floor(x / y) would round wrong); x / y when y is 0. No gradient."""
    x = self.detach()
    y = y.detach()
    mod = F.NoGradBinary.apply(x, y, op=BinaryOps.MOD)
    div = (x - mod) / y
    div = ((mod != 0) & ((y < 0) != (mod < 0))).where(div - 1, div)
    floor = div.floor()
    rounded = (div - floor > 0.5).where(floor + 1, floor)
    return (y == 0).where(x / y, (div != 0).where(rounded, (x / y) * 0))
  def mod(self, other, reverse: bool = False) -> Tensor:
    x, y = self._broadcasted(other, "remainder", reverse)
    if x.dtype == dtypes.bool: raise TypeError("remainder: not defined for bool tensors")
    return F.Remainder.apply(x, y)
  remainder = mod
  def pow(self, exponent, reverse: bool = False) -> Tensor:
    if not reverse and isinstance(exponent, (int, float)) and not isinstance(exponent, bool):
      x = self.cast(result_type([self.dtype], [], [scalar_dtype(exponent)]))
      if exponent == 2: return x * x
      if exponent == 1: return x * 1
      if exponent == 0.5: return x.sqrt()
      if exponent == -1: return x.reciprocal()
      # x**0 is 1 even for inf and nan, with a zero gradient (so x still gets one, as in PyTorch)
      if exponent == 0: return x._graph_zeros() + 1
    base, expo = self._broadcasted(exponent, "pow", reverse)
    if not base.dtype.is_float:
      return base._int_pow(expo)
    # x**y = exp(y*log|x|) (which also gives 0**y), with the sign of x restored for odd integer exponents;
    # -0.0 counts as negative there, as in C's pow
    magnitude = (expo * base.abs().log()).exp()
    is_odd = (expo - 2 * (expo * 0.5).floor()).abs() == 1
    negative = (base < 0) | ((base == 0) & (base.reciprocal() < 0))
    signed = (negative & is_odd).where(-magnitude, magnitude)
    not_integer = expo.floor() != expo
    out = ((base < 0) & not_integer & (base != -math.inf)).where(math.nan, signed)
    # at 0 the value is right but its gradient would be nan
    out = (base == 0).where(signed.detach(), out)
    # x**0 and 1**y are 1 even for inf and nan, and so is (-1)**inf
    return ((expo == 0) | (base == 1) | ((base == -1) & (expo.abs() == math.inf))).where(1.0, out)
  def _int_pow(self, expo: Tensor) -> Tensor:
    """Integer powers by repeated squaring over the bits of the exponent (exponents >= 0, < 2**16)."""
    result, base, e = self.ones_like(), self, expo
    for _ in range(16):
      result = ((e % 2) == 1).where(result * base, result)
      base, e = base * base, e // 2
    return result
  def maximum(self, other) -> Tensor:
    x, y = self._broadcasted(other, "maximum")
    if x.dtype == dtypes.bool: return x | y
    return F.Maximum.apply(x, y)
  def minimum(self, other) -> Tensor:
    x, y = self._broadcasted(other, "minimum")
    if x.dtype == dtypes.bool: return x & y
    if x.dtype.is_unsigned: return (x < y).where(x, y)
    return -F.Maximum.apply(-x, -y)
  def where(self, x, y) -> Tensor:
    """self ? x : y (self is the condition), broadcasting all three."""
    cond = self if isinstance(self, Tensor) else Tensor(self)
    if not isinstance(x, Tensor) and not isinstance(y, Tensor):
      ref = cond
      dtype = result_type([], [], [scalar_dtype(x), scalar_dtype(y)])
      x, y = Tensor(LazyBuffer.full(x, (), dtype, ref.device)), Tensor(LazyBuffer.full(y, (), dtype, ref.device))
    elif not isinstance(x, Tensor): y, x = y._broadcasted(x, "where")
    else: x, y = x._broadcasted(y, "where")
    shape = _broadcast_shape(_broadcast_shape(cond.shape, x.shape, "where"), y.shape, "where")
    return F.Where.apply(cond.cast(dtypes.bool).expand(shape), x.expand(shape), y.expand(shape))

  def _compare(self, other, op: BinaryOps, name: str, reverse: bool = False) -> Tensor:
    try:
      x, y = self._broadcasted(other, name, reverse)
    except OverflowError:
      # an int outside an integer dtype's range (uint8 labels != -100): compared exactly in int64, as numpy does,
      # where casting it to the tensor's dtype would wrap it around (or raise)
      if self.dtype.category != 1 or self.dtype == dtypes.int64: raise
      x, y = self.cast(dtypes.int64)._broadcasted(other, name, reverse)
    return F.NoGradBinary.apply(x, y, op=op)
  def __lt__(self, other) -> Tensor: return self._compare(other, BinaryOps.CMPLT, "lt")
  def __gt__(self, other) -> Tensor: return self._compare(other, BinaryOps.CMPLT, "gt", reverse=True)
  # not (x > y) would make nan <= 1 true
  def __le__(self, other) -> Tensor: return self._compare(other, BinaryOps.CMPLT, "le") | self._compare(other, BinaryOps.CMPEQ, "le")
  def __ge__(self, other) -> Tensor: return self._compare(other, BinaryOps.CMPLT, "ge", reverse=True) | self._compare(other, BinaryOps.CMPEQ, "ge")
  def __eq__(self, other) -> Tensor: return self._compare(other, BinaryOps.CMPEQ, "eq")  # type: ignore[override]
  def __ne__(self, other) -> Tensor: return self._compare(other, BinaryOps.CMPNE, "ne")  # type: ignore[override]
  eq, ne, lt, gt, le, ge = __eq__, __ne__, __lt__, __gt__, __le__, __ge__

  def _bitwise(self, other, op: BinaryOps, name: str, reverse: bool = False) -> Tensor:
    x, y = self._broadcasted(other, name, reverse)
    if x.dtype.is_float: raise TypeError(f"{name}: not defined for {x.dtype} tensors")
    return F.NoGradBinary.apply(x, y, op=op)
  def __and__(self, other) -> Tensor: return self._bitwise(other, BinaryOps.AND, "bitwise_and")
  def __or__(self, other) -> Tensor: return self._bitwise(other, BinaryOps.OR, "bitwise_or")
  def __xor__(self, other) -> Tensor: return self._bitwise(other, BinaryOps.XOR, "bitwise_xor")
  def __rand__(self, other) -> Tensor: return self._bitwise(other, BinaryOps.AND, "bitwise_and", True)
  def __ror__(self, other) -> Tensor: return self._bitwise(other, BinaryOps.OR, "bitwise_or", True)
  def __rxor__(self, other) -> Tensor: return self._bitwise(other, BinaryOps.XOR, "bitwise_xor", True)
  def logical_and(self, other) -> Tensor: return self.bool() & (other.bool() if isinstance(other, Tensor) else bool(other))
  def logical_or(self, other) -> Tensor: return self.bool() | (other.bool() if isinstance(other, Tensor) else bool(other))
  def logical_xor(self, other) -> Tensor: return self.bool() ^ (other.bool() if isinstance(other, Tensor) else bool(other))

  # the four arithmetic operators are the methods themselves (reverse=False), one Python call less per op
  __add__ = add
  def __radd__(self, other) -> Tensor: return self.add(other, True)
  __sub__ = sub
  def __rsub__(self, other) -> Tensor: return self.sub(other, True)
  __mul__ = mul
  def __rmul__(self, other) -> Tensor: return self.mul(other, True)
  __truediv__ = div
  def __rtruediv__(self, other) -> Tensor: return self.div(other, True)
  def __floordiv__(self, other) -> Tensor: return self.floor_divide(other)
  def __rfloordiv__(self, other) -> Tensor: return self.floor_divide(other, True)
  def __mod__(self, other) -> Tensor: return self.mod(other)
  def __rmod__(self, other) -> Tensor: return self.mod(other, True)
  def __pow__(self, other) -> Tensor: return self.pow(other)
  def __rpow__(self, other) -> Tensor: return self.pow(other, True)
  def __matmul__(self, other) -> Tensor: return self.matmul(other)
  def __rmatmul__(self, other) -> Tensor: return Tensor(other).matmul(self) if not isinstance(other, Tensor) else other.matmul(self)
  def __iadd__(self, other) -> Tensor: return self.assign(self + other)
  def __isub__(self, other) -> Tensor: return self.assign(self - other)
  def __imul__(self, other) -> Tensor: return self.assign(self * other)
  def __itruediv__(self, other) -> Tensor: return self.assign(self / other)

  # ---- reductions ----
  def _reduce(self, fn, axis, keepdim: bool, op: str) -> Tensor:
    """fn(x, axes, shape): one autograd op reducing x over axes, its result seen with `shape` (keepdim's or not)."""
    axes = self._axes(axis, op)
    if self.ndim == 0: return fn(self.reshape(1), (0,), ()) if axes == () or axes == (0,) else self
    if not axes: return self
    if keepdim: return fn(self, axes, tuple(1 if i in axes else s for i, s in enumerate(self.shape)))
    return fn(self, axes, tuple(s for i, s in enumerate(self.shape) if i not in axes))

  def sum(self, axis=None, keepdim: bool = False, dtype=None, dim=None) -> Tensor:
    if dim is not None: axis = dim
    x = self
    if dtype is not None: x = x.cast(dtype)
    elif not x.dtype.is_float: x = x.cast(dtypes.int64)
    return x._reduce(lambda t, axes, shape: F.Sum.apply(t, axis=axes, shape=shape), axis, keepdim, "sum")

  def max(self, axis=None, keepdim: bool = False, dim=None):
    """The maximum over axis (tinygrad's form, positional or axis=: the values). With dim= (PyTorch's keyword) the
    result is PyTorch's (values, indices) named tuple: the keyword says which framework's habit the caller has."""
    if dim is not None: return self._values_indices(self.argmax(dim, keepdim=True), dim, keepdim)
    self._check_not_empty(axis, "max")
    return self._reduce(lambda t, axes, shape: F.Max.apply(t, axis=axes, shape=shape), axis, keepdim, "max")

  def min(self, axis=None, keepdim: bool = False, dim=None):
    """As max: the values, or (values, indices) with dim=."""
    if dim is not None: return self._values_indices(self.argmin(dim, keepdim=True), dim, keepdim)
    self._check_not_empty(axis, "min")
    if self.dtype == dtypes.bool: return self.logical_not().max(axis, keepdim).logical_not()
    if self.dtype.is_unsigned:
      top = np.iinfo(self.dtype.np).max
      return top - (top - self).max(axis, keepdim)
    return -((-self).max(axis, keepdim))

  def _check_not_empty(self, axis, op: str) -> None:
    """max, min and their arg forms have no identity: over nothing they raise, as in PyTorch."""
    if axis is None and self.numel() == 0: raise ValueError(f"{op}: empty tensor of shape {_shape_str(self.shape)} with no axis to reduce over")
    for a in self._axes(axis, op):
      if self.ndim and self.shape[a] == 0: raise ValueError(f"{op}: cannot reduce over dim {a} of size 0 (shape {_shape_str(self.shape)})")

  def _values_indices(self, indices: Tensor, dim: int, keepdim: bool) -> ValuesIndices:
    """The values picked by indices (kept dim): gathered, so that, as in PyTorch, among tied maxima only the one at
    the index gets the gradient (max() without dim shares it among them, as PyTorch's amax does)."""
    if self.ndim == 0: return ValuesIndices(self, indices.reshape(()))
    values = self.gather(dim, indices)
    return ValuesIndices(values, indices) if keepdim else ValuesIndices(values.squeeze(dim), indices.squeeze(dim))

  def mean(self, axis=None, keepdim: bool = False, dtype=None, dim=None) -> Tensor:
    if dim is not None: axis = dim
    x = self.cast(dtype) if dtype is not None else self._float()
    total = x.sum(axis, keepdim)
    count = prod(s for i, s in enumerate(self.shape) if i in self._axes(axis, "mean"))
    return total / count if count else total * math.nan

  def var(self, axis=None, keepdim: bool = False, correction: int = 1, unbiased: bool | None = None, dim=None) -> Tensor:
    if dim is not None: axis = dim
    if unbiased is not None: correction = int(unbiased)
    x = self._float()
    centered = x - x.mean(axis, keepdim=True)
    count = prod(s for i, s in enumerate(self.shape) if i in self._axes(axis, "var"))
    return (centered * centered).sum(axis, keepdim) / max(0, count - correction)

  def std(self, axis=None, keepdim: bool = False, correction: int = 1, unbiased: bool | None = None, dim=None) -> Tensor:
    if dim is not None: axis = dim
    variance = self.var(axis, keepdim, correction, unbiased)
    # where the variance is 0 (constant input) PyTorch's gradient is 0, not 0 * inf = nan
    is_zero = (variance == 0).detach()
    return is_zero.where(0.0, is_zero.where(1.0, variance).sqrt())

  def prod(self, axis=None, keepdim: bool = False, dim=None) -> Tensor:
    """Product as exp(sum(log|x|)) with the sign and zeros tracked separately (differentiable)."""
    if dim is not None: axis = dim
    x = self if self.dtype.is_float else self.cast(dtypes.int64)
    if not x.dtype.is_float:
      return x._prod_int(axis, keepdim)
    negatives = (x < 0).cast(x.dtype).sum(axis, keepdim)
    sign = 1 - 2 * (negatives - 2 * (negatives * 0.5).floor())
    zeros = (x == 0).sum(axis, keepdim) > 0
    safe = (x == 0).detach().where(1.0, x)
    return zeros.where(0.0, sign * safe.abs().log().sum(axis, keepdim).exp())

  def _prod_int(self, axis, keepdim: bool) -> Tensor:
    axes = self._axes(axis, "prod")
    x = self
    for a in sorted(axes, reverse=True):
      pieces = x.split(1, a)
      acc = pieces[0]
      for p in pieces[1:]: acc = acc * p
      x = acc
    if keepdim: return x
    return x.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

  def logsumexp(self, axis=None, keepdim: bool = False, dim=None) -> Tensor:
    if dim is not None: axis = dim
    x = self._float()
    axes = self._axes(axis, "logsumexp")
    if self.ndim and any(self.shape[a] == 0 for a in axes):
      # an empty sum: the result is log(0) = -inf, as in PyTorch, and there is no max to shift by
      peak = Tensor.zeros(tuple(1 if i in axes else s for i, s in enumerate(self.shape)), dtype=x.dtype, device=self.device)
    else:
      peak = x.max(axis, keepdim=True).detach()
      peak = (peak.abs() == math.inf).where(0.0, peak)
    out = (x - peak).exp().sum(axis, keepdim=True).log() + peak
    return out if keepdim else out._squeeze_axes(axes)

  def _squeeze_axes(self, axes: tuple[int, ...]) -> Tensor:
    return self.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

  def softmax(self, axis: int = -1, dtype=None, dim: int | None = None) -> Tensor:
    if dim is not None: axis = dim
    x = self.cast(dtype) if dtype is not None else self._float()
    shifted = x - x.max(axis, keepdim=True).detach()
    e = shifted.exp()
    # one reciprocal per row (computed by the sum's kernel) and a multiply per element, as PyTorch's CPU
    # softmax does: a vector division costs 10-16x a multiply
    return e * e.sum(axis, keepdim=True).reciprocal()

  def log_softmax(self, axis: int = -1, dtype=None, dim: int | None = None) -> Tensor:
    if dim is not None: axis = dim
    x = self.cast(dtype) if dtype is not None else self._float()
    shifted = x - x.max(axis, keepdim=True).detach()
    return shifted - shifted.exp().sum(axis, keepdim=True).log()

  def argmax(self, axis: int | None = None, keepdim: bool = False, dim: int | None = None) -> Tensor:
    """Index of the first maximum (as PyTorch), found with a max over reversed positions."""
    if dim is not None: axis = dim
    self._check_not_empty(axis, "argmax")
    if axis is None: return self.flatten().argmax(0)
    axis = self._axis(axis, "argmax")
    if self.ndim == 0: return Tensor.zeros((), dtype=dtypes.int64, device=self.device)
    countdown = Tensor.arange(self.shape[axis], 0, -1, dtype=dtypes.int64, device=self.device, requires_grad=False)
    return F.ArgMax.apply(self.detach(), countdown, axis=axis, keepdim=keepdim)

  def argmin(self, axis: int | None = None, keepdim: bool = False, dim: int | None = None) -> Tensor:
    if dim is not None: axis = dim
    self._check_not_empty(axis, "argmin")
    if self.dtype == dtypes.bool: return self.logical_not().argmax(axis, keepdim)
    return (-self if not self.dtype.is_unsigned else (np.iinfo(self.dtype.np).max - self)).argmax(axis, keepdim)

  def cumsum(self, axis: int = 0, dim: int | None = None) -> Tensor:
    if dim is not None: axis = dim
    axis = self._axis(axis, "cumsum")
    x = self.transpose(axis, -1) if self.ndim else self.reshape(1)
    out = x._running_sum()
    if not self.ndim: return out.reshape(())
    return out.transpose(axis, -1)

  def _running_sum(self) -> Tensor:
    """cumsum along the last axis. Each output j sums inputs i <= j: a lower-triangular mask times the
    broadcast row, reduced, n*n terms per row. A row longer than CUMSUM_BLOCK is cut into blocks of
    that many, each summed within by the triangle, and every block adds the running total of the
    blocks before it (a running sum of the block totals, by the same method): n*B + (n/B)^2 terms
    (64 rows of 4096: 66 -> 2.4 ms on 2 threads)."""
    n = self.shape[-1]
    if n <= CUMSUM_BLOCK:
      lower = Tensor.arange(n, device=self.device).unsqueeze(1) >= Tensor.arange(n, device=self.device).unsqueeze(0)
      return lower.where(self.unsqueeze(-2), 0).sum(-1)
    blocks = -(-n // CUMSUM_BLOCK)
    padded = self.pad(((0, 0),) * (self.ndim - 1) + ((0, blocks * CUMSUM_BLOCK - n),))
    parts = padded.reshape(self.shape[:-1] + (blocks, CUMSUM_BLOCK))
    within = parts._running_sum()
    totals = within[..., -1]
    # the sum of the blocks before each block (0 before the first): the running totals shifted by one
    before = totals._running_sum()[..., :-1].pad(((0, 0),) * (self.ndim - 1) + ((1, 0),))
    return (within + before.unsqueeze(-1)).reshape(self.shape[:-1] + (blocks * CUMSUM_BLOCK,))[..., :n]

  def _triangle_mask(self, diagonal: int, lower: bool) -> Tensor:
    rows, cols = self.shape[-2], self.shape[-1]
    r = Tensor.arange(rows, device=self.device).unsqueeze(1) + diagonal
    c = Tensor.arange(cols, device=self.device).unsqueeze(0)
    return r >= c if lower else r <= c
  # cast back: where(self, 0) promotes a bool tensor to int64 (0 is an int), PyTorch keeps the dtype
  def tril(self, diagonal: int = 0) -> Tensor: return self._triangle_mask(diagonal, True).where(self, 0).cast(self.dtype)
  def triu(self, diagonal: int = 0) -> Tensor: return self._triangle_mask(diagonal, False).where(self, 0).cast(self.dtype)

  def any(self, axis=None, keepdim: bool = False, dim=None) -> Tensor:
    return self.bool().sum(axis if dim is None else dim, keepdim) > 0
  def all(self, axis=None, keepdim: bool = False, dim=None) -> Tensor:
    return self.bool().logical_not().any(axis if dim is None else dim, keepdim).logical_not()
  def amax(self, dim=None, keepdim: bool = False) -> Tensor: return self.max(dim, keepdim)
  def amin(self, dim=None, keepdim: bool = False) -> Tensor: return self.min(dim, keepdim)

  # ---- matmul family ----
  def dot(self, w: Tensor) -> Tensor:
    """Matrix product with PyTorch's matmul rules for 1-D and batched inputs."""
    x = self
    if not isinstance(w, Tensor): raise TypeError(f"matmul: expected a Tensor, got {type(w).__name__}")
    x_shape, w_shape = x.shape, w.shape
    if not x_shape or not w_shape: raise ValueError(f"matmul: both arguments need at least 1 dim, got shapes {_shape_str(x_shape)} and {_shape_str(w_shape)}")
    k_x, k_w = x_shape[-1], w_shape[-2] if len(w_shape) > 1 else w_shape[0]
    if k_x != k_w:
      raise ValueError(f"matmul: shapes {_shape_str(x_shape)} and {_shape_str(w_shape)} can't be multiplied ({k_x} != {k_w}), dtypes {x.dtype} and {w.dtype}")
    x_vec, w_vec = len(x_shape) == 1, len(w_shape) == 1
    if x_vec: x = x.unsqueeze(0)
    if w_vec: w = w.unsqueeze(1)
    dtype = promote_types(x.dtype, w.dtype)
    if dtype == dtypes.bool:    # as in PyTorch: a product of booleans has no sum of its own dtype
      raise TypeError(f"matmul: bool tensors can't be multiplied, shapes {_shape_str(x_shape)} and {_shape_str(w_shape)}, dtypes {self.dtype} and {w.dtype}; cast one to an int or float dtype")
    x, w = x.cast(dtype), w.cast(dtype)
    x_shape, w_shape = x.shape, w.shape
    batch = _broadcast_shape(x_shape[:-2], w_shape[:-2], "matmul") if len(x_shape) > 2 or len(w_shape) > 2 else ()
    n, k, m = x_shape[-2], x_shape[-1], w_shape[-1]
    if len(w_shape) == 2 and len(x_shape) > 2:
      # (..., n, k) @ (k, m) as one (rows, k) @ (k, m): the weight's gradient is then one sum over every row,
      # where a weight broadcast over the batch axes is summed per batch index and then over those
      out = F.Matmul.apply(x.reshape(-1, k), w).reshape(x_shape[:-1] + (m,))
    else:
      # the batch axes broadcast here, so their gradient sums come from Expand's backward
      out = F.Matmul.apply(x._broadcast_to(batch + (n, k)), w._broadcast_to(batch + (k, m)))
    if x_vec: out = out.squeeze(-2)
    if w_vec: out = out.squeeze(-1)
    return out
  matmul = dot

  def linear(self, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """tinygrad's method: x @ weight + bias with weight (in, out), or x * weight for a 1-d weight, so tinygrad code
    computes what it meant. PyTorch's layout (weight (out, in)) is nn.functional.linear, which nn.Linear uses."""
    out = self * weight if weight.ndim == 1 else self.dot(weight)
    return out + bias if bias is not None else out

  @staticmethod
  def einsum(formula: str, *operands) -> Tensor:
    from tinychad.nn.functional import einsum
    return einsum(formula, *operands)

  # ---- nn functions (in nn/functional.py, exposed as methods as tinygrad does) ----
  def conv2d(self, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1, groups: int = 1) -> Tensor:
    from tinychad.nn.functional import conv
    return conv(self, weight, bias, stride, padding, dilation, groups, 2, "conv2d")
  def conv1d(self, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1, groups: int = 1) -> Tensor:
    from tinychad.nn.functional import conv
    return conv(self, weight, bias, stride, padding, dilation, groups, 1, "conv1d")
  def conv_transpose2d(self, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, output_padding=0, groups: int = 1, dilation=1) -> Tensor:
    from tinychad.nn.functional import conv_transpose
    return conv_transpose(self, weight, bias, stride, padding, output_padding, groups, dilation, 2)
  def max_pool2d(self, kernel_size=2, stride=None, padding=0, dilation=1, ceil_mode: bool = False, return_indices: bool = False):
    from tinychad.nn.functional import max_pool
    return max_pool(self, kernel_size, stride, padding, dilation, 2, ceil_mode, return_indices)
  def avg_pool2d(self, kernel_size=2, stride=None, padding=0, count_include_pad: bool = True, ceil_mode: bool = False) -> Tensor:
    from tinychad.nn.functional import avg_pool
    return avg_pool(self, kernel_size, stride, padding, count_include_pad, 2, ceil_mode)

  def dropout(self, p: float = 0.5, training: bool | None = None) -> Tensor:
    """Zero each element with probability p, scale the rest by 1/(1-p). training=None follows the global
    Tensor.training (tinygrad's switch); nn.Dropout passes its module's own flag."""
    if not 0 <= p <= 1: raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if not (Tensor.training if training is None else training) or p == 0: return self
    if p == 1: return self * 0
    keep = Tensor.rand(self.shape, device=self.device) >= p
    return keep.where(self, 0) * (1 / (1 - p))

  def layernorm(self, axis=-1, eps: float = 1e-5) -> Tensor:
    """(x - mean) / sqrt(var + eps) over axis: one autograd op (function.LayerNorm)."""
    return F.LayerNorm.apply(self._float(), axes=self._axes(axis, "layernorm"), eps=eps, affine=(False, False))

  def batchnorm(self, weight: Tensor | None, bias: Tensor | None, mean: Tensor, invstd: Tensor) -> Tensor:
    """Normalise over dim 1 (channels) with given statistics: (x - mean) * invstd * weight + bias."""
    shape = (1, -1) + (1,) * (self.ndim - 2)
    x = (self - mean.reshape(shape)) * invstd.reshape(shape)
    if weight is not None: x = x * weight.reshape(shape)
    return x + bias.reshape(shape) if bias is not None else x

  def scaled_dot_product_attention(self, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                   dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                   enable_gqa: bool = False, window: int | None = None) -> Tensor:
    from tinychad.nn.functional import scaled_dot_product_attention
    return scaled_dot_product_attention(self, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, window)

  # ---- more of PyTorch's and tinygrad's ops (issue 23): compositions of the ops above ----
  def clone(self) -> Tensor:
    """A copy in a buffer of its own (a copy kernel), so that writes to self (assign, a TinyJit replay) leave it be."""
    return F.Clone.apply(self)
  def outer(self, other: Tensor) -> Tensor:
    if self.ndim != 1 or other.ndim != 1:
      raise ValueError(f"outer: expected two 1-d tensors, got {_shape_str(self.shape)} and {_shape_str(other.shape)}")
    return self.reshape(-1, 1) * other.reshape(1, -1)
  def logsigmoid(self) -> Tensor:
    """min(x, 0) - log1p(exp(-|x|)): no overflow either way, and 1/2 the gradient at 0 from each term's split."""
    x = self._float()
    return x.minimum(0) - (-x.abs()).exp().log1p()
  def softsign(self) -> Tensor: return self._float() / (1 + self._float().abs())
  def atan(self) -> Tensor:
    """|x| > 1 is reflected, atan(x) = sign(x) pi/2 - atan(1/x), then the argument halved twice (atan(t) =
    2 atan(t / (1 + sqrt(1 + t^2)))) to |t| <= tan(pi/16) ~ 0.2, where its odd series to t^15 is within 3e-12.
    1/x reads 1 where |x| <= 1, so the branch not taken has no infinite gradient at 0."""
    x = self._float()
    outside = (x.abs() > 1).detach()
    t = outside.where(1 / outside.where(x, 1), x)
    for _ in range(2): t = t / (1 + (1 + t * t).sqrt())
    t2, series = t * t, 0.0
    for k in range(15, 0, -2): series = series * t2 + (1 if k % 4 == 1 else -1) / k
    inner = t * series * 4
    return outside.where(x.sign() * (math.pi / 2) - inner, inner)
  def asin(self) -> Tensor:
    """atan(x / sqrt((1 - x)(1 + x))): the factored form keeps its precision near |x| = 1; |x| > 1 is NaN."""
    x = self._float()
    return (x / ((1 - x) * (1 + x)).sqrt()).atan()
  def acos(self) -> Tensor:
    """2 atan(sqrt((1 - x) / (1 + x))): accurate near x = 1, where pi/2 - asin(x) would cancel."""
    x = self._float()
    return ((1 - x) / (1 + x)).sqrt().atan() * 2
  def atan2(self, other) -> Tensor:
    """The angle of the point (other, self): atan(self / other), moved by +-pi when other < 0; +-pi/2 (0 at the
    origin) when other is 0. The gradient is atan's there, 0 on the other == 0 line."""
    y, x = self._broadcasted(other, "atan2")
    y, x = y._float(), x._float()
    zero = (x == 0).detach()
    angle = (y / zero.where(1, x)).atan()
    pi = (y < 0).detach().where(-math.pi, math.pi)
    angle = (x < 0).detach().where(angle + pi, angle)
    return zero.where(y.sign() * (math.pi / 2), angle)
  def isnan(self) -> Tensor: return self != self
  def isinf(self) -> Tensor:
    return (self.abs() == math.inf) if self.dtype.is_float else Tensor.zeros(self.shape, dtype=dtypes.bool, device=self.device)
  def isfinite(self) -> Tensor: return (self.isnan() | self.isinf()).logical_not()
  def isposinf(self) -> Tensor: return self.isinf() & (self > 0)
  def isneginf(self) -> Tensor: return self.isinf() & (self < 0)
  def nan_to_num(self, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Tensor:
    """NaN -> nan, inf -> posinf, -inf -> neginf (defaults: the dtype's largest and lowest finite values)."""
    if not self.dtype.is_float: return self
    info = np.finfo(self.dtype.np)
    x = self.isnan().where(nan, self)
    x = self.isposinf().where(float(info.max) if posinf is None else posinf, x)
    return self.isneginf().where(float(info.min) if neginf is None else neginf, x).cast(self.dtype)
  def frac(self) -> Tensor: return self - self.trunc()
  def deg2rad(self) -> Tensor: return self._float() * (math.pi / 180)
  def rad2deg(self) -> Tensor: return self._float() * (180 / math.pi)
  def logaddexp(self, other) -> Tensor:
    a, b = self._broadcasted(other, "logaddexp")
    a, b = a._float(), b._float()
    top = a.maximum(b)
    # both -inf: top is -inf and a - top NaN; the sum of nothing, -inf, is what is meant
    both_neg_inf = ((a == -math.inf) & (b == -math.inf)).detach()
    spread = both_neg_inf.where(0, (a - b).abs())
    return top + (-spread).exp().log1p()
  def hypot(self, other) -> Tensor:
    a, b = self._broadcasted(other, "hypot")
    return (a._float().square() + b._float().square()).sqrt()
  def isclose(self, other, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> Tensor:
    a, b = self._broadcasted(other, "isclose")
    close = (a == b) | ((a - b).abs() <= atol + rtol * b.abs())
    return (close | (a.isnan() & b.isnan())) if equal_nan else close
  def allclose(self, other, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> bool:
    return bool(self.isclose(other, rtol, atol, equal_nan).all().item())
  def bitwise_and(self, other) -> Tensor: return self & other
  def bitwise_or(self, other) -> Tensor: return self | other
  def bitwise_xor(self, other) -> Tensor: return self ^ other
  def bitwise_not(self) -> Tensor: return ~self
  def lshift(self, bits: int) -> Tensor:
    if self.dtype.is_float or bits < 0: raise TypeError(f"lshift: needs an integer tensor and bits >= 0, got {self.dtype} and {bits}")
    return self * (1 << bits)
  def rshift(self, bits: int) -> Tensor:
    """Arithmetic shift: floor division by 2**bits, as >> on a signed integer."""
    if self.dtype.is_float or bits < 0: raise TypeError(f"rshift: needs an integer tensor and bits >= 0, got {self.dtype} and {bits}")
    return self // (1 << bits)
  def __lshift__(self, bits: int) -> Tensor: return self.lshift(bits)
  def __rshift__(self, bits: int) -> Tensor: return self.rshift(bits)

  def roll(self, shifts, dims=None) -> Tensor:
    """torch.roll: elements shifted along dims, wrapping around; with dims=None the flattened tensor is rolled."""
    if dims is None: return self.flatten().roll(shifts, 0).reshape(self.shape)
    shifts, dims = argfix(shifts), argfix(dims)
    if len(shifts) != len(dims): raise ValueError(f"roll: {len(shifts)} shifts for {len(dims)} dims")
    x = self
    for shift, dim in zip(shifts, dims):
      dim = x._axis(dim, "roll")
      size = x.shape[dim] if x.ndim else 1
      if size == 0 or shift % size == 0: continue
      cut = size - shift % size
      x = x._slice_dim(dim, cut, size).cat(x._slice_dim(dim, 0, cut), dim=dim)
    return x
  def repeat_interleave(self, repeats, dim: int | None = None) -> Tensor:
    """Each element repeated `repeats` times along dim (the flattened tensor with dim=None); repeats is an int or one
    count per element (a list or a tensor, read on the host: the output's size depends on them)."""
    x = self.flatten() if dim is None else self
    dim = 0 if dim is None else x._axis(dim, "repeat_interleave")
    size = x.shape[dim] if x.ndim else 1
    counts = np.asarray(repeats.numpy() if isinstance(repeats, Tensor) else repeats).reshape(-1)
    if counts.dtype.kind not in "iu": raise TypeError(f"repeat_interleave: repeats must be integers, got {counts.dtype}")
    if counts.size == 1: counts = np.full(size, counts[0])
    if counts.size != size or (counts < 0).any():
      raise ValueError(f"repeat_interleave: repeats {counts.tolist()} must be one count >= 0 per element of dim {dim} "
                       f"(tensor of shape {_shape_str(self.shape)})")
    if x.ndim == 0: x = x.reshape(1)
    if counts.size and (counts == counts[0]).all():
      moved = x.unsqueeze(dim + 1)
      return moved.expand(moved.shape[:dim + 1] + (int(counts[0]),) + moved.shape[dim + 2:]).flatten(dim, dim + 1)
    index = Tensor(np.repeat(np.arange(size), counts), device=x.device)
    return x[(slice(None),) * dim + (index,)]
  def unfold(self, dimension: int, size: int, step: int) -> Tensor:
    """Tensor.unfold: every window of `size` elements along `dimension`, `step` apart, as a new last dim (a view)."""
    if self.ndim == 0: return self.reshape(1).unfold(0, size, step).reshape(size)
    dim = self._axis(dimension, "unfold")
    if size <= 0 or step <= 0 or size > self.shape[dim]:
      raise ValueError(f"unfold: size {size} and step {step} must be positive, size at most {self.shape[dim]} "
                       f"(dim {dim} of shape {_shape_str(self.shape)})")
    windows = F.pool_windows(self.transpose(dim, -1), (size,), (step,), (1,))
    return windows.transpose(dim, -2)
  def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The diagonal of dims dim1, dim2 as the last dim (offset > 0: above the main diagonal)."""
    d1, d2 = self._axis(dim1, "diagonal"), self._axis(dim2, "diagonal")
    if d1 == d2: raise ValueError(f"diagonal: dim1 and dim2 are both {d1}")
    x = self.permute([d for d in range(self.ndim) if d not in (d1, d2)] + [d1, d2])
    rows, cols = x.shape[-2:]
    start_r, start_c = max(-offset, 0), max(offset, 0)
    n = max(0, min(rows - start_r, cols - start_c))
    x = x[..., start_r:start_r + n, start_c:start_c + n]
    if n == 0: return x.reshape(x.shape[:-2] + (0,))
    lead = x.shape[:-2]
    flat = x.reshape(lead + (n * n,)).pad(((0, 0),) * len(lead) + ((0, n),)).reshape(lead + (n, n + 1))
    return flat[..., 0]
  def diag(self, diagonal: int = 0) -> Tensor:
    """A 1-d tensor -> the square matrix with it on the given diagonal; a 2-d tensor -> that diagonal."""
    if self.ndim == 2: return self.diagonal(diagonal)
    if self.ndim != 1: raise ValueError(f"diag: expected a 1-d or 2-d tensor, got shape {_shape_str(self.shape)}")
    n, k = self.shape[0], abs(diagonal)
    eye = Tensor.eye(n, dtype=dtypes.bool, device=self.device)
    square = eye.where(self.unsqueeze(0), 0).cast(self.dtype)
    return square.pad(((0, k), (k, 0)) if diagonal > 0 else ((k, 0), (0, k)))
  def trace(self) -> Tensor:
    if self.ndim != 2: raise ValueError(f"trace: expected a 2-d tensor, got shape {_shape_str(self.shape)}")
    return self.diagonal().sum()
  @staticmethod
  def meshgrid(*tensors: Tensor, indexing: str = "ij") -> list[Tensor]:
    """torch.meshgrid: one grid per 1-d tensor, each varying along its own dim ("xy": the first two dims swapped)."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)): tensors = tuple(tensors[0])
    if indexing not in ("ij", "xy"): raise ValueError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    if any(t.ndim > 1 for t in tensors): raise ValueError(f"meshgrid: expected 0-d or 1-d tensors, got {[_shape_str(t.shape) for t in tensors]}")
    flat = [t.reshape(-1) for t in tensors]
    shape = tuple(t.shape[0] for t in flat)
    grids = [t.reshape(tuple(-1 if i == k else 1 for i in range(len(flat)))).expand(shape) for k, t in enumerate(flat)]
    return [g.transpose(0, 1) for g in grids] if indexing == "xy" and len(grids) >= 2 else grids
  def cummax(self, dim: int = 0) -> ValuesIndices:
    """torch.cummax: the running maximum and the index of the last element equal to it (n x n terms per row); the
    values are gathered at those indices, so each gets its element's gradient, as in PyTorch."""
    return self._running_extreme(dim, "cummax", True)
  def cummin(self, dim: int = 0) -> ValuesIndices: return self._running_extreme(dim, "cummin", False)
  def _running_extreme(self, dim: int, op: str, largest: bool) -> ValuesIndices:
    if self.ndim == 0: return ValuesIndices(self, Tensor.zeros((), dtype=dtypes.int64, device=self.device))
    dim = self._axis(dim, op)
    x = self.transpose(dim, -1)
    pos = Tensor.arange(x.shape[-1], device=self.device)
    earlier = pos.unsqueeze(1) >= pos.unsqueeze(0)   # [i, j]: j <= i
    if self.dtype.is_float: fill = -math.inf if largest else math.inf
    elif self.dtype == dtypes.bool: fill = not largest
    else: fill = int(np.iinfo(self.dtype.np).min if largest else np.iinfo(self.dtype.np).max)
    rows = earlier.where(x.unsqueeze(-2), fill).cast(self.dtype)
    best = rows.max(-1) if largest else rows.min(-1)
    index = (earlier & (x.unsqueeze(-2) == best.unsqueeze(-1))).where(pos, -1).max(-1).cast(dtypes.int64)
    return ValuesIndices(x.gather(-1, index).transpose(dim, -1), index.transpose(dim, -1))
  def cumprod(self, dim: int) -> Tensor:
    """The running product: each output the product of the elements up to it (n x n terms per row)."""
    dim = self._axis(dim, "cumprod")
    if self.ndim == 0: return self
    x = self.transpose(dim, -1)
    pos = Tensor.arange(x.shape[-1], device=self.device)
    earlier = pos.unsqueeze(1) >= pos.unsqueeze(0)
    return earlier.where(x.unsqueeze(-2), 1).cast(self.dtype).prod(-1).transpose(dim, -1)
  def logcumsumexp(self, dim: int) -> Tensor:
    """log(cumsum(exp(x))): a logsumexp over each prefix (n x n terms per row), exact where early terms are tiny."""
    dim = self._axis(dim, "logcumsumexp")
    if self.ndim == 0: return self._float()
    x = self._float().transpose(dim, -1)
    pos = Tensor.arange(x.shape[-1], device=self.device)
    earlier = pos.unsqueeze(1) >= pos.unsqueeze(0)
    return earlier.where(x.unsqueeze(-2), -math.inf).logsumexp(-1).transpose(dim, -1)

  # PyTorch's small conveniences
  def t(self) -> Tensor:
    if self.ndim > 2: raise ValueError(f"t: expects a tensor of at most 2 dims, got shape {_shape_str(self.shape)}")
    return self.transpose(0, 1) if self.ndim == 2 else self
  def swapaxes(self, axis0: int, axis1: int) -> Tensor: return self.transpose(axis0, axis1)
  def movedim(self, source, destination) -> Tensor:
    source, destination = self._axes(source, "movedim"), argfix(destination)
    destination = tuple(self._axis(d, "movedim") for d in destination)
    if len(source) != len(destination): raise ValueError(f"movedim: {len(source)} source dims for {len(destination)} destinations")
    rest = iter(d for d in range(self.ndim) if d not in source)
    placed = dict(zip(destination, source))
    return self.permute(tuple(placed[i] if i in placed else next(rest) for i in range(self.ndim)))
  moveaxis = movedim
  def expand_as(self, other: Tensor) -> Tensor: return self.expand(other.shape)
  def view_as(self, other: Tensor) -> Tensor: return self.reshape(other.shape)
  def type_as(self, other: Tensor) -> Tensor: return self.cast(other.dtype)
  def new_full(self, size, fill_value: Scalar, dtype=None) -> Tensor:
    return Tensor.full(argfix(size), fill_value, dtype=dtype or self.dtype, device=self.device)
  def new_zeros(self, *size, dtype=None) -> Tensor: return self.new_full(argfix(*size), 0, dtype)
  def new_ones(self, *size, dtype=None) -> Tensor: return self.new_full(argfix(*size), 1, dtype)
  def new_tensor(self, data, dtype=None) -> Tensor: return Tensor(data, device=self.device, dtype=dtype or self.dtype)
  @property
  def nbytes(self) -> int: return self.numel() * self.element_size()
  def is_floating_point(self) -> bool: return self.dtype.is_float
  def tile(self, *reps) -> Tensor:
    reps = argfix(*reps)
    return self.repeat((1,) * (self.ndim - len(reps)) + tuple(reps))
  def narrow(self, dim: int, start: int, length: int) -> Tensor:
    dim = self._axis(dim, "narrow")
    size = self.shape[dim]
    start = start + size if start < 0 else start
    if not (0 <= start and length >= 0 and start + length <= size):
      raise IndexError(f"narrow: start {start} and length {length} out of range for dim {dim} of shape {_shape_str(self.shape)}")
    return self._slice_dim(dim, start, start + length)
  def index_select(self, dim: int, index: Tensor) -> Tensor:
    dim = self._axis(dim, "index_select")
    if index.ndim > 1: raise ValueError(f"index_select: index must be 0-d or 1-d, got shape {_shape_str(index.shape)}")
    return self[(slice(None),) * dim + (index.reshape(-1),)]
  def _matrices(self, other: Tensor, ndim: int, op: str) -> None:
    if self.ndim != ndim or other.ndim not in ((1,) if op == "mv" else (ndim,)):
      raise ValueError(f"{op}: unexpected shapes {_shape_str(self.shape)} and {_shape_str(other.shape)}")
  def mm(self, other: Tensor) -> Tensor:
    self._matrices(other, 2, "mm")
    return self @ other
  def bmm(self, other: Tensor) -> Tensor:
    self._matrices(other, 3, "bmm")
    return self @ other
  def mv(self, other: Tensor) -> Tensor:
    self._matrices(other, 2, "mv")
    return self @ other
  def addmm(self, mat1: Tensor, mat2: Tensor, beta: float = 1, alpha: float = 1) -> Tensor:
    return beta * self + alpha * mat1.mm(mat2)
  def addcmul(self, tensor1: Tensor, tensor2: Tensor, value: float = 1) -> Tensor: return self + value * tensor1 * tensor2
  def addcdiv(self, tensor1: Tensor, tensor2: Tensor, value: float = 1) -> Tensor: return self + value * tensor1 / tensor2
  def norm(self, p=2, dim=None, keepdim: bool = False) -> Tensor:
    """torch.norm / torch.linalg.vector_norm: p = 2 ("fro"), 1, inf, -inf, 0 or any other positive number."""
    x = self._float().abs()
    if p in (2, "fro"): return x.square().sum(dim, keepdim).sqrt()
    if p == 1: return x.sum(dim, keepdim)
    if p == math.inf: return x.max(dim, keepdim) if dim is None else x.amax(dim, keepdim)
    if p == -math.inf: return x.min(dim, keepdim) if dim is None else x.amin(dim, keepdim)
    if p == 0: return (x != 0).cast(x.dtype).sum(dim, keepdim)
    if not isinstance(p, (int, float)) or p < 0: raise ValueError(f"norm: p must be a number >= 0, inf, -inf or 'fro', got {p!r}")
    return x.pow(p).sum(dim, keepdim).pow(1 / p)
  # in place, as PyTorch's trailing-underscore methods: the tensor takes the result (Tensor.assign)
  def zero_(self) -> Tensor: return self.assign(self.zeros_like())
  def fill_(self, value: Scalar) -> Tensor: return self.assign(self.full_like(value))
  def copy_(self, src: Tensor) -> Tensor: return self.assign(src.cast(self.dtype).expand(self.shape))
  def add_(self, other, alpha: float = 1) -> Tensor: return self.assign(self + (other if alpha == 1 else other * alpha))
  def sub_(self, other, alpha: float = 1) -> Tensor: return self.assign(self - (other if alpha == 1 else other * alpha))
  def mul_(self, other) -> Tensor: return self.assign(self * other)
  def div_(self, other) -> Tensor: return self.assign(self / other)
  def clamp_(self, min=None, max=None) -> Tensor: return self.assign(self.clip(min, max))
  def masked_fill_(self, mask: Tensor, value) -> Tensor: return self.assign(self.masked_fill(mask, value))

  def absolute(self) -> Tensor: return self.abs()
  def negative(self) -> Tensor: return self.neg()
  def fix(self) -> Tensor: return self.trunc()
  def sgn(self) -> Tensor: return self.sign()
  def divide(self, other, rounding_mode: str | None = None) -> Tensor: return self.div(other, rounding_mode=rounding_mode)
  true_divide = divide
  def clamp_min(self, min) -> Tensor: return self.clip(min, None)
  def clamp_max(self, max) -> Tensor: return self.clip(None, max)
  def signbit(self) -> Tensor:
    """True for negative numbers, -0.0 included (its sign bit: 1 / -0.0 is -inf)."""
    if not self.dtype.is_float: return self < 0
    return (self < 0) | ((self == 0) & ((1 / self) < 0))
  def copysign(self, other) -> Tensor:
    x, y = self._broadcasted(other, "copysign")
    # y's gradient is 0, but it has one, as in PyTorch
    return y.signbit().detach().where(-x._float().abs(), x._float().abs()) + y._float()._graph_zeros()
  def fmod(self, other) -> Tensor:
    """C's fmod: the remainder with the dividend's sign (% follows Python's, the divisor's sign)."""
    x, y = self._broadcasted(other, "fmod")
    return x - (x.div(y, rounding_mode="trunc") if not x.dtype.is_float else (x / y).trunc().detach()) * y
  def xlogy(self, other) -> Tensor:
    """x * log(y), 0 where x is 0 (even for y = 0), NaN where y is."""
    x, y = self._broadcasted(other, "xlogy")
    x, y = x._float(), y._float()
    zero = ((x == 0) & y.isnan().logical_not()).detach()
    return zero.where(0, x * zero.where(1, y).log())
  def logit(self, eps: float | None = None) -> Tensor:
    x = self._float() if eps is None else self._float().clip(eps, 1 - eps)
    return (x / (1 - x)).log()
  def heaviside(self, values) -> Tensor: return (self == 0).where(values, (self > 0).cast(self.dtype)).cast(self.dtype)
  def cross(self, other: Tensor, dim: int = -1) -> Tensor:
    """The cross product of 3-vectors along dim."""
    dim = self._axis(dim, "cross")
    if self.shape != other.shape or self.shape[dim] != 3:
      raise ValueError(f"cross: need two tensors of one shape with size 3 in dim {dim}, got {_shape_str(self.shape)} and {_shape_str(other.shape)}")
    a, b = self.split(1, dim), other.split(1, dim)
    return Tensor.cat(a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0], dim=dim)
  def diff(self, n: int = 1, dim: int = -1) -> Tensor:
    dim = self._axis(dim, "diff")
    x = self
    for _ in range(n):
      size = x.shape[dim]
      x = x._slice_dim(dim, 1, max(size, 1)) - x._slice_dim(dim, 0, max(size - 1, 0))
    return x
  def count_nonzero(self, dim=None) -> Tensor: return (self != 0).sum(dim)
  def nansum(self, dim=None, keepdim: bool = False) -> Tensor: return self.isnan().where(0, self).cast(self.dtype).sum(dim, keepdim)
  def nanmean(self, dim=None, keepdim: bool = False) -> Tensor:
    return self.nansum(dim, keepdim) / self.isnan().logical_not().sum(dim, keepdim)
  def var_mean(self, dim=None, keepdim: bool = False, correction: int = 1) -> tuple[Tensor, Tensor]:
    return self.var(dim, keepdim, correction), self.mean(dim, keepdim)
  def std_mean(self, dim=None, keepdim: bool = False, correction: int = 1) -> tuple[Tensor, Tensor]:
    return self.std(dim, keepdim, correction), self.mean(dim, keepdim)
  def softmin(self, axis: int = -1, dim: int | None = None) -> Tensor: return (-self).softmax(axis if dim is None else dim)
  def fliplr(self) -> Tensor: return self.flip(1)
  def flipud(self) -> Tensor: return self.flip(0)
  def rot90(self, k: int = 1, dims=(0, 1)) -> Tensor:
    d0, d1 = self._axis(dims[0], "rot90"), self._axis(dims[1], "rot90")
    if d0 == d1: raise ValueError(f"rot90: dims {dims} must differ")
    k %= 4
    if k == 0: return self
    if k == 2: return self.flip(d0, d1)
    return self.flip(d1).transpose(d0, d1) if k == 1 else self.transpose(d0, d1).flip(d1)
  def reshape_as(self, other: Tensor) -> Tensor: return self.reshape(other.shape)
  def unbind(self, dim: int = 0) -> tuple[Tensor, ...]:
    dim = self._axis(dim, "unbind")
    return tuple(self._slice_dim(dim, i, i + 1).squeeze(dim) for i in range(self.shape[dim]))
  def select(self, dim: int, index: int) -> Tensor:
    dim = self._axis(dim, "select")
    if not -self.shape[dim] <= index < self.shape[dim]:
      raise IndexError(f"select: index {index} out of range for dim {dim} of shape {_shape_str(self.shape)}")
    return self[(slice(None),) * dim + (index,)]
  def take_along_dim(self, indices: Tensor, dim: int) -> Tensor: return self.gather(dim, indices)
  def scatter_add(self, dim: int, index: Tensor, src: Tensor) -> Tensor: return self.scatter(dim, index, src, reduce="add")
  def new_empty(self, *size, dtype=None) -> Tensor: return Tensor.empty(*argfix(*size), dtype=dtype or self.dtype, device=self.device)
  def short(self) -> Tensor: return self.cast(dtypes.int16)
  def byte(self) -> Tensor: return self.cast(dtypes.uint8)
  def char(self) -> Tensor: return self.cast(dtypes.int8)
  def interpolate(self, size=None, scale_factor=None, mode: str = "nearest", align_corners: bool | None = None) -> Tensor:
    from tinychad.nn.functional import interpolate
    return interpolate(self, size, scale_factor, mode, align_corners)
  # in-place initialisers (torch.nn.init's building blocks)
  def uniform_(self, low: float = 0.0, high: float = 1.0) -> Tensor:
    return self.assign(Tensor.uniform(*self.shape, low=low, high=high, dtype=self.dtype, device=self.device))
  def normal_(self, mean: float = 0.0, std: float = 1.0) -> Tensor:
    return self.assign(Tensor.normal(*self.shape, mean=mean, std=std, dtype=self.dtype, device=self.device))
  def tril_(self, diagonal: int = 0) -> Tensor: return self.assign(self.tril(diagonal))
  def triu_(self, diagonal: int = 0) -> Tensor: return self.assign(self.triu(diagonal))
  def exp_(self) -> Tensor: return self.assign(self.exp())
  @staticmethod
  def randperm(n: int, dtype=None, device=None) -> Tensor:
    if n < 0: raise ValueError(f"randperm: n must not be negative, got {n}")
    return Tensor(Tensor._rng.permutation(n), dtype=dtype or dtypes.int64, device=device)
  # data-dependent shapes: the mask or values are read on the host (a realize), as the output's size depends on them
  def nonzero(self, as_tuple: bool = False):
    """The indices of the nonzero elements, one row each (torch.nonzero), or one index tensor per dim (as_tuple)."""
    found = np.nonzero(self.numpy().reshape(self.shape))
    if as_tuple: return tuple(Tensor(i.astype(np.int64), device=self.device) for i in found)
    return Tensor(np.stack(found, 1).astype(np.int64).reshape(-1, self.ndim), device=self.device)
  argwhere = nonzero
  def masked_select(self, mask: Tensor) -> Tensor:
    """The elements where mask is True, flattened; a gather at host-found positions, so the gradient flows back."""
    mask = mask if isinstance(mask, Tensor) else Tensor(mask)
    if mask.dtype != dtypes.bool: raise TypeError(f"masked_select: mask must be bool, got {mask.dtype}")
    shape = _broadcast_shape(self.shape, mask.shape, "masked_select")
    positions = np.flatnonzero(mask.expand(shape).numpy())
    return self.expand(shape).flatten()[Tensor(positions.astype(np.int64), device=self.device)]
  def unique(self, sorted: bool = True, return_inverse: bool = False, return_counts: bool = False, dim: int | None = None):
    """torch.unique of the flattened tensor (dim=None), always sorted; no gradient (it picks values)."""
    if dim is not None: raise NotImplementedError("unique: dim= is not supported; unique of the flattened tensor only")
    values, inverse, counts = np.unique(self.numpy().reshape(-1), return_inverse=True, return_counts=True)
    out = [Tensor(values, dtype=self.dtype, device=self.device)]
    if return_inverse: out.append(Tensor(inverse.reshape(self.shape).astype(np.int64), device=self.device))
    if return_counts: out.append(Tensor(counts.astype(np.int64), device=self.device))
    return out[0] if len(out) == 1 else tuple(out)

  # tinygrad's: initialisers, pad/shrink to a shape, in-place replacement
  @staticmethod
  def kaiming_normal(*shape, a: float = 0.01, dtype=None, device=None, requires_grad=None) -> Tensor:
    """PyTorch's kaiming_normal_ with leaky_relu gain: std = gain / sqrt(fan_in)."""
    shape = argfix(*shape)
    std = math.sqrt(2.0 / (1 + a ** 2) / prod(shape[1:]))
    return Tensor.normal(*shape, mean=0.0, std=std, dtype=dtype, device=device, requires_grad=requires_grad)
  @staticmethod
  def scaled_uniform(*shape, dtype=None, device=None, requires_grad=None) -> Tensor:
    """Uniform in [-1, 1) / sqrt(numel)."""
    shape = argfix(*shape)
    bound = prod(shape) ** -0.5
    return Tensor.uniform(*shape, low=-bound, high=bound, dtype=dtype, device=device, requires_grad=requires_grad)
  def pad_to(self, *shape, value: float = 0.0) -> Tensor:
    """Pad at the end of each dim up to `shape` (None keeps a dim)."""
    shape = argfix(*shape)
    if len(shape) != self.ndim or any(n is not None and n < s for n, s in zip(shape, self.shape)):
      raise ValueError(f"pad_to: can't pad shape {_shape_str(self.shape)} to {shape}")
    return self.pad(tuple((0, 0 if n is None else n - s) for n, s in zip(shape, self.shape)), value=value)
  def shrink_to(self, *shape) -> Tensor:
    """Keep the start of each dim, `shape` long (None keeps a dim)."""
    shape = argfix(*shape)
    if len(shape) != self.ndim: raise ValueError(f"shrink_to: {len(shape)} sizes for shape {_shape_str(self.shape)}")
    return self.shrink(tuple(None if n is None else (0, n) for n in shape))
  def normalize(self, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    return self / self.norm(p, dim, keepdim=True).maximum(eps)
  def const_like(self, value: Scalar, dtype=None) -> Tensor: return self.full_like(value, dtype=dtype)
  def replace(self, x: Tensor) -> Tensor:
    """This tensor takes x's data (dtype and device too; the shape must match), outside autograd."""
    if x.shape != self.shape: raise ValueError(f"replace: shape {_shape_str(x.shape)} does not match {_shape_str(self.shape)}")
    self.lazydata = x.lazydata
    return self
  def to_(self, device: str) -> Tensor:
    if self.grad is not None: self.grad.replace(self.grad.to(device))
    return self.replace(self.to(device))

  # pooling with PyTorch's 1-d names and tinygrad's loss names (nn/functional.py)
  def max_pool1d(self, kernel_size=2, stride=None, padding=0, dilation=1, ceil_mode: bool = False, return_indices: bool = False):
    from tinychad.nn.functional import max_pool
    return max_pool(self, kernel_size, stride, padding, dilation, 1, ceil_mode, return_indices)
  def avg_pool1d(self, kernel_size=2, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
    from tinychad.nn.functional import avg_pool
    return avg_pool(self, kernel_size, stride, padding, count_include_pad, 1, ceil_mode)
  def sparse_categorical_crossentropy(self, Y: Tensor, ignore_index: int = -1, label_smoothing: float = 0.0,
                                      reduction: str = "mean") -> Tensor:
    from tinychad.nn.functional import sparse_categorical_crossentropy
    return sparse_categorical_crossentropy(self, Y, ignore_index, label_smoothing, reduction)
  def binary_crossentropy(self, Y: Tensor, reduction: str = "mean") -> Tensor: return self.binary_cross_entropy(Y, reduction)
  def binary_crossentropy_logits(self, Y: Tensor, reduction: str = "mean", pos_weight: Tensor | None = None) -> Tensor:
    return self.binary_cross_entropy_with_logits(Y, reduction, pos_weight)

  # ---- losses ----
  def cross_entropy(self, target: Tensor, reduction: str = "mean", label_smoothing: float = 0.0, ignore_index: int = -100) -> Tensor:
    from tinychad.nn.functional import cross_entropy
    return cross_entropy(self, target, reduction, label_smoothing, ignore_index)
  def nll_loss(self, target: Tensor, reduction: str = "mean", ignore_index: int = -100, weight: Tensor | None = None) -> Tensor:
    from tinychad.nn.functional import nll_loss
    return nll_loss(self, target, reduction, ignore_index, weight)
  def binary_cross_entropy(self, target: Tensor, reduction: str = "mean") -> Tensor:
    from tinychad.nn.functional import binary_cross_entropy
    return binary_cross_entropy(self, target, reduction)
  def binary_cross_entropy_with_logits(self, target: Tensor, reduction: str = "mean", pos_weight: Tensor | None = None) -> Tensor:
    from tinychad.nn.functional import binary_cross_entropy_with_logits
    return binary_cross_entropy_with_logits(self, target, reduction, pos_weight)
  def mse_loss(self, target: Tensor, reduction: str = "mean") -> Tensor:
    from tinychad.nn.functional import mse_loss
    return mse_loss(self, target, reduction)

  def sequential(self, layers) -> Tensor:
    x = self
    for layer in layers: x = layer(x)
    return x

  # ---- ordering and sampling: topk, sort, argsort, multinomial ----
  def sort(self, dim: int = -1, descending: bool = False, stable: bool = True) -> ValuesIndices:
    """(values, indices) along dim, as torch.sort; always stable (ties keep their order). Values take gradients
    (a gather at the indices). Each element's place is a count of the elements before it, n*n comparisons per
    row fused into one reduce: meant for rows of up to a few thousand (vocabularies, top-k), not long arrays."""
    return self._ordered(dim, descending, None, "sort")

  def argsort(self, dim: int = -1, descending: bool = False, stable: bool = True) -> Tensor:
    return self._ordered(dim, descending, None, "argsort").indices

  def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> ValuesIndices:
    """The k largest (or smallest) along dim, as torch.topk, in order; ties go to the earlier index."""
    return self._ordered(dim, largest, k, "topk")

  def _ordered(self, dim: int, descending: bool, k: int | None, op: str) -> ValuesIndices:
    if self.ndim == 0:
      if k not in (None, 0, 1): raise ValueError(f"{op}: k={k} is out of range for a 0-d tensor")
      return ValuesIndices(self, Tensor.zeros((), dtype=dtypes.int64, device=self.device))
    dim = self._axis(dim, op)
    x = self.transpose(dim, -1)
    n = x.shape[-1]
    if k is None: k = n
    if not isinstance(k, int) or not 0 <= k <= n:
      raise ValueError(f"{op}: k={k} is out of range for dim {dim} of size {n} (shape {_shape_str(self.shape)})")
    if n > SORT_MAX:
      raise ValueError(f"{op}: dim {dim} has {n} elements (shape {_shape_str(self.shape)}); ranking by comparisons "
                       f"handles up to {SORT_MAX}")
    # place of element i: how many elements precede it (greater, or equal and earlier); places are distinct
    mine, others = x.unsqueeze(-1), x.unsqueeze(-2)
    ahead = others > mine if descending else others < mine
    positions = Tensor.arange(n, device=self.device, dtype=dtypes.int64)
    earlier = positions.unsqueeze(1) > positions.unsqueeze(0)   # [i, j]: j comes before i
    places = (ahead | ((others == mine) & earlier)).sum(-1).detach()
    # the index at place r (r < k): the one element whose place is r
    at = places.unsqueeze(-2) == Tensor.arange(k, device=self.device, dtype=dtypes.int64).unsqueeze(-1)
    indices = at.where(positions, 0).sum(-1).cast(dtypes.int64)
    return ValuesIndices(x.gather(-1, indices).transpose(dim, -1), indices.transpose(dim, -1))

  def multinomial(self, num_samples: int = 1, replacement: bool = False) -> Tensor:
    """Category indices drawn from each row of non-negative weights ((n,) or (rows, n)), as torch.multinomial.
    With replacement, a draw u in [0, row total) picks the first category whose running sum exceeds u; without,
    the Gumbel-top-k trick (the num_samples largest log(w) + Gumbel noise) draws categories one after another in
    proportion to the weights left, exactly. Numbers come from Tensor.manual_seed's generator; TinyJit redraws
    them on replay. Weights aren't read back to check their signs (that would force a realize)."""
    if self.ndim not in (1, 2): raise ValueError(f"multinomial: weights must be 1-d or 2-d, got shape {_shape_str(self.shape)}")
    if not self.dtype.is_float: raise TypeError(f"multinomial: weights must be floats, got {self.dtype}")
    n = self.shape[-1]
    if not isinstance(num_samples, int) or num_samples < 1 or n == 0 or (not replacement and num_samples > n):
      raise ValueError(f"multinomial: cannot draw {num_samples} samples from {n} categories "
                       f"{'with' if replacement else 'without'} replacement (shape {_shape_str(self.shape)})")
    w = (self if self.ndim == 2 else self.unsqueeze(0)).detach()
    rows = w.shape[0]
    if replacement:
      cdf = w.cumsum(-1)
      total = cdf[:, -1:]
      u = (Tensor.rand(rows, num_samples, device=self.device) * total).unsqueeze(-1)
      # categories whose running sum is the total (the last non-zero one and the zeros after it) are never
      # counted, so a u that rounds up to the total still picks a category of non-zero weight
      below = (cdf.unsqueeze(1) <= u) & (cdf.unsqueeze(1) < total.unsqueeze(1))
      picks = below.sum(-1).cast(dtypes.int64)
    else:
      gumbel = -(-Tensor.rand(rows, n, device=self.device).maximum(1e-20).log()).log()
      picks = (w.log() + gumbel).topk(num_samples).indices
    return picks if self.ndim == 2 else picks.squeeze(0)


# ---- module-level helpers ----
def _to_numpy(data, dtype: DType | None) -> np.ndarray:
  if isinstance(data, np.ndarray) or isinstance(data, np.generic):
    array = np.asarray(data)
    if dtype is None:
      try:
        dtype = dtypes.from_np(array.dtype)
      except TypeError:
        raise TypeError(f"Tensor: numpy dtype {array.dtype} is not supported (use one of {[d.name for d in dtypes.all()]})") from None
    return array.astype(dtype.np, copy=False)
  if isinstance(data, (list, tuple)):
    flat = _flatten_list(data)
    try:
      array = np.array(data)
    except ValueError as err:
      raise ValueError(f"Tensor: nested sequence has inconsistent lengths: {err}") from None
    if array.dtype == object: raise ValueError("Tensor: nested sequence has inconsistent lengths")
    if dtype is None:
      if array.size == 0: dtype = dtypes.default_float
      elif all(isinstance(v, bool) for v in flat): dtype = dtypes.bool
      elif all(isinstance(v, (bool, int)) for v in flat): dtype = dtypes.default_int
      elif all(isinstance(v, (bool, int, float)) for v in flat): dtype = dtypes.default_float
      else: raise TypeError(f"Tensor: can't make a tensor from elements of type {sorted({type(v).__name__ for v in flat})}")
    return array.astype(dtype.np)
  if isinstance(data, (bool, int, float)):
    return np.array(data, dtype=(dtype or scalar_dtype(data)).np)
  raise TypeError(f"Tensor: can't make a tensor from {type(data).__name__}")


def _flatten_list(data) -> list:
  out, stack = [], [data]
  while stack:
    item = stack.pop()
    if isinstance(item, (list, tuple)): stack.extend(item)
    elif isinstance(item, Tensor): out.append(item.item())
    else: out.append(item.item() if isinstance(item, np.generic) else item)
  return out


def _joined(first, others: tuple, dim, op: str) -> tuple[Tensor, tuple[Tensor, ...], int]:
  """cat's and stack's arguments in all their forms -> (first tensor, the other tensors, dim): a list or tuple of
  tensors as the first argument (PyTorch's form) may be followed by dim as a positional argument."""
  if isinstance(first, (list, tuple)):
    if len(others) == 1 and isinstance(others[0], (int, np.integer)): dim, others = others[0], ()
    if not first: raise ValueError(f"{op}: expected a non-empty list of tensors")
    first, others = first[0], tuple(first[1:]) + tuple(others)
  for t in (first,) + others:
    if not isinstance(t, Tensor): raise TypeError(f"{op}: expected tensors, got a {type(t).__name__}")
  return first, others, dim


def _check_shape(shape, op: str) -> None:
  for s in shape:
    if not isinstance(s, (int, np.integer)) or s < 0: raise ValueError(f"{op}: invalid shape {_shape_str(shape)}")


@functools.lru_cache(maxsize=None)
def _scalar_promotion(tensor_dtype: DType, has_dims: bool, scalar: DType) -> DType:
  """The result dtype of a tensor op with a Python scalar: the few combinations are worked out once
  (`scalar` is the default int or float dtype in force, so a changed default is a new combination)."""
  return result_type([tensor_dtype] if has_dims else [], [] if has_dims else [tensor_dtype], [scalar])


def _broadcast_shape(a: tuple[int, ...], b: tuple[int, ...], op: str) -> tuple[int, ...]:
  ndim = max(len(a), len(b))
  pa, pb = (1,) * (ndim - len(a)) + a, (1,) * (ndim - len(b)) + b
  out = []
  for x, y in zip(pa, pb):
    if x != y and x != 1 and y != 1:
      raise ValueError(f"{op}: shapes {_shape_str(a)} and {_shape_str(b)} can't be broadcast together")
    out.append(y if x == 1 else x)
  return tuple(out)


def _pad_pairs(padding, ndim: int, shape) -> tuple[tuple[int, int], ...]:
  padding = tuple(padding)
  if all(isinstance(p, (tuple, list)) or p is None for p in padding):
    if len(padding) != ndim: raise ValueError(f"pad: need one (before, after) pair per dim of shape {_shape_str(shape)}, got {padding}")
    return tuple((0, 0) if p is None else (int(p[0]), int(p[1])) for p in padding)
  if len(padding) % 2 or len(padding) // 2 > ndim:
    raise ValueError(f"pad: padding {padding} must have an even length of at most {2 * ndim} for shape {_shape_str(shape)}")
  pairs = [(0, 0)] * ndim
  for i in range(len(padding) // 2):
    pairs[ndim - 1 - i] = (int(padding[2 * i]), int(padding[2 * i + 1]))
  return tuple(pairs)


class ValuesIndices(NamedTuple):
  """PyTorch's result of max/min(dim=...): `values, indices = x.max(dim=1)` or `x.max(dim=1).values`."""
  values: Tensor
  indices: Tensor


class no_grad(ContextDecorator):
  """Operations inside record no graph for backward (PyTorch's torch.no_grad)."""
  def __enter__(self):
    self.previous = Tensor.no_grad
    Tensor.no_grad = True
  def __exit__(self, *exc):
    Tensor.no_grad = self.previous
    return False

