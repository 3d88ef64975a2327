"""The primitive ops: everything a Tensor does is composed from these, and each op's facts in one table.

in: nothing (definitions)  ->  out: the op enums the lazy graph, the scheduler and every device speak;
OP_INFO, one OpInfo per ALU and reduce op; KernelNode, the node of a kernel tree, and `rewrite`/`rebuild`.
A device that implements these can run every Tensor method; backward rules live on the autograd
Functions in function.py, which are written in terms of the same primitives.
OP_INFO says, per op, what the layers below the front end need to know: whether it is defined on
floats only, whether it is costly to compute again (the row cache keeps such values), on which dtypes
it is one SIMD instruction, its numpy implementation (the NUMPY reference device), its C and LLVM
spelling, its result dtype and a reduce's identity. The codegen and the renderers look these up; what
a table can't say (guarded integer division, NaN-propagating max, vector blends) is a short ordered
list of rules in each renderer.
Adding an ALU op takes: its enum member here, its OpInfo entry in OP_INFO, and, for autograd, a
Function in function.py (and the Tensor method that applies it). Only an op whose meaning no template
can spell (see the rules in renderer/cstyle.py and renderer/llvmir.py) needs a rule there too. A composite
op (ERF) is one node of the lazy graph, cheap to record, that the scheduler expands into the others
(engine/schedule.py's EXPANSIONS), so no device needs to know it.
"""
from __future__ import annotations
import weakref
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, Callable
import numpy as np
from tinychad.dtype import VECTOR_FLOATS, NATIVE_VECTOR_DTYPES, DType, dtypes
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
  ERF = auto()      # erf(x): the scheduler expands it into the ops above when it builds a kernel (engine/erf.py)


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
  ATTENTION = auto()   # a flash-attention kernel (forward or a gradient): srcs, output and arg as AttentionArg says
  SUBGRAPH = auto()    # a part of the graph recorded as one node: arg = (build, params); the scheduler replaces it by
                       # build(srcs, *params) (a LazyBuffer of its shape and dtype) when it schedules the graph anew


class BufferOps(_OpEnum):
  LOAD = auto()        # read an input buffer through a ShapeTracker: arg = (buffer number, tracker)
  CONST = auto()       # a constant read through a ShapeTracker (its mask makes padding): arg = (value, tracker)
  STORE = auto()       # write the kernel's result: arg = (buffer number, tracker)
  GATHER = auto()      # LOAD at a row given by srcs[0]: arg = (buffer number, tracker of row 0 over the kernel, row stride, rows); 0 outside [0, rows)


@dataclass(frozen=True)
class AttentionArg:
  """What a LoadOps.ATTENTION kernel computes: codegen/attention.py lowers it, runtime/ops_numpy.py runs it.
  Rows are (batch, head, query) for "forward", "dq" and "dmask", (batch, kv head, key) for "dkv"; the lane axis (keys,
  or queries for "dkv") is vectorized `lanes` wide and padded with zeros to a multiple of `block` ("_p"). Buffers, all
  contiguous and row-major (B batch, H query heads, Hk kv heads, L queries, S keys, D q/k width, E v width):
    forward: out = o (B,H,L,E) then lse2 (B,H,L); in q (B,H,L,D), kT (B,Hk,D,S_p), v (B,Hk,S_p,E)[, mask]
    dq:      out = dq (B,H,L,D); in q, kT, k (B,Hk,S_p,D), vT (B,Hk,E,S_p), do (B,H,L,E), lse2 (B,H,L_p),
             delta (B,H,L_p)[, mask]
    dmask:   out = the scores' gradient (B,H,L,S_p); in as dq
    dkv:     out = dk (B,Hk,S,D) then dv (B,Hk,S,E); in k (B,Hk,S,D), v (B,Hk,S,E), qT (B,H,D,L_p), q (B,H,L_p,D),
             doT (B,H,E,L_p), do (B,H,L_p,E), lse2, delta[, the mask transposed: its lane axis is the queries]
  lse2 is a query row's log2 of the sum of exp2 of its base-2 scores (+inf for a row that sees no key); delta is
  rowsum(do * o). Key j is visible to query i when the mask allows it, j <= i if causal, and i - window < j if
  window > 0 (a window implies causal)."""
  mode: str                  # "forward", "dq", "dmask" or "dkv"
  batch: int
  heads: int
  kv_heads: int              # heads // kv_heads consecutive query heads share each key/value head
  length: int                # L
  source: int                # S
  dim: int                   # D
  vdim: int                  # E
  scale: float
  causal: bool
  window: int                # 0: no window
  mask: str                  # "": none, "bool": True may attend, "add": added to the scaled scores
  mask_strides: tuple[int, int, int, int]  # elements per (batch, head, row, lane) step in the mask; 0 broadcasts
  lanes: int                 # SIMD width along the lane axis
  block: int                 # lanes axis positions per loop step (a multiple of lanes): padded to a multiple of it


Op = UnaryOps | BinaryOps | TernaryOps | ReduceOps | MovementOps | LoadOps | BufferOps

ALU_OPS = (UnaryOps, BinaryOps, TernaryOps)


@dataclass(frozen=True)
class OpInfo:
  """The facts about one ALU or reduce op. Spellings are per result category (bool, integer, float:
  DType.category indexes them); None where the op has no meaning there or a renderer rule spells it."""
  float_only: bool = False    # defined on floats: integer inputs compute in float64 and convert back, as numpy does
  costly: bool = False        # computing it again costs more than a load from L1 (a polynomial, libm, a division)
  dtype: DType | None = None  # the result's dtype when fixed (comparisons give bool); else the dtype of the values
                              # it combines (WHERE's second and third sources), or CAST's and BITCAST's arg
  vector_dtypes: frozenset[DType] = frozenset()  # where it is one lane-wise SIMD instruction (C operator, LLVM op)
  simd: bool = True           # may be in a SIMD kernel at all (BITCAST goes through memory per element in C)
  numpy: Callable | None = None  # the numpy implementation, with C semantics (None: the device needs the dtype)
  c: tuple[str | None, str | None, str | None] = (None, None, None)  # C expression over the sources {0} {1} {2};
                              # {f} is the float-function suffix ("f" but for double), {dtype} the result's C type
  llvm: tuple[str | None, str | None, str | None] = (None, None, None)  # IRBuilder method, or "llvm.*" intrinsic
  predicate: str | None = None  # comparisons: the relation LLVM's icmp/fcmp take
  identity: Callable[[DType], Any] | None = None  # ReduceOps: the accumulator's start value for a dtype


def _each(spelling: str) -> tuple[str, str, str]: return (spelling, spelling, spelling)


def _trunc_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """C's division: truncating for integers, and 0 for a zero integer divisor (numpy's answer)."""
  if np.issubdtype(np.result_type(a, b), np.floating): return a / b
  q = np.floor_divide(a, np.where(b == 0, 1, b))
  fix = (np.remainder(a, np.where(b == 0, 1, b)) != 0) & ((a < 0) != (b < 0))
  return np.where(b == 0, 0, q + fix)


def _c_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """C's remainder (the dividend's sign): fmod, and 0 for a zero integer divisor."""
  return np.fmod(a, np.where(b == 0, 1, b)) if a.dtype.kind in "iu" else np.fmod(a, b)


def _max_identity(dtype: DType) -> Any:
  if dtype.is_float: return float("-inf")
  if dtype == dtypes.bool: return False
  return 0 if dtype.is_unsigned else -(2 ** (8 * dtype.itemsize - 1))


_MATH = dict(float_only=True, costly=True)   # libm functions (float32 exp2/log2: the renderers' polynomials)
OP_INFO: dict[Op, OpInfo] = {
  UnaryOps.NEG: OpInfo(vector_dtypes=NATIVE_VECTOR_DTYPES, c=("!{0}", "-{0}", "-{0}"), llvm=(None, "neg", "fneg"),
                       numpy=lambda x: np.logical_not(x) if x.dtype == np.bool_ else np.negative(x)),
  UnaryOps.EXP2: OpInfo(**_MATH, numpy=np.exp2, c=(None, None, "exp2{f}({0})"), llvm=(None, None, "llvm.exp2")),
  UnaryOps.LOG2: OpInfo(**_MATH, numpy=np.log2, c=(None, None, "log2{f}({0})"), llvm=(None, None, "llvm.log2")),
  UnaryOps.SIN: OpInfo(**_MATH, numpy=np.sin, c=(None, None, "sin{f}({0})"), llvm=(None, None, "llvm.sin")),
  UnaryOps.SQRT: OpInfo(**_MATH, numpy=np.sqrt, c=(None, None, "sqrt{f}({0})"), llvm=(None, None, "llvm.sqrt")),
  UnaryOps.RECIP: OpInfo(costly=True, numpy=np.reciprocal,
                         c=("({0}==0 ? 0 : 1/{0})", "({0}==0 ? 0 : 1/{0})", "1/{0}")),
  UnaryOps.TRUNC: OpInfo(numpy=np.trunc, c=("{0}", "{0}", "trunc{f}({0})"), llvm=(None, None, "llvm.trunc")),
  UnaryOps.CAST: OpInfo(c=_each("({dtype}){0}")),
  UnaryOps.BITCAST: OpInfo(simd=False),
  # no spelling: no device sees it (engine/erf.py)
  UnaryOps.ERF: OpInfo(float_only=True, costly=True),
  # bool arithmetic as numpy does it: + is or, * is and, - is xor, max is or
  BinaryOps.ADD: OpInfo(vector_dtypes=NATIVE_VECTOR_DTYPES, numpy=np.add, c=_each("{0}+{1}"),
                        llvm=("or_", "add", "fadd")),
  BinaryOps.SUB: OpInfo(vector_dtypes=NATIVE_VECTOR_DTYPES, numpy=np.subtract, c=_each("{0}-{1}"),
                        llvm=("xor", "sub", "fsub")),
  BinaryOps.MUL: OpInfo(vector_dtypes=NATIVE_VECTOR_DTYPES, numpy=np.multiply, c=_each("{0}*{1}"),
                        llvm=("and_", "mul", "fmul")),
  BinaryOps.DIV: OpInfo(costly=True, vector_dtypes=VECTOR_FLOATS, numpy=_trunc_div, c=_each("{0}/{1}"),
                        llvm=(None, None, "fdiv")),
  BinaryOps.MOD: OpInfo(numpy=_c_mod, c=("{0}%{1}", "{0}%{1}", "fmod{f}({0}, {1})"), llvm=(None, None, "frem")),
  # NaN wins, as in numpy.maximum (in a C lane loop gcc turns the float select into a vector blend)
  BinaryOps.MAX: OpInfo(numpy=np.maximum, llvm=("or_", None, None),
                        c=("({0}>{1}) ? {0} : {1}", "({0}>{1}) ? {0} : {1}", "{0}!={0} ? {0} : ({0}>{1} ? {0} : {1})")),
  BinaryOps.CMPLT: OpInfo(dtype=dtypes.bool, numpy=np.less, c=_each("{0}<{1}"), predicate="<"),
  BinaryOps.CMPEQ: OpInfo(dtype=dtypes.bool, numpy=np.equal, c=_each("{0}=={1}"), predicate="=="),
  BinaryOps.CMPNE: OpInfo(dtype=dtypes.bool, numpy=np.not_equal, c=_each("{0}!={1}"), predicate="!="),
  BinaryOps.AND: OpInfo(numpy=np.bitwise_and, c=_each("{0}&{1}"), llvm=("and_", "and_", None)),
  BinaryOps.OR: OpInfo(numpy=np.bitwise_or, c=_each("{0}|{1}"), llvm=("or_", "or_", None)),
  BinaryOps.XOR: OpInfo(numpy=np.bitwise_xor, c=_each("{0}^{1}"), llvm=("xor", "xor", None)),
  TernaryOps.WHERE: OpInfo(numpy=np.where, c=_each("{0} ? {1} : {2}"), llvm=_each("select")),
  ReduceOps.SUM: OpInfo(numpy=np.sum, identity=lambda dt: False if dt == dtypes.bool else (0.0 if dt.is_float else 0)),
  ReduceOps.MAX: OpInfo(numpy=np.max, identity=_max_identity),
}
# ops whose result is bool regardless of the input dtype
COMPARISONS = {op for op, info in OP_INFO.items() if info.dtype is dtypes.bool}
# the result dtype of the ops whose result isn't their first source's dtype, from (sources, arg): every recorded op
# asks, and the common answer (no rule) is one dictionary miss
RESULT_DTYPE: dict[Op, Callable[[tuple, Any], DType]] = {
  **{op: lambda srcs, arg: dtypes.bool for op in COMPARISONS},
  UnaryOps.CAST: lambda srcs, arg: arg, UnaryOps.BITCAST: lambda srcs, arg: arg,
  TernaryOps.WHERE: lambda srcs, arg: srcs[1].dtype,       # the condition is first
}


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
