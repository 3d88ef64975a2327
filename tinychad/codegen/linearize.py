"""Lowering a kernel tree to linear IR.

in: a kernel tree (STORE root, ALU ops, at most one reduce, LOAD/CONST leaves with ShapeTrackers)
    and the kernel's name
out: a Program: a flat, typed list of UOps (loops, index arithmetic, guarded loads, ALU ops,
     accumulators, stores) in execution order. Every renderer reads this one list, so the C and the
     LLVM backends cannot disagree about what a kernel computes.
Before lowering, size-1 axes are dropped and neighbouring axes that every view walks contiguously
are merged, so an elementwise kernel over a contiguous tensor becomes one flat loop.
"""
from __future__ import annotations
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any
from tinychad.dtype import DType, dtypes
from tinychad.ops import UnaryOps, BinaryOps, TernaryOps, ReduceOps, BufferOps, KernelNode
from tinychad.view import ShapeTracker, View
from tinychad.codegen.symbolic import Node, Num, Var, Sum, Mul, Div, Mod, Lt, Ge, And, to_node, fits_int32


class UOps(Enum):
  DEFINE_GLOBAL = auto()  # a kernel argument: arg = (buffer number, writable)
  CONST = auto()          # a literal: arg = value
  RANGE = auto()          # open a loop: arg = (variable name, extent)
  ENDRANGE = auto()       # close the loop in srcs[0]
  LOAD = auto()           # srcs = (buffer, index) or (buffer, index, gate); a false gate reads 0
  ALU = auto()            # arg = the op (UnaryOps/BinaryOps/TernaryOps); CAST/BITCAST convert to dtype
  DEFINE_ACC = auto()     # a reduce accumulator: arg = its initial value
  ASSIGN = auto()         # srcs = (accumulator, value): the accumulator takes the value
  STORE = auto()          # srcs = (buffer, index, value)


@dataclass(eq=False)
class UOp:
  op: UOps
  dtype: DType | None
  srcs: tuple[UOp, ...] = ()
  arg: Any = None
  num: int = field(default=-1, compare=False)   # position in the program, set when emitted


@dataclass
class Program:
  name: str
  uops: list[UOp]
  globals: list[UOp]      # DEFINE_GLOBALs in argument order: output first, then inputs by number

  def pretty(self) -> str:
    """One instruction per line: number, op, dtype, sources, argument."""
    lines = [f"kernel {self.name}"]
    depth = 0
    for u in self.uops:
      if u.op is UOps.ENDRANGE: depth -= 1
      dtype = u.dtype.name if u.dtype is not None else ""
      srcs = ",".join(str(s.num) for s in u.srcs)
      arg = u.arg.name if isinstance(u.arg, Enum) else ("" if u.arg is None else u.arg)
      lines.append(f"{u.num:4d} {'  ' * depth}{u.op.name:<13s} {dtype:<8s} ({srcs}) {arg}".rstrip())
      if u.op is UOps.RANGE: depth += 1
    return "\n".join(lines)


# float16 sums accumulate in float32, like numpy's half reductions
_ACC_DTYPE = {dtypes.float16: dtypes.float32}


def reduce_identity(op: ReduceOps, dtype: DType) -> Any:
  if op is ReduceOps.SUM: return False if dtype == dtypes.bool else (0.0 if dtype.is_float else 0)
  if dtype.is_float: return float("-inf")
  if dtype == dtypes.bool: return False
  return 0 if dtype.is_unsigned else -(2 ** (8 * dtype.itemsize - 1))


# ---- dimension simplification ----

def _top(st: ShapeTracker) -> View: return st.views[-1]


def _all_invalid(st: ShapeTracker) -> bool:
  return any(v.mask is not None and any(lo >= hi for lo, hi in v.mask) for v in st.views)


def _drop_axes(view: View, keep: list[int]) -> View:
  mask = tuple(view.mask[i] for i in keep) if view.mask is not None else None
  return View(tuple(view.shape[i] for i in keep), tuple(view.strides[i] for i in keep), view.offset, mask)


def _can_merge(view: View, i: int) -> bool:
  """Axes i and i+1 of the view walk memory as one axis (and the mask allows it)."""
  if view.strides[i] != view.strides[i + 1] * view.shape[i + 1]: return False
  return view.mask is None or view.mask[i + 1] == (0, view.shape[i + 1])


def _merge(view: View, i: int) -> View:
  inner = view.shape[i + 1]
  shape = view.shape[:i] + (view.shape[i] * inner,) + view.shape[i + 2:]
  strides = view.strides[:i] + (view.strides[i + 1],) + view.strides[i + 2:]
  mask = None
  if view.mask is not None:
    lo, hi = view.mask[i]
    mask = view.mask[:i] + ((lo * inner, hi * inner),) + view.mask[i + 2:]
  return View(shape, strides, view.offset, mask)


def simplify_dims(full_shape: tuple[int, ...], reduce_axes: tuple[int, ...],
                  views: list[View]) -> tuple[list[tuple[int, bool]], list[View]]:
  """Drop size-1 axes and merge mergeable neighbours. Returns the dims as (size, is_reduce) and the
  top views rewritten to match. `views` are the top views of every tracker, each over full_shape or
  over the output shape (reduce axes of size 1); both change the same way."""
  keep = [i for i, s in enumerate(full_shape) if s != 1]
  dims = [(full_shape[i], i in reduce_axes) for i in keep]
  views = [_drop_axes(v, keep) for v in views]
  i = 0
  while i < len(dims) - 1:
    (s0, r0), (s1, r1) = dims[i], dims[i + 1]
    if r0 == r1 and s0 != 0 and s1 != 0 and all(_can_merge(v, i) for v in views):
      dims[i:i + 2] = [(s0 * s1, r0)]
      views = [_merge(v, i) for v in views]
    else: i += 1
  return dims, views


# ---- lowering ----

class _Lowerer:
  def __init__(self, ast: KernelNode, name: str):
    self.ast, self.name = ast, name
    self.uops: list[UOp] = []
    # one CSE table per open loop: a value made inside a loop can't be used after it closes
    self.scopes: list[dict] = [{}]
    self.reduce = next((n for n in ast.walk() if isinstance(n.op, ReduceOps)), None)

  # -- emission with common-subexpression elimination --
  def emit(self, op: UOps, dtype: DType | None, srcs: tuple[UOp, ...] = (), arg: Any = None, cse: bool = True) -> UOp:
    key = (op, dtype, tuple(id(s) for s in srcs), arg if not isinstance(arg, float) else (arg, repr(arg)))
    if cse:
      for scope in reversed(self.scopes):
        if key in scope: return scope[key]
    uop = UOp(op, dtype, srcs, arg, len(self.uops))
    self.uops.append(uop)
    if cse: self.scopes[-1][key] = uop
    return uop

  def const(self, value: Any, dtype: DType) -> UOp:
    return self.emit(UOps.CONST, dtype, (), dtype.np(value).item())

  def open_loop(self, var: Var, extent: int) -> UOp:
    loop = self.emit(UOps.RANGE, self.idx_dtype, (), (var.name, extent), cse=False)
    self.vars[var.name] = loop
    self.scopes.append({})
    return loop

  def close_loop(self, loop: UOp) -> None:
    self.scopes.pop()
    self.emit(UOps.ENDRANGE, None, (loop,), cse=False)

  # -- index expressions --
  def index(self, node: Node) -> UOp:
    dt = self.idx_dtype
    if isinstance(node, Num): return self.const(node.value, dt)
    if isinstance(node, Var): return self.vars[node.name]
    if isinstance(node, Mul): return self.emit(UOps.ALU, dt, (self.index(node.a), self.const(node.b, dt)), BinaryOps.MUL)
    if isinstance(node, Div): return self.emit(UOps.ALU, dt, (self.index(node.a), self.const(node.b, dt)), BinaryOps.DIV)
    if isinstance(node, Mod): return self.emit(UOps.ALU, dt, (self.index(node.a), self.const(node.b, dt)), BinaryOps.MOD)
    if isinstance(node, Lt): return self.emit(UOps.ALU, dtypes.bool, (self.index(node.a), self.const(node.b, dt)), BinaryOps.CMPLT)
    # x >= b is b-1 < x for integers, so the IR needs only one comparison op
    if isinstance(node, Ge): return self.emit(UOps.ALU, dtypes.bool, (self.const(node.b - 1, dt), self.index(node.a)), BinaryOps.CMPLT)
    if isinstance(node, (Sum, And)):
      op, dtype = (BinaryOps.ADD, dt) if isinstance(node, Sum) else (BinaryOps.AND, dtypes.bool)
      acc = self.index(node.terms[0])
      for t in node.terms[1:]: acc = self.emit(UOps.ALU, dtype, (acc, self.index(t)), op)
      return acc
    raise TypeError(f"can't lower index node {node!r}")

  # -- the kernel --
  def lower(self) -> Program:
    store = self.ast
    out_shape = store.arg[1].shape
    full_shape = self.reduce.arg[1] if self.reduce is not None else out_shape
    reduce_axes = tuple(self.reduce.arg[0]) if self.reduce is not None else ()
    below = {id(n) for n in self.reduce.walk()} if self.reduce is not None else set()
    leaves = [n for n in store.walk() if n.op in (BufferOps.LOAD, BufferOps.CONST)] + [store]
    dims, views = simplify_dims(full_shape, reduce_axes, [_top(n.arg[1]) for n in leaves])
    names, counts = [], {True: 0, False: 0}
    for size, is_reduce in dims:
      names.append(f"{'r' if is_reduce else 'g'}idx{counts[is_reduce]}")
      counts[is_reduce] += 1
    loop_vars = [Var(n, 0, max(size - 1, 0)) for n, (size, _) in zip(names, dims)]
    full_idxs = list(loop_vars)
    out_idxs = [Num(0) if r else v for v, (_, r) in zip(loop_vars, dims)]

    # symbolic (index, valid) for every leaf, before choosing the index width
    self.exprs: dict[int, tuple[Node, Node | None]] = {}
    for node, view in zip(leaves, views):
      st = node.arg[1]
      if _all_invalid(st): self.exprs[id(node)] = (Num(0), Num(0)); continue
      idxs = full_idxs if id(node) in below else out_idxs
      index, valid = ShapeTracker(st.views[:-1] + (view,)).expr_idxs(idxs)
      valid = None if valid is None else to_node(valid)
      self.exprs[id(node)] = (to_node(index), valid)
    nodes = [e for pair in self.exprs.values() for e in pair if e is not None] + loop_vars
    self.idx_dtype = dtypes.int32 if fits_int32(nodes) and all(s < 2**31 for s, _ in dims) else dtypes.int64

    self.vars: dict[str, UOp] = {}
    bufs = {0: store.dtype}
    for n in leaves:
      if n.op is BufferOps.LOAD: bufs[n.arg[0]] = n.dtype
    self.globals = [self.emit(UOps.DEFINE_GLOBAL, bufs[i], (), (i, i == 0), cse=False) for i in sorted(bufs)]

    outer = [self.open_loop(v, s) for v, (s, r) in zip(loop_vars, dims) if not r]
    self.acc = None
    if self.reduce is not None: self.lower_reduce([(v, s) for v, (s, r) in zip(loop_vars, dims) if r])
    value = self.value(store.srcs[0])
    index, _ = self.exprs[id(store)]
    self.emit(UOps.STORE, None, (self.globals[0], self.index(index), value), cse=False)
    for loop in reversed(outer): self.close_loop(loop)
    return Program(self.name, self.uops, self.globals)

  def lower_reduce(self, loops: list[tuple[Var, int]]) -> None:
    op, dtype = self.reduce.op, self.reduce.dtype
    acc_dtype = _ACC_DTYPE.get(dtype, dtype) if op is ReduceOps.SUM else dtype
    acc = self.emit(UOps.DEFINE_ACC, acc_dtype, (), reduce_identity(op, acc_dtype), cse=False)
    opened = [self.open_loop(v, s) for v, s in loops]
    x = self.value(self.reduce.srcs[0])
    if acc_dtype != dtype: x = self.emit(UOps.ALU, acc_dtype, (x,), UnaryOps.CAST)
    alu = BinaryOps.ADD if op is ReduceOps.SUM else BinaryOps.MAX
    self.emit(UOps.ASSIGN, acc_dtype, (acc, self.emit(UOps.ALU, acc_dtype, (acc, x), alu, cse=False)), cse=False)
    for loop in reversed(opened): self.close_loop(loop)
    self.acc = acc if acc_dtype == dtype else self.emit(UOps.ALU, dtype, (acc,), UnaryOps.CAST, cse=False)

  def value(self, node: KernelNode) -> UOp:
    """The UOp holding `node`'s value at the current loop position."""
    if isinstance(node.op, ReduceOps): return self.acc
    if node.op is BufferOps.LOAD or node.op is BufferOps.CONST:
      index, valid = self.exprs[id(node)]
      if isinstance(valid, Num) and valid.value == 0: return self.const(0, node.dtype)
      gate = None if valid is None or isinstance(valid, Num) else self.index(valid)
      if node.op is BufferOps.CONST:
        value = self.const(node.arg[0], node.dtype)
        if gate is None: return value
        return self.emit(UOps.ALU, node.dtype, (gate, value, self.const(0, node.dtype)), TernaryOps.WHERE)
      srcs = (self.globals[node.arg[0]], self.index(index)) + ((gate,) if gate is not None else ())
      return self.emit(UOps.LOAD, node.dtype, srcs)
    srcs = tuple(self.value(s) for s in node.srcs)
    if node.op in (UnaryOps.CAST, UnaryOps.BITCAST): return self.emit(UOps.ALU, node.arg, srcs, node.op)
    if node.op in _FLOAT_ONLY and not node.dtype.is_float:
      # transcendental ops on integers compute in float64 and convert back, as numpy does
      x = self.emit(UOps.ALU, dtypes.float64, srcs, UnaryOps.CAST)
      y = self.emit(UOps.ALU, dtypes.float64, (x,), node.op)
      return self.emit(UOps.ALU, node.dtype, (y,), UnaryOps.CAST)
    return self.emit(UOps.ALU, node.dtype, srcs, node.op)


_FLOAT_ONLY = {UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN, UnaryOps.SQRT}


def linearize(ast: KernelNode, name: str) -> Program:
  """Lower a STORE-rooted kernel tree to linear IR."""
  if ast.op is not BufferOps.STORE: raise ValueError(f"linearize needs a STORE root, got {ast.op}")
  return _Lowerer(ast, name).lower()
