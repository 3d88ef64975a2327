"""Lowering a kernel tree to linear IR.

in: a kernel tree (STORE root, ALU ops, at most one reduce, LOAD/CONST leaves with ShapeTrackers)
    and the kernel's name
out: a Program: a flat, typed list of UOps (loops, index arithmetic, guarded loads, ALU ops,
     accumulators, stores) in execution order. Every renderer reads this one list, so the C and the
     LLVM backends cannot disagree about what a kernel computes.
Before lowering, size-1 axes are dropped and neighbouring axes that every view walks contiguously
are merged, so an elementwise kernel over a contiguous tensor becomes one flat loop. Then opt.py
picks lanes: dims that are unrolled (a register tile, several accumulators) and the dim whose lanes
form SIMD values (`vec` > 1); a caller may pass its own Opts instead (the BEAM search does, made from
`opt_inputs`). Each value is lowered once per unrolled lane; a leaf whose lanes read one element
stays scalar (broadcast by its users), consecutive elements become one vector load, and anything
else loads each lane and gathers them (VECTORIZE), so every view pattern stays correct.
The first non-reduce loop is `parallel`: the function takes its [start, end) as two more int64 args.
A tile whose rows don't divide their axis (opt.py's tail) is followed by one more tile of the rows
left over: the loops inside it are lowered twice, the second time with that axis's index fixed.
A row reduce's second pass (the kernel loops over the row again to store it) reads the costly values
its reduce loop computed (softmax's exp: opt.py's `cache_rows`) from a scratch row the reduce loop
wrote them to, instead of computing them again:
  for row: { for i: local[i] = exp(x[i] - m); s += local[i]  ...  for i: out[i] = local[i] * (1/s) }
A staged load (opt.py's `stage`: B in a matmul) is copied into a scratch array (DEFINE_LOCAL, on the
stack of the thread running the call) inside the last outer loop it moves along, by a loop over the
reduce indices that reads it in vector rows; the register tile below then reads that panel:
  for panel: { for k: local[k*64 : k*64+64] = B[k, panel*64 : +64];  for rows: { for k: acc += A * local[k*64 ...] } }
"""
from __future__ import annotations
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any
from tinychad.dtype import VECTOR_FLOATS, DType, dtypes
from tinychad.helpers import prod
from tinychad.ops import OP_INFO, Op, UnaryOps, BinaryOps, TernaryOps, ReduceOps, BufferOps, KernelNode
from tinychad.view import ShapeTracker, View
from tinychad.codegen.symbolic import Node, Num, Var, Sum, Mul, Div, Mod, Lt, Ge, And, to_node, fits_int32
from tinychad.codegen.opt import (STREAM_DTYPES, LeafAccess, Opts, choose_opts, panel_strides, reduce_size, simd_bytes,
                                  stage_depth, staging_fits, stream_min_bytes)


class UOps(Enum):
  DEFINE_GLOBAL = auto()  # a kernel argument: arg = (buffer number, writable)
  DEFINE_LOCAL = auto()   # a scratch array of the thread running the call: arg = elements; 64-byte aligned
  CONST = auto()          # a literal: arg = value; with vec > 1 the value in every lane
  RANGE = auto()          # open a loop: arg = (variable name, extent, parallel, unroll); a parallel loop runs
                          # [start, end); unroll > 1 asks the compiler to repeat the body that many times
  ENDRANGE = auto()       # close the loop in srcs[0]
  LOAD = auto()           # srcs = (buffer, index) or (buffer, index, gate); a false gate reads 0
  ALU = auto()            # arg = the op (UnaryOps/BinaryOps/TernaryOps); CAST/BITCAST convert to dtype
  DEFINE_ACC = auto()     # a reduce accumulator: arg = its initial value
  ASSIGN = auto()         # srcs = (accumulator, value): the accumulator takes the value
  STORE = auto()          # srcs = (buffer, index, value); arg "stream": a whole aligned SIMD vector that
                          # goes straight to memory, not through the cache (opt.py's `stream`)
  VECTORIZE = auto()      # srcs = one scalar per lane: the vector of them
  GEP = auto()            # srcs = (vector,), arg = lane: that lane as a scalar


@dataclass(eq=False)
class UOp:
  op: UOps
  dtype: DType | None
  srcs: tuple[UOp, ...] = ()
  arg: Any = None
  vec: int = 1                                   # lanes: > 1 is a SIMD value (loads/stores then touch vec consecutive elements)
  num: int = field(default=-1, compare=False)   # position in the program, set when emitted


@dataclass
class Program:
  name: str
  uops: list[UOp]
  globals: list[UOp]      # DEFINE_GLOBALs in argument order: output first, then inputs by number
  parallel: int = 0       # extent of the loop threads may split (its [start, end) are the last two arguments); 0: none
  contract: bool = False  # a float sum reordered into partial sums anyway: fused multiply-add is welcome

  def pretty(self) -> str:
    """One instruction per line: number, op, dtype, sources, argument."""
    lines = [f"kernel {self.name}"]
    depth = 0
    for u in self.uops:
      if u.op is UOps.ENDRANGE: depth -= 1
      dtype = (u.dtype.name + (f"x{u.vec}" if u.vec > 1 else "")) if u.dtype is not None else ""
      srcs = ",".join(str(s.num) for s in u.srcs)
      arg = u.arg.name if isinstance(u.arg, Enum) else ("" if u.arg is None else u.arg)
      lines.append(f"{u.num:4d} {'  ' * depth}{u.op.name:<13s} {dtype:<8s} ({srcs}) {arg}".rstrip())
      if u.op is UOps.RANGE: depth += 1
    return "\n".join(lines)


# float16 sums accumulate in float32, like numpy's half reductions
_ACC_DTYPE = {dtypes.float16: dtypes.float32}
# a row pass reads back a value of its reduce loop only if computing it again costs more than a load
# from L1: a polynomial or a division. Softmax 4096x4096: the row kernel 12.3 -> 11.4 ms on one thread,
# 6.3 -> 5.5 ms on two, where it now waits on memory
_ROW_CACHE_OPS = {op for op, info in OP_INFO.items() if info.costly}
_ROW_CACHE_DTYPES = VECTOR_FLOATS
# the scratch row lives on the stack, next to the row of input the pass reads again from L1/L2
ROW_CACHE_MAX_BYTES = 64 * 1024


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

Lane = tuple[int, ...]     # the unrolled offset along every dim (0 on dims that aren't upcast)


class _Lowerer:
  def __init__(self, ast: KernelNode, name: str):
    self.ast, self.name = ast, name
    self.uops: list[UOp] = []
    # one CSE table per open loop: a value made inside a loop can't be used after it closes
    self.scopes: list[dict] = [{}]
    self.reduce = next((n for n in ast.walk() if isinstance(n.op, ReduceOps)), None)
    self.tail: dict[int, int] = {}     # axis -> lanes of its tail tile, while the tail is lowered

  # -- emission with common-subexpression elimination --
  def emit(self, op: UOps, dtype: DType | None, srcs: tuple[UOp, ...] = (), arg: Any = None, cse: bool = True, vec: int = 1) -> UOp:
    key = (op, dtype, vec, tuple(id(s) for s in srcs), arg if not isinstance(arg, float) else (arg, repr(arg)))
    if cse:
      for scope in reversed(self.scopes):
        if key in scope: return scope[key]
    uop = UOp(op, dtype, srcs, arg, vec, len(self.uops))
    self.uops.append(uop)
    if cse: self.scopes[-1][key] = uop
    return uop

  def const(self, value: Any, dtype: DType) -> UOp:
    return self.emit(UOps.CONST, dtype, (), dtype.np(value).item())

  def open_loop(self, var: Var, extent: int, parallel: bool = False, unroll: int = 1) -> UOp:
    loop = self.emit(UOps.RANGE, self.idx_dtype, (), (var.name, extent, parallel, unroll), cse=False)
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

  # -- symbolic index of a leaf at one lane --
  def leaf_expr(self, node: KernelNode, lane: Lane) -> tuple[Node, Node | None]:
    key = (id(node), lane, tuple(self.tail.items()))
    if key not in self.expr_cache:
      st, view = node.arg[1], self.views[id(node)]
      if _all_invalid(st): self.expr_cache[key] = (Num(0), Num(0))
      else:
        # outside the reduce, a reduce axis is 0 (the output has size 1 there), or in a row reduce's
        # second pass, where the loop over the row runs again
        flat = id(node) not in self.below and not self.row_pass
        idxs = [Num(0) if r and flat else self.dim_index(d, lane[d]) for d, (_, r) in enumerate(self.dims)]
        index, valid = ShapeTracker(st.views[:-1] + (view,)).expr_idxs(idxs)
        self.expr_cache[key] = (to_node(index), None if valid is None else to_node(valid))
    return self.expr_cache[key]

  def strides(self, node: KernelNode) -> tuple[int | None, ...]:
    """Per dim, how far node's index moves when that dim steps by one (None: not a constant step or the
    validity changes). One view gives it directly; stacked views are asked symbolically."""
    st, view = node.arg[1], self.views[id(node)]
    # a gathered row moves with its index wherever row 0's view stands still: not a known step there
    if node.op is BufferOps.GATHER: return tuple(None if stride == 0 else stride for stride in view.strides)
    if len(st.views) == 1: return view.strides
    below, out = id(node) in self.below, []
    for d, (size, is_reduce) in enumerate(self.dims):
      if (is_reduce and not below) or size < 2: out.append(0); continue
      pair = []
      for shift in (0, 1):
        idxs = [Num(0) if r and not below else Var(f"d{i}", 0, s - 1 - (i == d)) + (shift if i == d else 0)
                for i, (s, r) in enumerate(self.dims)]
        index, valid = ShapeTracker(st.views[:-1] + (view,)).expr_idxs(idxs)
        pair.append((to_node(index), None if valid is None else to_node(valid)))
      step = pair[1][0] - pair[0][0]
      same_valid = _key(pair[0][1]) == _key(pair[1][1])
      out.append(step.value if isinstance(step, Num) and same_valid else None)
    return tuple(out)

  def dim_index(self, d: int, offset: int) -> Node:
    amount = self.opts.upcast.get(d, 1)
    if d in self.tail: return Num(self.dims[d][0] // amount * amount + offset)
    if self.dims[d][0] < 2 * amount: return Num(offset)       # at most one whole tile: no loop
    return self.loop_vars[d] * amount + offset if amount > 1 else self.loop_vars[d]

  def vector_lanes(self, lane: Lane) -> list[Lane]:
    """The lanes one SIMD value at `lane` covers (just `lane` without a vector axis)."""
    if self.opts.vector is None: return [lane]
    d, width = self.opts.vector
    return [lane[:d] + (lane[d] + i,) + lane[d + 1:] for i in range(width)]

  def lanes(self, reduce: bool) -> list[Lane]:
    """Every unrolled lane over the upcast dims of one kind (reduce or not); vector lanes step by the width."""
    out = [tuple(0 for _ in self.dims)]
    for d, amount in self.opts.upcast.items():
      if self.dims[d][1] != reduce: continue
      amount = self.tail.get(d, amount)
      step = self.opts.vector[1] if self.opts.vector is not None and self.opts.vector[0] == d else 1
      out = [ln[:d] + (off,) + ln[d + 1:] for ln in out for off in range(0, amount, step)]
    return out

  # -- the kernel --
  def analyze(self) -> tuple[list[tuple[int, bool]], list[LeafAccess], set[DType], set[Op]]:
    """Simplify the dims and describe the leaves: the arguments of opt.choose_opts."""
    store = self.ast
    out_shape = store.arg[1].shape
    full_shape = self.reduce.arg[1] if self.reduce is not None else out_shape
    reduce_axes = tuple(self.reduce.arg[0]) if self.reduce is not None else ()
    self.below = {id(n) for n in self.reduce.walk()} if self.reduce is not None else set()
    # a row reduce (engine/schedule.py): the output spans the reduce axes, so after the reduce loop
    # closes, the kernel loops over them again to compute and store every element of the row
    self.row_pass = self.reduce is not None and out_shape == full_shape
    self.leaves = [n for n in store.walk() if n.op in (BufferOps.LOAD, BufferOps.CONST, BufferOps.GATHER)] + [store]
    self.dims, views = simplify_dims(full_shape, reduce_axes, [_top(n.arg[1]) for n in self.leaves])
    self.views = {id(n): v for n, v in zip(self.leaves, views)}
    nodes = store.walk()
    access = [LeafAccess(self.strides(n), n.op in (BufferOps.LOAD, BufferOps.GATHER), n is store, id(n) in self.below,
                         n.dtype.itemsize, n.op is BufferOps.GATHER) for n in self.leaves]
    dtypes_used = {n.dtype for n in nodes} | {n.arg for n in nodes if n.op is UnaryOps.CAST}
    return self.dims, access, dtypes_used, {n.op for n in nodes}

  def lower(self, opts: Opts | None = None) -> Program:
    store, inputs = self.ast, self.analyze()
    leaves = self.leaves
    self.opts = opts if opts is not None else choose_opts(*inputs)
    self.staged: KernelNode | None = None
    if self.opts.stage is not None:
      access = inputs[1]
      if not staging_fits(self.dims, access, self.opts, self.opts.stage):
        raise ValueError(f"{self.name}: leaf {self.opts.stage} can't be staged under {self.opts}")
      self.staged, self.stage_at = leaves[self.opts.stage], stage_depth(self.dims, access[self.opts.stage], self.opts)
    self.reducing = False    # lowering the reduce's body, where the staged load reads its panel
    names, counts = [], {True: 0, False: 0}
    for size, is_reduce in self.dims:
      names.append(f"{'r' if is_reduce else 'g'}idx{counts[is_reduce]}")
      counts[is_reduce] += 1
    self.loop_vars = [Var(n, 0, max(size // self.opts.upcast.get(d, 1) - 1, 0)) for d, (n, (size, _)) in enumerate(zip(names, self.dims))]

    # the index width: every index at lane 0 with the loops at full range (the lanes stay inside it)
    self.expr_cache: dict = {}
    full = [Var(v.name, 0, max(s - 1, 0)) for v, (s, _) in zip(self.loop_vars, self.dims)]
    exprs = []
    for n in leaves:
      if _all_invalid(n.arg[1]): continue
      idxs = [Num(0) if r and id(n) not in self.below and not self.row_pass else v for v, (_, r) in zip(full, self.dims)]
      index, valid = ShapeTracker(n.arg[1].views[:-1] + (self.views[id(n)],)).expr_idxs(idxs)
      exprs += [to_node(index)] + ([] if valid is None else [to_node(valid)])
      if n.op is BufferOps.GATHER: exprs.append(Num(n.arg[2] * n.arg[3]) + to_node(index))   # the last row
    self.idx_dtype = dtypes.int32 if fits_int32(exprs + full) and all(s < 2**31 for s, _ in self.dims) else dtypes.int64

    self.vars: dict[str, UOp] = {}
    bufs = {0: store.dtype}
    for n in leaves:
      if n.op in (BufferOps.LOAD, BufferOps.GATHER): bufs[n.arg[0]] = n.dtype
    self.globals = [self.emit(UOps.DEFINE_GLOBAL, bufs[i], (), (i, i == 0), cse=False) for i in sorted(bufs)]
    if self.staged is not None:
      self.panel_lanes = self.opts.upcast[self.opts.vector[0]]
      self.local = self.emit(UOps.DEFINE_LOCAL, self.staged.dtype, (), reduce_size(self.dims) * self.panel_lanes, cse=False)
    self.row_cache = {node: self.emit(UOps.DEFINE_LOCAL, node.dtype, (), self.row_cache_elements(), cse=False)
                      for node in self.row_cached_nodes()}
    self.row_cache_vec: dict = {}    # (node, lane, tail) -> lanes of the value the reduce loop wrote
    self.row_reading = False         # lowering the row pass, where cached values are loaded
    # buffers are 64-byte aligned (device.py): a store at a multiple of its lanes is a whole aligned vector
    self.streams = self.opts.stream and store.dtype in STREAM_DTYPES and \
      prod(store.arg[1].shape) * store.dtype.itemsize >= stream_min_bytes()

    # loops: the non-reduce ones in the chosen order (the first is split across threads), then the reduce
    self.parallel = 0
    self.nest(list(self.opts.order))
    contract = self.reduce is not None and self.reduce.op is ReduceOps.SUM and self.reduce.dtype.is_float and bool(self.opts.upcast)
    # fused multiply-adds change a recomputed value's last bit: a kernel that tests float equality (a
    # max's gradient asks which inputs equal the max another kernel computed) must round as they did
    if any(n.op in (BinaryOps.CMPEQ, BinaryOps.CMPNE) and n.srcs[0].dtype.is_float for n in self.ast.walk()): contract = False
    return Program(self.name, self.uops, self.globals, self.parallel, contract)

  def nest(self, order: list[int]) -> None:
    """The loops over the non-reduce axes in `order`, outermost first, around the kernel's body. An
    axis whose unroll doesn't divide it (opt.py's tail) runs its whole tiles in the loop, then one
    more tile of the leftover lanes after it, with the loop variable fixed at the loop's end."""
    if self.staged is not None and len(self.opts.order) - len(order) == self.stage_at: self.stage()
    if not order:
      self.body()
      return
    d, rest = order[0], order[1:]
    amount, size = self.opts.upcast.get(d, 1), self.dims[d][0]
    extent, leftover = size // amount, size % amount
    # the tail runs after its axis's loop, once per call: a call that threads split must be inside a loop
    if leftover and not self.parallel: raise ValueError(f"{self.name}: axis {d} has a tail outside the loop threads split")
    if extent > 1:
      loop = self.open_loop(self.loop_vars[d], extent, parallel=not self.parallel)
      if not self.parallel: self.parallel = extent
      self.nest(rest)
      self.close_loop(loop)
    elif extent == 1: self.nest(rest)
    if leftover:
      self.tail[d] = leftover
      self.nest(rest)
      del self.tail[d]

  def body(self) -> None:
    """The reduce (if any) and the stores of every lane, inside the non-reduce loops."""
    store = self.ast
    self.acc: dict[Lane, UOp] = {}
    self.outer_slots = {lane: i for i, lane in enumerate(self.lanes(reduce=False))}
    if self.reduce is not None: self.lower_reduce()
    if self.row_pass:
      opened = self.open_reduce_loops()
      self.row_reading = True
      for outer_lane in self.lanes(reduce=False):
        for row_lane in self.lanes(reduce=True): self.store(store, tuple(a + b for a, b in zip(outer_lane, row_lane)))
      self.row_reading = False
      for loop in reversed(opened): self.close_loop(loop)
    else:
      for lane in self.lanes(reduce=False): self.store(store, lane)

  def store(self, store: KernelNode, lane: Lane) -> None:
    value = self.value(store.srcs[0], lane)
    exprs = [self.leaf_expr(store, ln) for ln in self.vector_lanes(lane)]
    if value.vec > 1 and _consecutive(exprs):
      stream = self.streams and value.vec * store.dtype.itemsize == simd_bytes() and _key(exprs[0][0] % value.vec) == _key(Num(0))
      self.emit(UOps.STORE, None, (self.globals[0], self.index(exprs[0][0]), value), "stream" if stream else None, cse=False)
      return
    # vector lanes along a reduce axis all land on one output element (and the value is a scalar)
    if all(_key(e[0]) == _key(exprs[0][0]) for e in exprs): exprs = exprs[:1]
    for i, (index, _) in enumerate(exprs):
      part = value if value.vec == 1 else self.emit(UOps.GEP, value.dtype, (value,), i)
      self.emit(UOps.STORE, None, (self.globals[0], self.index(index), part), cse=False)

  def reduce_extents(self) -> list[tuple[int, int]]:
    """(dim, loop extent) of every reduce dim that has a loop."""
    extents = [(d, s // self.opts.upcast.get(d, 1)) for d, (s, r) in enumerate(self.dims) if r]
    return [(d, extent) for d, extent in extents if extent != 1]

  def open_reduce_loops(self) -> list[UOp]:
    extents = self.reduce_extents()
    # the unroll hint goes on the innermost loop, whose body is the one the hint repeats
    return [self.open_loop(self.loop_vars[d], extent, unroll=self.opts.unroll if i == len(extents) - 1 else 1)
            for i, (d, extent) in enumerate(extents)]

  # -- the row cache --
  def row_cached_nodes(self) -> list[KernelNode]:
    """The values the row pass would compute again: the topmost nodes of the store's tree outside the
    reduce that are also inside the reduce's body and hold a costly op (softmax's exp)."""
    if not self.row_pass or not self.opts.cache_rows or self.staged is not None: return []
    # (a row pass's store runs along the row, so its SIMD lanes never lie along an outer axis)
    vector = self.opts.vector
    if vector is not None and not self.dims[vector[0]][1]: return []
    # a row the lanes cover whole has no loop: its pass reuses the reduce's values in registers
    if not self.reduce_extents(): return []
    found, seen, stack = [], set(), [self.ast.srcs[0]]
    while stack:
      node = stack.pop()
      if node in seen or isinstance(node.op, ReduceOps): continue
      seen.add(node)
      if id(node) in self.below and node.dtype in _ROW_CACHE_DTYPES and any(n.op in _ROW_CACHE_OPS for n in node.walk()):
        found.append(node)
      else: stack.extend(node.srcs)
    if sum(node.dtype.itemsize for node in found) * self.row_cache_elements() > ROW_CACHE_MAX_BYTES: return []
    return found

  def row_cache_elements(self) -> int:
    """Elements of one scratch row: every reduce position, for every outer lane (a row per output lane)."""
    return len(self.lanes(reduce=False)) * reduce_size(self.dims)

  def row_slot(self, lane: Lane) -> UOp:
    """Where the value at `lane` sits in its scratch row: the outer lane's row, then the reduce position
    row-major with the vector axis innermost, so that the lanes of a SIMD value are consecutive."""
    reduce_dims = [d for d, (_, r) in enumerate(self.dims) if r]
    if self.opts.vector is not None: reduce_dims = [d for d in reduce_dims if d != self.opts.vector[0]] + [self.opts.vector[0]]
    outer = tuple(0 if r else x for x, (_, r) in zip(lane, self.dims))
    index: Node = Num(self.outer_slots[outer] * reduce_size(self.dims))
    step = 1
    for d in reversed(reduce_dims):
      index = index + self.dim_index(d, lane[d]) * step
      step *= self.dims[d][0]
    return self.index(index)

  def row_cached_value(self, node: KernelNode, lane: Lane) -> UOp:
    """`node` at `lane`: loaded from its scratch row in the row pass, else computed (and written to the
    scratch row by the reduce loop)."""
    local, key = self.row_cache[node], (node, lane, tuple(self.tail.items()))
    if self.row_reading and key in self.row_cache_vec:
      return self.emit(UOps.LOAD, node.dtype, (local, self.row_slot(lane)), vec=self.row_cache_vec[key])
    value = self._value(node, lane)
    if self.reducing:
      self.row_cache_vec[key] = value.vec
      self.emit(UOps.STORE, None, (local, self.row_slot(lane), value), cse=False)
    return value

  # -- the staged panel --
  def panel_index(self, lane: Lane) -> Node:
    """Where the staged load's element at `lane` sits in the panel: reduce index (row-major over the
    reduce dims, at the open reduce loops) times the panel's lanes, plus the lane along the vector axis."""
    index: Node = Num(lane[self.opts.vector[0]])
    for d, step in panel_strides(self.dims, self.panel_lanes).items(): index = index + self.dim_index(d, 0) * step
    return index

  def stage(self) -> None:
    """Copy the staged load's panel for the loops open now into the scratch array, one vector row
    of the tile per reduce index. The dims it doesn't move along (the tile's, not open yet) are 0."""
    node, (vec, width) = self.staged, self.opts.vector
    st, view = node.arg[1], self.views[id(node)]
    picked = set(self.opts.order[:self.stage_at])
    opened = [self.open_loop(self.loop_vars[d], extent) for d, extent in self.reduce_extents()]
    for offset in range(0, self.panel_lanes, width):
      lane = tuple(offset if d == vec else 0 for d in range(len(self.dims)))
      exprs = []
      for ln in self.vector_lanes(lane):
        idxs = [self.dim_index(d, ln[d]) if r or d in picked else Num(0) for d, (_, r) in enumerate(self.dims)]
        index, valid = ShapeTracker(st.views[:-1] + (view,)).expr_idxs(idxs)
        exprs.append((to_node(index), None if valid is None else to_node(valid)))
      row = self.read(node, exprs)
      self.emit(UOps.STORE, None, (self.local, self.index(self.panel_index(lane)), row), cse=False)
    for loop in reversed(opened): self.close_loop(loop)

  def lower_reduce(self) -> None:
    op, dtype = self.reduce.op, self.reduce.dtype
    acc_dtype = _ACC_DTYPE.get(dtype, dtype) if op is ReduceOps.SUM else dtype
    alu = BinaryOps.ADD if op is ReduceOps.SUM else BinaryOps.MAX
    vec = self.opts.vector[1] if self.opts.vector is not None else 1
    outer_lanes, inner_lanes = self.lanes(reduce=False), self.lanes(reduce=True)
    # one accumulator per (output lane, reduce lane): independent chains the CPU can overlap
    accs = {(o, r): self.emit(UOps.DEFINE_ACC, acc_dtype, (), OP_INFO[op].identity(acc_dtype), cse=False, vec=vec)
            for o in outer_lanes for r in inner_lanes}
    opened = self.open_reduce_loops()
    self.reducing = True
    for o in outer_lanes:
      for r in inner_lanes:
        lane = tuple(a + b for a, b in zip(o, r))
        x = self.value(self.reduce.srcs[0], lane)
        if acc_dtype != dtype: x = self.emit(UOps.ALU, acc_dtype, (x,), UnaryOps.CAST, vec=x.vec)
        acc = accs[(o, r)]
        self.emit(UOps.ASSIGN, acc_dtype, (acc, self.emit(UOps.ALU, acc_dtype, (acc, x), alu, cse=False, vec=vec)), cse=False, vec=vec)
    self.reducing = False
    for loop in reversed(opened): self.close_loop(loop)
    vector_is_reduce = self.opts.vector is not None and self.dims[self.opts.vector[0]][1]
    for o in outer_lanes:
      total = accs[(o, inner_lanes[0])]
      for r in inner_lanes[1:]: total = self.emit(UOps.ALU, acc_dtype, (total, accs[(o, r)]), alu, cse=False, vec=vec)
      if vector_is_reduce:
        # the lanes of a reduce-axis vector are partial results of one output: fold them
        parts = [self.emit(UOps.GEP, acc_dtype, (total,), i) for i in range(vec)]
        while len(parts) > 1:
          parts = [self.emit(UOps.ALU, acc_dtype, (parts[i], parts[i + 1]), alu, cse=False) for i in range(0, len(parts), 2)]
        total = parts[0]
      self.acc[o] = total if acc_dtype == dtype else self.emit(UOps.ALU, dtype, (total,), UnaryOps.CAST, cse=False, vec=total.vec)

  def leaf(self, node: KernelNode, lane: Lane) -> UOp:
    """A LOAD or CONST at `lane`; inside the reduce, the staged load reads its panel instead."""
    if node is self.staged and self.reducing:
      return self.emit(UOps.LOAD, node.dtype, (self.local, self.index(self.panel_index(lane))), vec=len(self.vector_lanes(lane)))
    return self.read(node, [self.leaf_expr(node, ln) for ln in self.vector_lanes(lane)])

  def read(self, node: KernelNode, exprs: list[tuple[Node, Node | None]]) -> UOp:
    """`node` read at one index (and validity) per vector lane: one scalar when every lane reads the
    same element, one vector load when they read consecutive elements under one gate, else a scalar
    per lane gathered."""
    if node.op is BufferOps.CONST:
      if all(_key(e[1]) == _key(exprs[0][1]) for e in exprs): return self.scalar_leaf(node, exprs[0])
    elif all(_key(e[0]) == _key(exprs[0][0]) and _key(e[1]) == _key(exprs[0][1]) for e in exprs):
      return self.scalar_leaf(node, exprs[0])
    elif _consecutive(exprs):
      return self.scalar_leaf(node, exprs[0], vec=len(exprs))
    parts = tuple(self.scalar_leaf(node, e) for e in exprs)
    return self.emit(UOps.VECTORIZE, node.dtype, parts, vec=len(parts))

  def gather(self, node: KernelNode, lane: Lane) -> UOp:
    """A GATHER at `lane`: row 0's element plus the row index times the row stride, loaded where the
    index is inside the table (0 elsewhere); one vector load when the lanes read consecutive elements
    of one row, as along an embedding's row."""
    lanes = self.vector_lanes(lane)
    exprs = [self.leaf_expr(node, ln) for ln in lanes]
    rows = [self.value(node.srcs[0], ln) for ln in lanes]
    if all(row is rows[0] for row in rows) and rows[0].vec == 1 and _consecutive(exprs):
      return self.gathered_load(node, exprs[0], rows[0], len(lanes))
    if rows[0].vec > 1: rows = [self.emit(UOps.GEP, rows[0].dtype, (rows[0],), i) for i in range(len(lanes))]
    parts = tuple(self.gathered_load(node, expr, row, 1) for expr, row in zip(exprs, rows))
    return parts[0] if len(parts) == 1 else self.emit(UOps.VECTORIZE, node.dtype, parts, vec=len(parts))

  def gathered_load(self, node: KernelNode, expr: tuple[Node, Node | None], row: UOp, vec: int) -> UOp:
    _, _, row_stride, rows = node.arg
    def alu(dtype: DType, op: Op, *srcs: UOp) -> UOp: return self.emit(UOps.ALU, dtype, srcs, op)
    # the bounds are checked in the index's own dtype, before a narrowing cast could wrap it inside
    inside = alu(dtypes.bool, BinaryOps.AND, alu(dtypes.bool, BinaryOps.CMPLT, self.const(-1, row.dtype), row),
                 alu(dtypes.bool, BinaryOps.CMPLT, row, self.const(rows, row.dtype)))
    if expr[1] is not None: inside = alu(dtypes.bool, BinaryOps.AND, inside, self.index(expr[1]))
    if row.dtype != self.idx_dtype: row = alu(self.idx_dtype, UnaryOps.CAST, row)
    offset = alu(self.idx_dtype, BinaryOps.MUL, row, self.const(row_stride, self.idx_dtype))
    index = alu(self.idx_dtype, BinaryOps.ADD, self.index(expr[0]), offset)
    return self.emit(UOps.LOAD, node.dtype, (self.globals[node.arg[0]], index, inside), vec=vec)

  def scalar_leaf(self, node: KernelNode, expr: tuple[Node, Node | None], vec: int = 1) -> UOp:
    index, valid = expr
    if isinstance(valid, Num) and valid.value == 0: return self.const(0, node.dtype)
    gate = None if valid is None or isinstance(valid, Num) else self.index(valid)
    if node.op is BufferOps.CONST:
      value = self.const(node.arg[0], node.dtype)
      if gate is None: return value
      return self.emit(UOps.ALU, node.dtype, (gate, value, self.const(0, node.dtype)), TernaryOps.WHERE)
    srcs = (self.globals[node.arg[0]], self.index(index)) + ((gate,) if gate is not None else ())
    return self.emit(UOps.LOAD, node.dtype, srcs, vec=vec)

  def value(self, node: KernelNode, lane: Lane) -> UOp:
    """The UOp holding `node`'s value at the current loop position and `lane`."""
    if isinstance(node.op, ReduceOps): return self.acc[tuple(0 if r else x for x, (_, r) in zip(lane, self.dims))]
    # remembered in the CSE scopes: a tree is a DAG (a value read by several ops), and walking it
    # as a tree would lower a shared subtree once per path to it, exponentially often. The tail tile
    # is part of the key: a tile without a loop of its own shares its scope with the tail after it,
    # whose lanes have the same offsets but other rows
    key = ("value", node, lane, tuple(self.tail.items()))
    for scope in reversed(self.scopes):
      if key in scope: return scope[key]
    uop = self.row_cached_value(node, lane) if node in self.row_cache else self._value(node, lane)
    self.scopes[-1][key] = uop
    return uop

  def _value(self, node: KernelNode, lane: Lane) -> UOp:
    if node.op is BufferOps.LOAD or node.op is BufferOps.CONST: return self.leaf(node, lane)
    if node.op is BufferOps.GATHER: return self.gather(node, lane)
    srcs = tuple(self.value(s, lane) for s in node.srcs)
    vec = max(s.vec for s in srcs)
    if node.op in (UnaryOps.CAST, UnaryOps.BITCAST): return self.emit(UOps.ALU, node.arg, srcs, node.op, vec=vec)
    if node.op in _FLOAT_ONLY and not node.dtype.is_float:
      # transcendental ops on integers compute in float64 and convert back, as numpy does
      x = self.emit(UOps.ALU, dtypes.float64, srcs, UnaryOps.CAST, vec=vec)
      y = self.emit(UOps.ALU, dtypes.float64, (x,), node.op, vec=vec)
      return self.emit(UOps.ALU, node.dtype, (y,), UnaryOps.CAST, vec=vec)
    return self.emit(UOps.ALU, node.dtype, srcs, node.op, vec=vec)


def _key(node: Node | None): return None if node is None else node.key


def _consecutive(exprs: list[tuple[Node, Node | None]]) -> bool:
  """The lanes read elements index0, index0+1, ... under one validity condition."""
  first_index, first_valid = exprs[0]
  for i, (index, valid) in enumerate(exprs):
    if _key(valid) != _key(first_valid): return False
    step = index - first_index
    if not (isinstance(step, Num) and step.value == i): return False
  return True


_FLOAT_ONLY = {op for op, info in OP_INFO.items() if info.float_only}


def _check_root(ast: KernelNode) -> None:
  if ast.op is not BufferOps.STORE: raise ValueError(f"linearize needs a STORE root, got {ast.op}")


def opt_inputs(ast: KernelNode) -> tuple[list[tuple[int, bool]], list[LeafAccess], set[DType], set[Op]]:
  """What opt.choose_opts (and opt.candidate_opts) take for this kernel: its simplified dims, one
  LeafAccess per LOAD/CONST/STORE, the dtypes and the ops it uses. An Opts chosen from them fits
  `linearize(ast, name, opts)`."""
  _check_root(ast)
  return _Lowerer(ast, "").analyze()


def linearize(ast: KernelNode, name: str, opts: Opts | None = None) -> Program:
  """Lower a STORE-rooted kernel tree to linear IR, with the given lanes and loop order (`opts`,
  made for this kernel's opt_inputs) or else the ones opt.choose_opts picks."""
  _check_root(ast)
  return _Lowerer(ast, name).lower(opts)
