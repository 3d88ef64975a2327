"""The reduce pass: a kernel's one reduce as accumulators, its loop, and the partial sums folded.

in: a Context and the Place of the tile being lowered (its tail)
out: the reduce's result per outer lane (UOps after the reduce loop closed)
  acc[o, r] = identity            one accumulator per (output lane, reduce lane): independent chains
  for ridx...: acc[o, r] = acc[o, r] + x[o + r]
  out[o] = acc[o, 0] + acc[o, 1] + ...   (and a reduce-axis vector's lanes folded pairwise)
float16 sums accumulate in float32, like numpy's half reductions.
"""
from __future__ import annotations
from dataclasses import replace
from tinychad.dtype import dtypes
from tinychad.ops import OP_INFO, UnaryOps, BinaryOps, ReduceOps
from tinychad.codegen.context import Context, Lane, Phase, Place
from tinychad.codegen.uops import UOp, UOps
from tinychad.codegen.values import value

_ACC_DTYPE = {dtypes.float16: dtypes.float32}


def lower_reduce(ctx: Context, at: Place) -> dict[Lane, UOp]:
  reduce, out, opts, dims = ctx.kernel.reduce, ctx.out, ctx.opts, ctx.kernel.dims
  op, dtype = reduce.op, reduce.dtype
  acc_dtype = _ACC_DTYPE.get(dtype, dtype) if op is ReduceOps.SUM else dtype
  alu = BinaryOps.ADD if op is ReduceOps.SUM else BinaryOps.MAX
  vec = opts.vector[1] if opts.vector is not None else 1
  outer_lanes, inner_lanes = ctx.lanes(False, at.tail), ctx.lanes(True, at.tail)
  # one accumulator per (output lane, reduce lane): independent chains the CPU can overlap
  accs = {(o, r): out.emit(UOps.DEFINE_ACC, acc_dtype, (), OP_INFO[op].identity(acc_dtype), cse=False, vec=vec)
          for o in outer_lanes for r in inner_lanes}
  opened = ctx.open_reduce_loops()
  inside = replace(at, phase=Phase.REDUCE)
  for o in outer_lanes:
    for r in inner_lanes:
      lane = tuple(a + b for a, b in zip(o, r))
      x = value(ctx, reduce.srcs[0], lane, inside)
      if acc_dtype != dtype: x = out.emit(UOps.ALU, acc_dtype, (x,), UnaryOps.CAST, vec=x.vec)
      acc = accs[(o, r)]
      out.emit(UOps.ASSIGN, acc_dtype, (acc, out.emit(UOps.ALU, acc_dtype, (acc, x), alu, cse=False, vec=vec)), cse=False, vec=vec)
  ctx.close_loops(opened)
  vector_is_reduce = opts.vector is not None and dims[opts.vector[0]][1]
  totals = []
  for o in outer_lanes:
    total = accs[(o, inner_lanes[0])]
    for r in inner_lanes[1:]: total = out.emit(UOps.ALU, acc_dtype, (total, accs[(o, r)]), alu, cse=False, vec=vec)
    totals.append(total)
  if vector_is_reduce:
    # the lanes of a reduce-axis vector are partial results of one output: fold them
    totals = _fold_together(out, totals, alu) if len(totals) > 1 and vec & (vec - 1) == 0 else \
      [_fold_alone(out, total, alu) for total in totals]
  return {o: total if acc_dtype == dtype else out.emit(UOps.ALU, dtype, (total,), UnaryOps.CAST, cse=False, vec=total.vec)
          for o, total in zip(outer_lanes, totals)}


def _fold_alone(out, total: UOp, alu: BinaryOps) -> UOp:
  """One vector's lanes combined by alu: a tree of scalar ops over its lanes."""
  parts = [out.emit(UOps.GEP, total.dtype, (total,), i) for i in range(total.vec)]
  while len(parts) > 1:
    parts = [out.emit(UOps.ALU, total.dtype, (parts[i], parts[i + 1]), alu, cse=False) for i in range(0, len(parts), 2)]
  return parts[0]


def _fold_together(out, totals: list[UOp], alu: BinaryOps) -> list[UOp]:
  """Each vector's lanes combined by alu (its output, one scalar), for several vectors at once. Two vectors are
  merged into one: a shuffle takes the low half of each one's lanes, another the high half, and one vector op
  combines them, so each output keeps half as many partial lanes; merged vectors are merged again, a vector left
  without a partner is merged with itself, until every output is one lane. k outputs of v lanes take about
  3k vector ops and k lane reads, where folding each alone takes k(v - 1) lane reads and as many scalar ops
  (a matrix-vector product's 8 rows of 16 lanes: 32 instead of 248)."""
  vec, width = totals[0].vec, totals[0].vec
  # each vector with the outputs it holds, output i of the list in lanes [i*width, (i+1)*width)
  vectors = [(total, [i]) for i, total in enumerate(totals)]
  while width > 1:
    half, merged = width // 2, []
    for pair in (vectors[i:i + 2] for i in range(0, len(vectors), 2)):
      (a, outputs_a), (b, outputs_b) = pair[0], pair[1] if len(pair) == 2 else (pair[0][0], [])

      def picks(part: int) -> tuple[int, ...]:
        """Half `part` of every output's lanes, a's outputs then b's; the lanes past them are any."""
        lanes = [source * vec + g * width + part * half + j for source, outputs in ((0, outputs_a), (1, outputs_b))
                 for g in range(len(outputs)) for j in range(half)]
        return tuple(lanes + [0] * (vec - len(lanes)))
      low, high = (out.emit(UOps.SHUFFLE, a.dtype, (a, b), picks(part), vec=vec) for part in (0, 1))
      merged.append((out.emit(UOps.ALU, a.dtype, (low, high), alu, cse=False, vec=vec), outputs_a + outputs_b))
    vectors, width = merged, half
  lane = {i: (total, n) for total, outputs in vectors for n, i in enumerate(outputs)}
  return [out.emit(UOps.GEP, lane[i][0].dtype, (lane[i][0],), lane[i][1]) for i in range(len(totals))]
