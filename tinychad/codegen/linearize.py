"""Lowering a kernel tree to linear IR: the passes in order, and the loop nest that holds them.

in: a kernel tree (STORE root, ALU ops, at most one reduce, LOAD/CONST/GATHER leaves with ShapeTrackers),
    the kernel's name and, optionally, its Opts
out: a Program (uops.py): a flat, typed list of UOps (loops, index arithmetic, guarded loads, ALU ops,
     accumulators, stores) in execution order, which every renderer reads.
The passes, each in its own file, share one Context (context.py) and are told where they stand by a
Place (its tail tile, its phase), never by flags:
  - analyze (analyze.py): simplify the dims, describe every leaf's access: what opt.py chooses from;
    opt.py then picks lanes (a caller may pass its own Opts: the BEAM search does, made from `opt_inputs`);
  - staging (staging.py): which load is copied into a scratch panel, and the copy inside the loops;
  - row cache (rowcache.py): which values a row reduce's second pass reads back from a scratch row;
  - reduce (reduce.py): the accumulators, the reduce loop and the partial sums folded;
  - values (values.py): a node's value at one lane; emission (emit.py): UOps with CSE per loop scope.
Here: the non-reduce loops in the chosen order (the first is `parallel`: the function takes its
[start, end) as two more int64 args), and in the innermost the reduce and the stores of every lane.
A tile whose rows don't divide their axis (opt.py's tail) is followed by one more tile of the rows
left over: the loops inside it are lowered twice, the second time with that axis's index fixed.
"""
from __future__ import annotations
from dataclasses import replace
from tinychad.dtype import DType, dtypes
from tinychad.helpers import prod
from tinychad.ops import Op, BinaryOps, ReduceOps, BufferOps, KernelNode, UnaryOps
from tinychad.codegen.analyze import Kernel, all_invalid, analyze, key_of
from tinychad.codegen.context import Context, Lane, Phase, Place, Tail
from tinychad.codegen.emit import Emitter
from tinychad.codegen.opt import STREAM_DTYPES, LeafAccess, Opts, choose_opts, reduce_size, stream_min_bytes
from tinychad.host import simd_bytes
from tinychad.codegen.reduce import lower_reduce
from tinychad.codegen.rowcache import cached_nodes, row_elements
from tinychad.codegen.staging import copy_panel, plan_stage
from tinychad.codegen.symbolic import Num, Var, to_node, fits_int32
from tinychad.codegen.uops import Program, UOps
from tinychad.codegen.values import consecutive, value


def _check_root(ast: KernelNode) -> None:
  if ast.op is not BufferOps.STORE: raise ValueError(f"linearize needs a STORE root, got {ast.op}")


def opt_inputs(ast: KernelNode) -> tuple[list[tuple[int, bool]], list[LeafAccess], set[DType], set[Op]]:
  """What opt.choose_opts (and opt.candidate_opts) take for this kernel: its simplified dims, one
  LeafAccess per LOAD/CONST/STORE, the dtypes and the ops it uses. An Opts chosen from them fits
  `linearize(ast, name, opts)`."""
  _check_root(ast)
  kernel = analyze(ast)
  return kernel.dims, kernel.access, kernel.dtypes_used, kernel.ops_used


def _loop_vars(kernel: Kernel, opts: Opts) -> list[Var]:
  """Per dim its loop variable, gidxN or ridxN, over the dim's whole tiles."""
  names, counts = [], {True: 0, False: 0}
  for _, is_reduce in kernel.dims:
    names.append(f"{'r' if is_reduce else 'g'}idx{counts[is_reduce]}")
    counts[is_reduce] += 1
  return [Var(n, 0, max(size // opts.upcast.get(d, 1) - 1, 0)) for d, (n, (size, _)) in enumerate(zip(names, kernel.dims))]


def _index_dtype(kernel: Kernel, loop_vars: list[Var]) -> DType:
  """int32 if every index fits it: each at lane 0 with the loops at full range (the lanes stay inside it)."""
  full = [Var(v.name, 0, max(s - 1, 0)) for v, (s, _) in zip(loop_vars, kernel.dims)]
  exprs = []
  for n in kernel.leaves:
    if all_invalid(n.arg[1]): continue
    idxs = [Num(0) if r and not kernel.walks_reduce_axes(n) else v for v, (_, r) in zip(full, kernel.dims)]
    index, valid = kernel.tracker(n).expr_idxs(idxs)
    exprs += [to_node(index)] + ([] if valid is None else [to_node(valid)])
    if n.op is BufferOps.GATHER: exprs.append(Num(n.arg[2] * n.arg[3]) + to_node(index))   # the last row
  return dtypes.int32 if fits_int32(exprs + full) and all(s < 2**31 for s, _ in kernel.dims) else dtypes.int64


def _context(kernel: Kernel, name: str, opts: Opts) -> Context:
  """The Context for lowering `kernel` under `opts`, its buffers and scratch arrays declared."""
  staged = plan_stage(kernel, opts, name)
  loop_vars = _loop_vars(kernel, opts)
  out = Emitter(_index_dtype(kernel, loop_vars))
  store = kernel.ast
  bufs = {0: store.dtype}
  for n in kernel.leaves:
    if n.op in (BufferOps.LOAD, BufferOps.GATHER): bufs[n.arg[0]] = n.dtype
  globals_ = [out.emit(UOps.DEFINE_GLOBAL, bufs[i], (), (i, i == 0), cse=False) for i in sorted(bufs)]
  panel = None
  if staged is not None:
    panel = out.emit(UOps.DEFINE_LOCAL, staged.node.dtype, (), reduce_size(kernel.dims) * staged.lanes, cse=False)
  row_cache = {node: out.emit(UOps.DEFINE_LOCAL, node.dtype, (), row_elements(kernel, opts), cse=False)
               for node in cached_nodes(kernel, opts, staged is not None)}
  # buffers are 64-byte aligned (device.py): a store at a multiple of its lanes is a whole aligned vector
  streams = opts.stream and store.dtype in STREAM_DTYPES and \
    prod(store.arg[1].shape) * store.dtype.itemsize >= stream_min_bytes()
  return Context(kernel, name, opts, out, loop_vars, globals_, staged, panel, row_cache, streams)


def _nest(ctx: Context, order: list[int], tail: Tail, parallel: int) -> int:
  """The loops over the non-reduce axes in `order`, outermost first, around the kernel's body. An
  axis whose unroll doesn't divide it (opt.py's tail) runs its whole tiles in the loop, then one
  more tile of the leftover lanes after it, with the loop variable fixed at the loop's end.
  `parallel`: the extent of the loop threads split, 0 while none is open; returned as it is after."""
  if ctx.staged is not None and len(ctx.opts.order) - len(order) == ctx.staged.depth: copy_panel(ctx, tail)
  if not order:
    _body(ctx, tail)
    return parallel
  d, rest = order[0], order[1:]
  amount, size = ctx.opts.upcast.get(d, 1), ctx.kernel.dims[d][0]
  extent, leftover = size // amount, size % amount
  # the tail runs after its axis's loop, once per call: a call that threads split must be inside a loop
  if leftover and not parallel: raise ValueError(f"{ctx.name}: axis {d} has a tail outside the loop threads split")
  if extent > 1:
    loop = ctx.out.open_loop(ctx.loop_vars[d], extent, parallel=not parallel)
    parallel = _nest(ctx, rest, tail, parallel or extent)
    ctx.out.close_loop(loop)
  elif extent == 1: parallel = _nest(ctx, rest, tail, parallel)
  if leftover: _nest(ctx, rest, tail + ((d, leftover),), parallel)
  return parallel


def _body(ctx: Context, tail: Tail) -> None:
  """The reduce (if any) and the stores of every lane, inside the non-reduce loops."""
  outer_lanes = ctx.lanes(False, tail)
  at = Place(tail, Phase.OUTSIDE, {}, {lane: i for i, lane in enumerate(outer_lanes)})
  if ctx.kernel.reduce is not None: at = replace(at, acc=lower_reduce(ctx, at))
  if ctx.kernel.row_pass:
    opened = ctx.open_reduce_loops()
    row = replace(at, phase=Phase.ROW)
    for outer_lane in outer_lanes:
      for row_lane in ctx.lanes(True, tail): _store(ctx, tuple(a + b for a, b in zip(outer_lane, row_lane)), row)
    ctx.close_loops(opened)
  else:
    for lane in outer_lanes: _store(ctx, lane, at)


def _store(ctx: Context, lane: Lane, at: Place) -> None:
  store, out = ctx.kernel.ast, ctx.out
  uop = value(ctx, store.srcs[0], lane, at)
  exprs = [ctx.leaf_expr(store, ln, at.tail) for ln in ctx.vector_lanes(lane)]
  if uop.vec > 1 and consecutive(exprs):
    stream = ctx.streams and uop.vec * store.dtype.itemsize == simd_bytes() and \
      key_of(exprs[0][0] % uop.vec) == key_of(Num(0))
    out.emit(UOps.STORE, None, (ctx.globals[0], out.index(exprs[0][0]), uop), "stream" if stream else None, cse=False)
    return
  # vector lanes along a reduce axis all land on one output element (and the value is a scalar)
  if all(key_of(e[0]) == key_of(exprs[0][0]) for e in exprs): exprs = exprs[:1]
  for i, (index, _) in enumerate(exprs):
    part = uop if uop.vec == 1 else out.emit(UOps.GEP, uop.dtype, (uop,), i)
    out.emit(UOps.STORE, None, (ctx.globals[0], out.index(index), part), cse=False)


def linearize(ast: KernelNode, name: str, opts: Opts | None = None) -> Program:
  """Lower a STORE-rooted kernel tree to linear IR, with the given lanes and loop order (`opts`,
  made for this kernel's opt_inputs) or else the ones opt.choose_opts picks."""
  _check_root(ast)
  kernel = analyze(ast)
  if opts is None: opts = choose_opts(kernel.dims, kernel.access, kernel.dtypes_used, kernel.ops_used)
  ctx = _context(kernel, name, opts)
  parallel = _nest(ctx, list(opts.order), (), 0)
  reduce = kernel.reduce
  contract = reduce is not None and reduce.op is ReduceOps.SUM and reduce.dtype.is_float and bool(opts.upcast)
  # fused multiply-adds change a recomputed value's last bit: a kernel that tests float equality (a
  # max's gradient asks which inputs equal the max another kernel computed) must round as they did
  if any(n.op in (BinaryOps.CMPEQ, BinaryOps.CMPNE) and n.srcs[0].dtype.is_float for n in ast.walk()): contract = False
  return Program(name, ctx.out.uops, ctx.globals, parallel, contract, _wraps(ast))


# signed integer ops that can overflow (numpy wraps; MIN / -1 and -MIN too), and a gather, whose row index (data)
# is multiplied into an index. The kernel's own index arithmetic never overflows: _index_dtype picks int64
# where int32 could
_WRAPPING_OPS = {BinaryOps.ADD, BinaryOps.SUB, BinaryOps.MUL, BinaryOps.DIV, BinaryOps.MOD, UnaryOps.NEG,
                 UnaryOps.RECIP, ReduceOps.SUM}


def _wraps(ast: KernelNode) -> bool:
  """Whether the kernel computes signed integers that may overflow: its C must be compiled to wrap them
  (gcc's induction variables and addressing are better without: a convolution ran ~20% faster)."""
  return any(n.op is BufferOps.GATHER or (n.op in _WRAPPING_OPS and n.dtype.is_int and not n.dtype.is_unsigned)
             for n in ast.walk())
