"""The primitive ops: everything a Tensor does is composed from these.

in: nothing (definitions)  ->  out: the op enums the lazy graph, the scheduler and every device speak.
A device that implements these can run every Tensor method; backward rules live on the autograd
Functions in function.py, which are written in terms of the same primitives.
"""
from __future__ import annotations
import weakref
from enum import Enum, auto
from typing import Any, Callable
from tinychad.helpers import toposort


class _OpEnum(Enum):
  """Members are singletons, so identity hashing is exact; Enum's own __hash__ is a Python-level
  call, and op enums are in every interning and cache key of the hot path."""
  __hash__ = object.__hash__


class UnaryOps(_OpEnum):
  NEG = auto()      # -x
  EXP2 = auto()     # 2**x
  LOG2 = auto()     # log2(x)
  SIN = auto()      # sin(x)
  SQRT = auto()     # sqrt(x)
  RECIP = auto()    # 1/x
  TRUNC = auto()    # round toward zero (floats); identity on integers
  CAST = auto()     # convert to the dtype in `arg`
  BITCAST = auto()  # reinterpret the bits as the dtype in `arg` (same itemsize)


class BinaryOps(_OpEnum):
  ADD = auto()      # a + b
  SUB = auto()      # a - b
  MUL = auto()      # a * b
  DIV = auto()      # a / b (true division for floats, truncating for integers)
  MOD = auto()      # C's remainder: sign of the dividend (fmod for floats)
  MAX = auto()      # max(a, b)
  CMPLT = auto()    # a < b, gives bool
  CMPEQ = auto()    # a == b, gives bool
  CMPNE = auto()    # a != b, gives bool
  AND = auto()      # a & b (logical for bool, bitwise for integers)
  OR = auto()       # a | b
  XOR = auto()      # a ^ b


class TernaryOps(_OpEnum):
  WHERE = auto()    # c ? a : b


class ReduceOps(_OpEnum):
  SUM = auto()      # sum over the axes in `arg` (kept as size 1)
  MAX = auto()      # max over the axes in `arg` (kept as size 1)


class MovementOps(_OpEnum):
  RESHAPE = auto()  # same elements, new shape
  PERMUTE = auto()  # reorder the axes
  EXPAND = auto()   # broadcast size-1 axes (stride 0)
  PAD = auto()      # add zeros on both sides of each axis (a validity mask, no copy)
  SHRINK = auto()   # take a (start, end) window of each axis
  FLIP = auto()     # reverse the axes flagged in `arg`


class LoadOps(_OpEnum):
  EMPTY = auto()       # uninitialised memory of a shape
  CONST = auto()       # one scalar value, broadcast by views
  FROM_NUMPY = auto()  # host data handed over by the user
  COPY = auto()        # copy a buffer from another device
  CONTIGUOUS = auto()  # materialise a view into its own buffer
  GATHER = auto()      # rows of a table picked by integer indices: srcs = (table, indices), out[i..., j...] = table[indices[i...], j...]
  SCATTER_ADD = auto() # a gather's gradient: srcs = (rows (n, row...), indices (n,)), arg = table rows; out[r, j...] = the
                       # sum of rows[i, j...] over every i with indices[i] == r (an index outside the table adds nothing)


class BufferOps(_OpEnum):
  LOAD = auto()        # read an input buffer through a ShapeTracker: arg = (buffer number, tracker)
  CONST = auto()       # a constant read through a ShapeTracker (its mask makes padding): arg = (value, tracker)
  STORE = auto()       # write the kernel's result: arg = (buffer number, tracker)
  GATHER = auto()      # LOAD at a row given by srcs[0]: arg = (buffer number, tracker of row 0 over the kernel, row stride, rows); 0 outside [0, rows)


Op = UnaryOps | BinaryOps | TernaryOps | ReduceOps | MovementOps | LoadOps | BufferOps

# ops whose result is bool regardless of the input dtype
COMPARISONS = {BinaryOps.CMPLT, BinaryOps.CMPEQ, BinaryOps.CMPNE}
ALU_OPS = (UnaryOps, BinaryOps, TernaryOps)


class KernelNode:
  """One node of a kernel tree: loads and consts at the leaves, ALU ops and at most one reduce
  inside, a STORE at the root. Nodes are interned: building an equal tree gives the very same
  objects, so trees compare and hash by identity, and equal kernels share one compile."""
  __slots__ = ("op", "srcs", "arg", "dtype", "_below", "__weakref__")
  _interned: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

  def __new__(cls, op: Op, srcs: tuple[KernelNode, ...] = (), arg: Any = None, dtype: Any = None):
    # 0.0 and -0.0 (and 1 and 1.0) are equal as Python values but not as constants in a kernel
    arg_key = (type(arg[0]), repr(arg[0]), arg[1]) if op is BufferOps.CONST else arg
    key = (op, srcs, arg_key, dtype)
    # read the dictionary of weak references directly: WeakValueDictionary.get is a Python-level call
    ref = cls._interned.data.get(key)
    node = ref() if ref is not None else None
    if node is None:
      node = object.__new__(cls)
      node.op, node.srcs, node.arg, node.dtype, node._below = op, srcs, arg, dtype, None
      cls._interned[key] = node
    return node

  # interned, so identity is equality: the C-level object hash, not a Python call, in every key
  __hash__ = object.__hash__

  def __repr__(self) -> str: return f"KernelNode({self.op.name}, {len(self.srcs)} srcs, {self.arg!r}, {self.dtype!r})"

  def walk(self) -> tuple[KernelNode, ...]:
    """Every node once, sources before users (self last). A tree never changes, so its order is worked
    out once per node; it is kept without self, which would be a reference cycle."""
    if self._below is None: self._below = tuple(toposort(self.srcs, _sources))
    return self._below + (self,)

  def pretty(self) -> str:
    """The tree, one node per line with its sources indented below. A node read by several others
    (a DAG) is written out once, tagged #k, and later lines say `^ #k` instead of repeating it."""
    readers: dict[KernelNode, int] = {}
    for node in self.walk():
      for src in node.srcs: readers[src] = readers.get(src, 0) + 1
    tags: dict[KernelNode, int] = {}
    lines: list[str] = []
    def show(node: KernelNode, indent: int) -> None:
      pad = "  " * indent
      if node in tags:
        lines.append(f"{pad}^ #{tags[node]} {node.op.name}")
        return
      tag = ""
      if readers.get(node, 0) > 1 and node.srcs:
        tags[node] = len(tags)
        tag = f" #{tags[node]}"
      arg = node.arg
      if node.op in (BufferOps.LOAD, BufferOps.CONST, BufferOps.STORE, BufferOps.GATHER):
        arg = f"{arg[0]}, views={[(v.shape, v.strides, v.offset, v.mask) for v in arg[1].views]}"
      lines.append(f"{pad}{node.op.name} {node.dtype.name if node.dtype else ''} {arg if arg is not None else ''}".rstrip() + tag)
      for src in node.srcs: show(src, indent + 1)
    show(self, 0)
    return "\n".join(lines)


def _sources(node: KernelNode) -> tuple[KernelNode, ...]: return node.srcs


def rewrite(root: KernelNode, fn: Callable[[KernelNode, tuple[KernelNode, ...]], KernelNode],
            keep: Callable[[KernelNode], bool] | None = None) -> KernelNode:
  """`root` rebuilt bottom-up: each distinct node once, as fn(node, its sources already rebuilt).
  A node for which keep(node) is true is left as it is, with everything below it (a rebuild that
  stops at a reduce). The one rebuilder of kernel trees; no recursion, so trees of any depth work."""
  below = (lambda node: () if keep(node) else node.srcs) if keep is not None else _sources
  done: dict[KernelNode, KernelNode] = {}
  for node in toposort([root], below):
    done[node] = node if keep is not None and keep(node) else fn(node, tuple(done[s] for s in node.srcs))
  return done[root]


def rebuild(node: KernelNode, srcs: tuple[KernelNode, ...], arg: Any = None) -> KernelNode:
  """`node` with new sources (and a new arg, when one is given): what most rewrite functions return."""
  return KernelNode(node.op, srcs, node.arg if arg is None else arg, node.dtype)
