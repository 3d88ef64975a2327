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
  results = {}
  for o in outer_lanes:
    total = accs[(o, inner_lanes[0])]
    for r in inner_lanes[1:]: total = out.emit(UOps.ALU, acc_dtype, (total, accs[(o, r)]), alu, cse=False, vec=vec)
    if vector_is_reduce:
      # the lanes of a reduce-axis vector are partial results of one output: fold them
      parts = [out.emit(UOps.GEP, acc_dtype, (total,), i) for i in range(vec)]
      while len(parts) > 1:
        parts = [out.emit(UOps.ALU, acc_dtype, (parts[i], parts[i + 1]), alu, cse=False) for i in range(0, len(parts), 2)]
      total = parts[0]
    results[o] = total if acc_dtype == dtype else out.emit(UOps.ALU, dtype, (total,), UnaryOps.CAST, cse=False, vec=total.vec)
  return results
