"""The emission pass: appending UOps to a program, with common-subexpression elimination per loop.

in: UOps asked for by the other lowering passes, loops opened and closed, symbolic index expressions
out: the program's UOps in order (`uops`), each equal UOp emitted once per open loop scope
A value made inside a loop can't be used after the loop closes, so there is one CSE table per open
loop, searched innermost first. The tables also remember lowered kernel-tree values (values.py).
"""
from __future__ import annotations
from typing import Any, Callable
from tinychad.dtype import DType, dtypes
from tinychad.ops import BinaryOps
from tinychad.codegen.symbolic import Node, Num, Var, Sum, Mul, Div, Mod, Lt, Ge, And
from tinychad.codegen.uops import UOp, UOps


class Emitter:
  def __init__(self, idx_dtype: DType):
    self.idx_dtype = idx_dtype         # the dtype of every index (int32 when every index fits)
    self.uops: list[UOp] = []
    self.scopes: list[dict] = [{}]     # one CSE table per open loop, the innermost last
    self.vars: dict[str, UOp] = {}     # loop variable name -> its RANGE

  def emit(self, op: UOps, dtype: DType | None, srcs: tuple[UOp, ...] = (), arg: Any = None, cse: bool = True,
           vec: int = 1) -> UOp:
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

  def remembered(self, key: Any) -> UOp | None:
    """The value stored under `key` in an open scope (innermost first), if any."""
    for scope in reversed(self.scopes):
      if key in scope: return scope[key]
    return None

  def remember(self, key: Any, uop: UOp) -> None: self.scopes[-1][key] = uop

  def open_loop(self, var: Var, extent: int, parallel: bool = False, unroll: int = 1) -> UOp:
    loop = self.emit(UOps.RANGE, self.idx_dtype, (), (var.name, extent, parallel, unroll), cse=False)
    self.vars[var.name] = loop
    self.scopes.append({})
    return loop

  def close_loop(self, loop: UOp) -> None:
    self.scopes.pop()
    self.emit(UOps.ENDRANGE, None, (loop,), cse=False)

  def index(self, node: Node) -> UOp:
    """A symbolic index expression as index arithmetic (operands before the op, left to right)."""
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


def row_inside(alu: Callable[..., UOp], const: Callable[..., UOp], row: UOp, rows: int) -> UOp:
  """`0 <= row < rows` as a bool UOp (a gather's or scatter-add's row index inside its table), made with
  the caller's `alu(op, dtype, *srcs)` and `const(value, dtype)`. It compares in the index's own dtype,
  before a narrowing cast could wrap it inside."""
  return alu(BinaryOps.AND, dtypes.bool, alu(BinaryOps.CMPLT, dtypes.bool, const(-1, row.dtype), row),
             alu(BinaryOps.CMPLT, dtypes.bool, row, const(rows, row.dtype)))
