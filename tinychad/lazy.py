"""The lazy graph: Tensor ops record LazyBuffers; nothing runs until realize().

in: primitive ops from function.py (elementwise, reduce, movement, load)
out: a graph of LazyBuffers. A *base* LazyBuffer computes a contiguous buffer from its sources with
     one op; a *view* LazyBuffer is a ShapeTracker over a base (movement ops only make views, so they
     never copy). Running the graph is the engine's job (Tensor.realize hands the bases to it), and
     reading a result back is view.read_view's.
Two rewrites happen as ops are recorded (both off with NOOPT=1):
  - layout: an elementwise op whose inputs are all the same permutation of contiguous buffers (a
    convolution's channels-last result seen as NCHW), or a reduce over such a view, is computed in
    the buffers' own order and its result permuted back, so the layout survives ReLU and pooling;
  - split reduce: a long reduce into fewer than SPLIT_PARTS outputs becomes two reduces, so that
    threads (which split a kernel's output loop) share it.
"""
from __future__ import annotations
import functools
import numpy as np
from tinychad.device import Buffer
from tinychad.dtype import DType, dtypes
from tinychad.ops import RESULT_DTYPE, UnaryOps, ReduceOps, LoadOps, Op
from tinychad.helpers import getenv, inverse_permutation, prod
from tinychad.view import ShapeTracker

# The scalar operands LazyBuffer.operand made, by (Python type, value, dtype, device, shape): a step records the same
# few scalars (1, 0.5, a beta) at the same shapes at every op that uses them, and each new one costs a numpy
# conversion and two LazyBuffers, and two more nodes in the graph that realize keys and schedules. A constant is
# immutable until its base is computed (a realize of the constant itself, which an operand only meets inside the
# engine): one computed since is replaced, so a graph reads it inline again. Sharing one among graphs changes
# nothing the scheduler does: a constant is inlined into every kernel that reads it. Bounded: past MAX_OPERANDS
# the table starts again.
_operands: dict[tuple, LazyBuffer] = {}
_SCALARS = (int, float, bool)
MAX_OPERANDS = 4096

# a reduce with this many inputs per output (or more) and fewer than SPLIT_PARTS outputs is split in two
SPLIT_MIN_REDUCE = 1 << 17
SPLIT_PARTS = 64


class LazyBuffer:
  # a model records thousands of these per step: slots make them smaller and quicker to make, and leave
  # the garbage collector no attribute dicts to walk (op, arg, srcs and realized are set on bases only)
  __slots__ = ("device", "st", "dtype", "shape", "size", "_base", "op", "arg", "srcs", "realized")

  def __init__(self, device: str, st: ShapeTracker, dtype: DType, op: Op | None = None, arg=None,
               srcs: tuple[LazyBuffer, ...] = (), base: LazyBuffer | None = None):
    self.device, self.st, self.dtype = device, st, dtype
    # a buffer's view never changes: its shape and size are read all over the scheduler, so keep them
    self.shape: tuple[int, ...] = st.shape
    self.size: int = st.size
    self._base = base
    if base is None:
      self.op, self.arg, self.srcs = op, arg, srcs
      self.realized = None        # a runtime Buffer once computed

  def __repr__(self) -> str:
    if self._base is not None: return f"<LB view {self.shape} {self.dtype.name} of {self.base!r}>"
    state = "realized" if self.realized is not None else (self.op.name if self.op else "?")
    return f"<LB {self.device} {self.shape} {self.dtype.name} {state}>"

  @property
  def base(self) -> LazyBuffer: return self._base if self._base is not None else self

  @property
  def is_realized(self) -> bool: return self.base.realized is not None

  # ---- creation ----
  @staticmethod
  def from_numpy(array: np.ndarray, device: str) -> LazyBuffer:
    array = np.ascontiguousarray(array).reshape(array.shape)   # ascontiguousarray makes 0-d arrays 1-d
    lb = LazyBuffer(device, ShapeTracker.from_shape(array.shape), dtypes.from_np(array.dtype), LoadOps.FROM_NUMPY)
    lb.realized = Buffer(device, array.size, lb.dtype).copyin(array.reshape(-1))
    return lb

  @staticmethod
  def full(value, shape: tuple[int, ...], dtype: DType, device: str) -> LazyBuffer:
    """A constant: one scalar, broadcast by a zero-stride view, no memory."""
    const = LazyBuffer(device, ShapeTracker.from_shape(()), dtype, LoadOps.CONST, dtype.np(value).item())
    return LazyBuffer(device, broadcast_tracker(tuple(shape)), dtype, base=const) if shape else const

  @staticmethod
  def operand(value, shape: tuple[int, ...], dtype: DType, device: str) -> LazyBuffer:
    """full() for an op's scalar operand (the 2.0 of x * 2.0), shared with earlier calls (_operands). Only
    operands: a tensor the user holds (Tensor.full, ones) gets a constant of its own, so that two of them never
    come to share one buffer when computed."""
    shape = tuple(shape)
    key = (type(value), value, dtype, device, shape)
    # 0.0 and -0.0 are equal keys, NaN equals nothing: those are made anew, as is any value but a Python scalar
    if type(value) not in _SCALARS or value != value or value == 0: return LazyBuffer.full(value, shape, dtype, device)
    made = _operands.get(key)
    if made is None or made.base.realized is not None:
      made = _operands[key] = LazyBuffer.full(value, shape, dtype, device)
      if len(_operands) > MAX_OPERANDS: _operands.clear()
    return made

  @staticmethod
  def empty(shape: tuple[int, ...], dtype: DType, device: str) -> LazyBuffer:
    return LazyBuffer(device, ShapeTracker.from_shape(tuple(shape)), dtype, LoadOps.EMPTY)

  def const_like(self, value) -> LazyBuffer:
    return LazyBuffer.full(value, self.shape, self.dtype, self.device)

  # ---- compute ops: each makes a new base ----
  def e(self, op: Op, *srcs: LazyBuffer, arg=None) -> LazyBuffer:
    inputs = (self,) + srcs
    st = self.st
    # the common case, a computed (or to be computed) contiguous base first, is natural order: _shared_layout's
    # answer for it, without the call
    if not st.contiguous or self._base is not None or self.op is LoadOps.CONST:
      order = _shared_layout(inputs)
      if order is not None:
        # every input is the same permutation of a contiguous buffer: compute in that buffer's order and
        # permute the result, so the layout (a convolution's channels-last output) survives the op
        physical = [x.permute(order) for x in inputs]
        return physical[0].e(op, *physical[1:], arg=arg).permute(inverse_permutation(order))
      st = ShapeTracker.from_shape(self.shape)
    rule = RESULT_DTYPE.get(op)
    return LazyBuffer(self.device, st, self.dtype if rule is None else rule(inputs, arg), op, arg, inputs)

  def r(self, op: ReduceOps, axis: tuple[int, ...]) -> LazyBuffer:
    """Reduce over `axis`, keeping those axes as size 1."""
    new_shape = tuple(1 if i in axis else s for i, s in enumerate(self.shape))
    if new_shape == self.shape: return self
    order = _shared_layout((self,))
    if order is not None:
      # reduce in the buffer's own order (SIMD lanes along its contiguous axis), then permute back
      return self.permute(order).r(op, tuple(order.index(a) for a in axis)).permute(inverse_permutation(order))
    split = self._split_reduce(op, tuple(sorted(axis)), new_shape)
    if split is not None: return split
    return LazyBuffer(self.device, ShapeTracker.from_shape(new_shape), self.dtype, op, tuple(sorted(axis)), (self,))

  def _split_reduce(self, op: ReduceOps, axis: tuple[int, ...], new_shape: tuple[int, ...]) -> LazyBuffer | None:
    """A long reduce into a few outputs as two reduces: SPLIT_PARTS partial results, then their total.
    Threads share out a kernel's output loop, so a sum of a whole tensor would run on one core; the
    first stage gives them SPLIT_PARTS outputs. Not for float16 (its partial results would round to
    half) nor with NOOPT=1 (plain kernels)."""
    outputs = prod(new_shape)
    if outputs >= SPLIT_PARTS or self.size // max(outputs, 1) < SPLIT_MIN_REDUCE: return None
    if self.dtype == dtypes.float16 or getenv("NOOPT", 0): return None
    candidates = [a for a in axis if self.shape[a] % SPLIT_PARTS == 0 and self.shape[a] >= SPLIT_PARTS * 64]
    if not candidates: return None
    # split the longest reduce axis into (SPLIT_PARTS, rest); a reshape that needs a second view
    # would make every load do index arithmetic, so such inputs keep the single reduce
    ax = max(candidates, key=lambda a: self.shape[a])
    split_st = self.st.reshape(self.shape[:ax] + (SPLIT_PARTS, self.shape[ax] // SPLIT_PARTS) + self.shape[ax + 1:])
    if len(split_st.views) > len(self.st.views): return None
    inner = tuple(a + 1 if a >= ax else a for a in axis)     # every reduce axis, with ax now its inner half
    partial = self._view(split_st).r(op, inner)               # SPLIT_PARTS outputs along axis ax
    return partial.r(op, (ax,)).reshape(new_shape)

  def cast(self, dtype: DType) -> LazyBuffer:
    return self if dtype == self.dtype else self.e(UnaryOps.CAST, arg=dtype)

  def contiguous(self) -> LazyBuffer:
    """Self in a buffer of its own row-major layout. A base is that already; so is a view that reads all
    of a (non-constant) base in order, as a permute undone or a reshape does: it is the base reshaped, as
    PyTorch's contiguous() returns a contiguous tensor itself, instead of a copy kernel."""
    base = self._base
    if base is None: return self if self.op is not LoadOps.CONST else self._copy()
    if base.op is not LoadOps.CONST and self.size == base.size and self.st.contiguous: return base.reshape(self.shape)
    return self._copy()

  def _copy(self) -> LazyBuffer:
    return LazyBuffer(self.device, ShapeTracker.from_shape(self.shape), self.dtype, LoadOps.CONTIGUOUS, None, (self,))

  def gather(self, indices: LazyBuffer) -> LazyBuffer:
    """Rows of self (shape (rows, *row)) picked by integer `indices`: shape indices.shape + row. An
    index outside [0, rows) reads zeros. A load op: its kernel reads the index, then one row."""
    table = self if len(self.st.views) == 1 and self.st.views[0].mask is None else self.contiguous()
    shape = indices.shape + self.shape[1:]
    return LazyBuffer(self.device, ShapeTracker.from_shape(shape), self.dtype, LoadOps.GATHER, None, (table, indices))

  def scatter_add(self, indices: LazyBuffer, rows: int) -> LazyBuffer:
    """A table of `rows` rows shaped like self's (n, *row) rows, each the sum of the rows of self whose
    integer index (indices, shape (n,)) is its row number. A load op with a kernel of its own
    (codegen/scatter.py): n additions per element of a row, not a one-hot reduce over the table."""
    shape = (rows,) + self.shape[1:]
    return LazyBuffer(self.device, ShapeTracker.from_shape(shape), self.dtype, LoadOps.SCATTER_ADD, rows,
                      (self.contiguous(), indices.contiguous()))

  def attention(self, srcs: tuple[LazyBuffer, ...], arg, size: int) -> LazyBuffer:
    """A flash-attention kernel's flat output of `size` elements (ops.AttentionArg says what it holds), reading self
    and srcs, each made contiguous first: a load op with a kernel of its own (codegen/attention.py)."""
    return LazyBuffer(self.device, ShapeTracker.from_shape((size,)), self.dtype, LoadOps.ATTENTION, arg,
                      tuple(x.contiguous() for x in (self,) + srcs))

  @staticmethod
  def subgraph(srcs: tuple[LazyBuffer, ...], build, params: tuple, shape: tuple[int, ...], dtype: DType) -> LazyBuffer:
    """One node standing for the graph that `build(srcs, *params)` records (a LazyBuffer of `shape` and `dtype`, read
    by nothing else): a loop that records thousands of ops (an LSTM's time steps) costs one node to record and to
    key, and its graph is built only when the scheduler meets the node in a graph it hasn't scheduled before. So
    `build` must be a module-level function (the schedule cache keys it by identity) whose graph depends on its
    sources' shapes, dtypes and views and on `params` alone, and reads only `srcs` and constants: a remembered
    schedule remakes every other buffer of the built graph as scratch memory on each run."""
    return LazyBuffer(srcs[0].device, ShapeTracker.from_shape(tuple(shape)), dtype, LoadOps.SUBGRAPH, (build, tuple(params)),
                      tuple(srcs))

  def copy_to_device(self, device: str) -> LazyBuffer:
    if device == self.device: return self
    src = self.contiguous()
    return LazyBuffer(device, ShapeTracker.from_shape(self.shape), self.dtype, LoadOps.COPY, None, (src,))

  # ---- movement ops: each makes a view of the same base ----
  def _view(self, st: ShapeTracker) -> LazyBuffer:
    if st.shape == self.shape and st == self.st: return self
    return LazyBuffer(self.device, st, self.dtype, base=self if self._base is None else self._base)

  def reshape(self, shape: tuple[int, ...]) -> LazyBuffer: return self._view(self.st.reshape(tuple(shape)))
  def permute(self, order: tuple[int, ...]) -> LazyBuffer: return self._view(self.st.permute(tuple(order)))
  def expand(self, shape: tuple[int, ...]) -> LazyBuffer: return self._view(self.st.expand(tuple(shape)))
  def pad(self, arg: tuple[tuple[int, int], ...]) -> LazyBuffer: return self._view(self.st.pad(tuple(arg)))
  def shrink(self, arg: tuple[tuple[int, int], ...]) -> LazyBuffer: return self._view(self.st.shrink(tuple(arg)))
  def flip(self, axes: tuple[bool, ...]) -> LazyBuffer: return self._view(self.st.flip(tuple(axes)))


@functools.lru_cache(maxsize=1024)
def broadcast_tracker(shape: tuple[int, ...]) -> ShapeTracker:
  """The view of a 0-d constant at `shape`: every stride 0 (what reshape to 1s, then expand, gives)."""
  return ShapeTracker.from_shape(()).reshape((1,) * len(shape)).expand(shape)


def _shared_layout(inputs: tuple[LazyBuffer, ...]) -> tuple[int, ...] | None:
  """The permutation the full-size inputs walk their contiguous buffers in, if they share one that
  isn't the natural order. Constants and broadcasts (a per-channel mean, stride 0 elsewhere) read the
  same in any order, so they don't vote."""
  order = None
  for x in inputs:
    base = x._base if x._base is not None else x
    if base.op is LoadOps.CONST and base.realized is None: continue
    st = x.st
    # a contiguous input (the common case, checked first: this runs for every op) means natural order
    if st.contiguous: return None
    if len(st.views) == 1 and any(stride == 0 and size != 1 for stride, size in zip(st.views[0].strides, x.shape)): continue
    mine = st.permuted_order
    if mine is None or (order is not None and mine != order): return None
    order = mine
  return None if order is None or getenv("NOOPT", 0) else order
