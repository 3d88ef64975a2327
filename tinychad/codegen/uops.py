"""The linear IR every kernel is lowered to, and every renderer reads.

in: nothing (the types only)
out: UOps (the instruction kinds), UOp (one typed instruction with its sources) and Program (a kernel's
     instructions in execution order, its arguments, and the facts a renderer needs about its loops).
linearize.py, scatter.py and attention.py make Programs (gpu.py turns them into GPU Programs, renderer/gpu.py
writes those); renderer/cstyle.py and renderer/llvmir.py write them out, so the C and the LLVM backends cannot
disagree about what a kernel computes.
"""
from __future__ import annotations
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any
from tinychad.dtype import DType


class UOps(Enum):
  DEFINE_GLOBAL = auto()  # a kernel argument: arg = (buffer number, writable)
  DEFINE_LOCAL = auto()   # a scratch array of the thread running the call: arg = elements; 64-byte aligned
  CONST = auto()          # a literal: arg = value; with vec > 1 the value in every lane
  RANGE = auto()          # open a loop: arg = (variable name, extent, parallel, unroll); a parallel loop runs
                          # [start, end); unroll > 1 asks the compiler to repeat the body that many times;
                          # srcs = (lo, hi), index values: the loop runs over [lo, hi) (within [0, extent))
  ENDRANGE = auto()       # close the loop in srcs[0]
  LOAD = auto()           # srcs = (buffer, index) or (buffer, index, gate); a false gate reads 0
  ALU = auto()            # arg = the op (UnaryOps/BinaryOps/TernaryOps); CAST/BITCAST convert to dtype
  DEFINE_ACC = auto()     # a reduce accumulator: arg = its initial value
  ASSIGN = auto()         # srcs = (accumulator, value): the accumulator takes the value
  STORE = auto()          # srcs = (buffer, index, value); arg "stream": a whole aligned SIMD vector that
                          # goes straight to memory, not through the cache (opt.py's `stream`)
  VECTORIZE = auto()      # srcs = one scalar per lane: the vector of them
  GEP = auto()            # srcs = (vector,), arg = lane: that lane as a scalar
  SHUFFLE = auto()        # srcs = (a, b), two vectors of vec lanes; arg = a lane number per lane of the result, into
                          # a's lanes then b's (0 .. 2*vec-1): C's __builtin_shufflevector, LLVM's shufflevector
  # GPU programs only (codegen/gpu.py makes them, renderer/gpu.py writes them):
  SPECIAL = auto()        # a work-item index: arg = (variable name, "global" | "local" | "group", dimension 0..2)
  DEFINE_SHARED = auto()  # an array the whole work-group shares (OpenCL __local, CUDA __shared__): arg = elements
  BARRIER = auto()        # every work-item of the group waits here; their work-group memory writes are then visible
  IF = auto()             # srcs = (condition,): what follows up to the matching ENDIF runs only where it holds
  ENDIF = auto()          # closes the innermost IF


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
  parallel: int | tuple = 0  # extent of the loop threads may split (its [start, end) are the last two arguments); 0: none;
                             # a GPU Program's launch: (global sizes x3, local sizes x3)
  contract: bool = False  # a float sum reordered into partial sums anyway: fused multiply-add is welcome
  wraps: bool = True      # signed integer arithmetic that must wrap on overflow, as numpy's does (C: -fwrapv)

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
