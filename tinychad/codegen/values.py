"""The values pass: a kernel tree's value at one lane, as UOps.

in: a Context, a node of the kernel tree, a lane and a Place (context.py)
out: the UOp holding the node's value there, its sources emitted before it
Each value is lowered once per unrolled lane; a leaf whose lanes read one element stays scalar
(broadcast by its users), consecutive elements become one vector load, a transposed load in a transpose
block (opt.py's `transposed`) reads whole vectors along its own axis and shuffles them into place, and
anything else loads each lane and gathers them (VECTORIZE), so every view pattern stays correct. A lowered value is remembered
in the emitter's CSE scopes under (node, lane, tail): a tree is a DAG (a value read by several ops), and
lowering it as a tree would lower a shared subtree once per path to it, exponentially often. The tail
tile is part of the key: a tile without a loop of its own shares its scope with the tail after it,
whose lanes have the same offsets but other rows.
"""
from __future__ import annotations
from typing import Callable
from tinychad.dtype import DType, dtypes
from tinychad.helpers import toposort
from tinychad.ops import OP_INFO, Op, UnaryOps, BinaryOps, TernaryOps, ReduceOps, BufferOps, KernelNode
from tinychad.codegen.analyze import LEAF_OPS, key_of
from tinychad.codegen.emit import row_inside
from tinychad.codegen.context import Context, Lane, Phase, Place, Tail
from tinychad.codegen.symbolic import Node, Num, constant_difference
from tinychad.codegen.uops import UOp, UOps

# transcendental ops on integers compute in float64 and convert back, as numpy does
_FLOAT_ONLY = {op for op, info in OP_INFO.items() if info.float_only}


def consecutive(exprs: list[tuple[Node, Node | None]]) -> bool:
  """The lanes read elements index0, index0+1, ... under one validity condition."""
  first_index, first_valid = exprs[0]
  for i, (index, valid) in enumerate(exprs):
    if key_of(valid) != key_of(first_valid): return False
    step = constant_difference(index, first_index)
    if step is None:
      difference = index - first_index
      step = difference.value if isinstance(difference, Num) else None
    if step != i: return False
  return True


def _outer(ctx: Context, lane: Lane) -> Lane:
  """The lane's offsets along the non-reduce dims only: the output lane it belongs to."""
  return tuple(0 if r else x for x, (_, r) in zip(lane, ctx.kernel.dims))


def value(ctx: Context, node: KernelNode, lane: Lane, at: Place) -> UOp:
  """The UOp holding `node`'s value at the current loop position and `lane`."""
  if isinstance(node.op, ReduceOps): return at.acc[_outer(ctx, lane)]
  out = ctx.out
  found = out.remembered(("value", node, lane, at.tail))
  if found is not None: return found
  made: dict[KernelNode, UOp] = {}

  def sources(n: KernelNode) -> tuple[KernelNode, ...]:
    """What must be lowered before n: nothing for a value made already or one lowered whole (a leaf,
    a gather, the reduce, a value read back from its scratch row)."""
    if n.op in LEAF_OPS or isinstance(n.op, ReduceOps): return ()
    uop = out.remembered(("value", n, lane, at.tail))
    if uop is not None:
      made[n] = uop
      return ()
    if at.phase is Phase.ROW and n in ctx.row_cache and (n, lane, at.tail) in ctx.row_written: return ()
    return n.srcs

  for n in toposort([node], sources):
    if n in made: continue
    if isinstance(n.op, ReduceOps):
      made[n] = at.acc[_outer(ctx, lane)]
      continue
    # asked again: a gather lowers its row index at every vector lane, this one included
    key = ("value", n, lane, at.tail)
    uop = out.remembered(key)
    if uop is None:
      uop = _row_cached(ctx, n, lane, at, made) if n in ctx.row_cache else _lower(ctx, n, lane, at, made)
      out.remember(key, uop)
    made[n] = uop
  return made[node]


def _row_cached(ctx: Context, node: KernelNode, lane: Lane, at: Place, made: dict[KernelNode, UOp]) -> UOp:
  """`node` at `lane`: loaded from its scratch row in the row pass, else computed (and written to the
  scratch row by the reduce loop)."""
  local, key = ctx.row_cache[node], (node, lane, at.tail)
  if at.phase is Phase.ROW and key in ctx.row_written:
    return ctx.out.emit(UOps.LOAD, node.dtype, (local, ctx.row_slot(lane, at)), vec=ctx.row_written[key])
  uop = _lower(ctx, node, lane, at, made)
  if at.phase is Phase.REDUCE:
    ctx.row_written[key] = uop.vec
    ctx.out.emit(UOps.STORE, None, (local, ctx.row_slot(lane, at), uop), cse=False)
  return uop


def _lower(ctx: Context, node: KernelNode, lane: Lane, at: Place, made: dict[KernelNode, UOp]) -> UOp:
  """One node at `lane`, its sources already lowered (in `made`)."""
  if node.op is BufferOps.LOAD or node.op is BufferOps.CONST: return _leaf(ctx, node, lane, at)
  if node.op is BufferOps.GATHER: return _gather(ctx, node, lane, at)
  emit = ctx.out.emit
  srcs = tuple(made[s] for s in node.srcs)
  vec = max(s.vec for s in srcs)
  if node.op is TernaryOps.WHERE and srcs[0].op is UOps.CONST:
    # a condition known here (a mask of an unrolled lane, opt._unroll_masked) picks its branch
    picked = srcs[1] if srcs[0].arg else srcs[2]
    if picked.vec == vec: return picked
  if node.op in (UnaryOps.CAST, UnaryOps.BITCAST): return emit(UOps.ALU, node.arg, srcs, node.op, vec=vec)
  if node.op in _FLOAT_ONLY and not node.dtype.is_float:
    x = emit(UOps.ALU, dtypes.float64, srcs, UnaryOps.CAST, vec=vec)
    y = emit(UOps.ALU, dtypes.float64, (x,), node.op, vec=vec)
    return emit(UOps.ALU, node.dtype, (y,), UnaryOps.CAST, vec=vec)
  return emit(UOps.ALU, node.dtype, srcs, node.op, vec=vec)


def _leaf(ctx: Context, node: KernelNode, lane: Lane, at: Place) -> UOp:
  """A LOAD or CONST at `lane`; inside the reduce, the staged load reads its panel instead."""
  if at.phase is Phase.REDUCE and ctx.staged is not None and node is ctx.staged.node:
    index = ctx.out.index(ctx.panel_index(lane, at.tail))
    return ctx.out.emit(UOps.LOAD, node.dtype, (ctx.panel, index), vec=len(ctx.vector_lanes(lane)))
  exprs = [ctx.leaf_expr(node, ln, at.tail) for ln in ctx.vector_lanes(lane)]
  swap = None
  if ctx.opts.transposed is not None and node.op is BufferOps.LOAD: swap = lambda: _transposed(ctx, node, lane, at.tail)
  return read(ctx, node, exprs, swap)


def _transposed(ctx: Context, node: KernelNode, lane: Lane, tail: Tail) -> UOp | None:
  """A load that runs along the `transposed` axis, not the vector axis (opt._transpose_opts), at `lane`: the
  square block of `width` lanes along each of the two axes is read as `width` vectors along the transposed
  axis (one per lane of the vector axis), transposed in registers (_swap_rows), and this lane's row of the
  result returned. The block is loaded once, at its first lane; None where its rows aren't consecutive
  elements under one gate each (a mask that changes inside the block): the caller then reads lane by lane."""
  axis, (_, width) = ctx.opts.transposed, ctx.opts.vector
  row = lane[axis] % width
  first = lane[:axis] + (lane[axis] - row,) + lane[axis + 1:]
  key = ("transposed", node, first, tail)
  rows = ctx.out.remembered(key)
  if rows is None:
    loads = []
    for start in ctx.vector_lanes(first):
      along = [ctx.leaf_expr(node, start[:axis] + (start[axis] + k,) + start[axis + 1:], tail) for k in range(width)]
      if not consecutive(along): return None
      loads.append(_scalar_leaf(ctx, node, along[0], vec=width))
    rows = _swap_rows(ctx, loads, node.dtype)
    ctx.out.remember(key, rows)
  return rows[row]


def _swap_rows(ctx: Context, rows: list[UOp], dtype: DType) -> list[UOp]:
  """The transpose of a square block held as `width` vectors (row j's lane i becomes row i's lane j), in
  log2(width) rounds of shuffles: round b pairs rows r and r + b (r without bit b) and interleaves their
  blocks of b lanes, the even blocks into row r and the odd ones into row r + b. After the rounds for
  b = 1, 2, 4, ... every lane has moved to its transposed place (24 shuffles for 8 x 8)."""
  width, rows = len(rows), list(rows)
  b = 1
  while b < width:
    for r in range(width):
      if r & b: continue
      # lane p of the result takes block p // b from a (even blocks) or b's row (odd), at the pair's place
      low = tuple((p // b // 2) * 2 * b + p % b + (width if p // b % 2 else 0) for p in range(width))
      high = tuple(i + b for i in low)
      pair = (rows[r], rows[r + b])
      rows[r] = ctx.out.emit(UOps.SHUFFLE, dtype, pair, low, vec=width)
      rows[r + b] = ctx.out.emit(UOps.SHUFFLE, dtype, pair, high, vec=width)
    b *= 2
  return rows


def read(ctx: Context, node: KernelNode, exprs: list[tuple[Node, Node | None]],
         swap: Callable[[], UOp | None] | None = None) -> UOp:
  """`node` read at one index (and validity) per vector lane: one scalar when every lane reads the
  same element, one vector load when they read consecutive elements under one gate, else what `swap`
  gives (a transposed block's row, _transposed) or, where it gives None, a scalar per lane gathered."""
  if node.op is BufferOps.CONST:
    if all(key_of(e[1]) == key_of(exprs[0][1]) for e in exprs): return _scalar_leaf(ctx, node, exprs[0])
  elif all(key_of(e[0]) == key_of(exprs[0][0]) and key_of(e[1]) == key_of(exprs[0][1]) for e in exprs):
    return _scalar_leaf(ctx, node, exprs[0])
  elif consecutive(exprs):
    return _scalar_leaf(ctx, node, exprs[0], vec=len(exprs))
  if swap is not None and (swapped := swap()) is not None: return swapped
  parts = tuple(_scalar_leaf(ctx, node, e) for e in exprs)
  return ctx.out.emit(UOps.VECTORIZE, node.dtype, parts, vec=len(parts))


def _scalar_leaf(ctx: Context, node: KernelNode, expr: tuple[Node, Node | None], vec: int = 1) -> UOp:
  out = ctx.out
  index, valid = expr
  if isinstance(valid, Num) and valid.value == 0: return out.const(0, node.dtype)
  gate = None if valid is None or isinstance(valid, Num) else out.index(valid)
  if node.op is BufferOps.CONST:
    uop = out.const(node.arg[0], node.dtype)
    if gate is None: return uop
    return out.emit(UOps.ALU, node.dtype, (gate, uop, out.const(0, node.dtype)), TernaryOps.WHERE)
  srcs = (ctx.globals[node.arg[0]], out.index(index)) + ((gate,) if gate is not None else ())
  return out.emit(UOps.LOAD, node.dtype, srcs, vec=vec)


def _gather(ctx: Context, node: KernelNode, lane: Lane, at: Place) -> UOp:
  """A GATHER at `lane`: row 0's element plus the row index times the row stride, loaded where the
  index is inside the table (0 elsewhere); one vector load when the lanes read consecutive elements
  of one row, as along an embedding's row."""
  lanes = ctx.vector_lanes(lane)
  exprs = [ctx.leaf_expr(node, ln, at.tail) for ln in lanes]
  rows = [value(ctx, node.srcs[0], ln, at) for ln in lanes]
  if all(row is rows[0] for row in rows) and rows[0].vec == 1 and consecutive(exprs):
    return _gathered_load(ctx, node, exprs[0], rows[0], len(lanes))
  if rows[0].vec > 1: rows = [ctx.out.emit(UOps.GEP, rows[0].dtype, (rows[0],), i) for i in range(len(lanes))]
  parts = tuple(_gathered_load(ctx, node, expr, row, 1) for expr, row in zip(exprs, rows))
  return parts[0] if len(parts) == 1 else ctx.out.emit(UOps.VECTORIZE, node.dtype, parts, vec=len(parts))


def _gathered_load(ctx: Context, node: KernelNode, expr: tuple[Node, Node | None], row: UOp, vec: int) -> UOp:
  _, _, row_stride, rows = node.arg
  out, idx_dtype = ctx.out, ctx.out.idx_dtype
  def alu(op: Op, dtype: DType, *srcs: UOp) -> UOp: return out.emit(UOps.ALU, dtype, srcs, op)
  inside = row_inside(alu, out.const, row, rows)
  if expr[1] is not None: inside = alu(BinaryOps.AND, dtypes.bool, inside, out.index(expr[1]))
  if row.dtype != idx_dtype: row = alu(UnaryOps.CAST, idx_dtype, row)
  offset = alu(BinaryOps.MUL, idx_dtype, row, out.const(row_stride, idx_dtype))
  index = alu(BinaryOps.ADD, idx_dtype, out.index(expr[0]), offset)
  return out.emit(UOps.LOAD, node.dtype, (ctx.globals[node.arg[0]], index, inside), vec=vec)
