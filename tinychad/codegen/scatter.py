"""Lowering a scatter-add, the one kernel that writes where its data says.

in: a SCATTER_ADD kernel node (engine/schedule.py makes one per LoadOps.SCATTER_ADD base), arg =
    (table rows, source rows, row width, index dtype); buffers: the table (output), the source
    rows (count, width) and their indices (count,)
out: a Program in uops.py's IR:
  for column block c (split across threads):
    for r: table[r, c] = 0
    for i: if 0 <= indices[i] < rows: table[indices[i], c] += source[i, c]
Each thread owns whole columns and walks every source row in order, so no two threads write one
element and the sums add up in the same order on any thread count. The SIMD lanes run along the
columns. It is a gather's gradient (an embedding's backward): count * width additions, where a
one-hot reduce over the table would do rows * count * width.
"""
from __future__ import annotations
from typing import Any
from tinychad.dtype import VECTOR_FLOATS, DType, dtypes
from tinychad.ops import BinaryOps, KernelNode, TernaryOps, UnaryOps
from tinychad.codegen.uops import Program, UOp, UOps
from tinychad.codegen.emit import row_inside
from tinychad.host import simd_bytes


class _Emitter:
  """UOps in program order; no sharing of values is needed in a kernel this small."""
  def __init__(self):
    self.uops: list[UOp] = []

  def emit(self, op: UOps, dtype: DType | None, srcs: tuple[UOp, ...] = (), arg: Any = None, vec: int = 1) -> UOp:
    uop = UOp(op, dtype, srcs, arg, vec, len(self.uops))
    self.uops.append(uop)
    return uop

  def const(self, value: Any, dtype: DType, vec: int = 1) -> UOp:
    return self.emit(UOps.CONST, dtype, (), dtype.np(value).item(), vec)

  def alu(self, op: Any, dtype: DType, *srcs: UOp, vec: int = 1) -> UOp:
    return self.emit(UOps.ALU, dtype, srcs, op, vec)


def lower_scatter_add(node: KernelNode, name: str) -> Program:
  rows, count, width, index_dtype = node.arg
  dtype = node.dtype
  lanes = simd_bytes() // dtype.itemsize if dtype in VECTOR_FLOATS else 1
  if width % lanes: lanes = 1
  idx = dtypes.int32 if max(rows, count, 1) * width < 2 ** 31 else dtypes.int64
  k = _Emitter()
  table = k.emit(UOps.DEFINE_GLOBAL, dtype, (), (0, True))
  source = k.emit(UOps.DEFINE_GLOBAL, dtype, (), (1, False))
  indices = k.emit(UOps.DEFINE_GLOBAL, index_dtype, (), (2, False))
  column_block = k.emit(UOps.RANGE, idx, (), ("gidx0", width // lanes, True, 1))
  column = k.alu(BinaryOps.MUL, idx, column_block, k.const(lanes, idx))

  def element(row: UOp) -> UOp:
    return k.alu(BinaryOps.ADD, idx, k.alu(BinaryOps.MUL, idx, row, k.const(width, idx)), column)

  row = k.emit(UOps.RANGE, idx, (), ("gidx1", rows, False, 1))
  k.emit(UOps.STORE, None, (table, element(row), k.const(0, dtype, lanes)))
  k.emit(UOps.ENDRANGE, None, (row,))

  i = k.emit(UOps.RANGE, idx, (), ("ridx0", count, False, 1))
  picked = k.emit(UOps.LOAD, index_dtype, (indices, i))
  inside = row_inside(k.alu, k.const, picked, rows)
  # a row outside the table adds a gated-off 0 to row 0 instead: no branch around the store
  target = k.alu(TernaryOps.WHERE, index_dtype, inside, picked, k.const(0, index_dtype))
  if index_dtype != idx: target = k.alu(UnaryOps.CAST, idx, target)
  value = k.emit(UOps.LOAD, dtype, (source, element(i), inside), vec=lanes)
  at = element(target)
  total = k.alu(BinaryOps.ADD, dtype, k.emit(UOps.LOAD, dtype, (table, at), vec=lanes), value, vec=lanes)
  k.emit(UOps.STORE, None, (table, at, total))
  k.emit(UOps.ENDRANGE, None, (i,))
  k.emit(UOps.ENDRANGE, None, (column_block,))
  return Program(name, k.uops, [table, source, indices], parallel=width // lanes)
