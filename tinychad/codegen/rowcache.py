"""The row cache: which values a row reduce's second pass reads back instead of computing them again.

in: the analyze pass's Kernel, the chosen Opts, whether a load is staged
out: the nodes whose values the reduce loop writes to a scratch row (one DEFINE_LOCAL each) and the
     row pass then loads (values.py does both), and the elements of one scratch row
A row reduce's second pass (the kernel loops over the row again to store it) would compute softmax's
exp twice; instead the reduce loop writes it to a scratch row on the stack (opt.py's `cache_rows`):
  for row: { for i: local[i] = exp(x[i] - m); s += local[i]  ...  for i: out[i] = local[i] * (1/s) }
"""
from __future__ import annotations
from tinychad.dtype import VECTOR_FLOATS
from tinychad.helpers import toposort
from tinychad.ops import OP_INFO, ReduceOps, KernelNode
from tinychad.codegen.analyze import Kernel
from tinychad.codegen.opt import Opts, reduce_size

# a row pass reads back a value of its reduce loop only if computing it again costs more than a load
# from L1: a polynomial or a division (bench/README.md, "Tuning notes: codegen")
_ROW_CACHE_OPS = {op for op, info in OP_INFO.items() if info.costly}
_ROW_CACHE_DTYPES = VECTOR_FLOATS
# the scratch row lives on the stack, next to the row of input the pass reads again from L1/L2
ROW_CACHE_MAX_BYTES = 64 * 1024


def row_elements(kernel: Kernel, opts: Opts) -> int:
  """Elements of one scratch row: every reduce position, for every outer lane (a row per output lane)."""
  outer_lanes = 1
  for d, amount in opts.upcast.items():
    if kernel.dims[d][1]: continue
    step = opts.vector[1] if opts.vector is not None and opts.vector[0] == d else 1
    outer_lanes *= len(range(0, amount, step))
  return outer_lanes * reduce_size(kernel.dims)


def cached_nodes(kernel: Kernel, opts: Opts, staged: bool) -> list[KernelNode]:
  """The values the row pass would compute again: the topmost nodes of the store's tree outside the
  reduce that are also inside the reduce's body and hold a costly op (softmax's exp)."""
  if not kernel.row_pass or not opts.cache_rows or staged: return []
  dims, vector = kernel.dims, opts.vector
  # (a row pass's store runs along the row, so its SIMD lanes never lie along an outer axis)
  if vector is not None and not dims[vector[0]][1]: return []
  # a row the lanes cover whole has no loop: its pass reuses the reduce's values in registers
  if all(size // opts.upcast.get(d, 1) == 1 for d, (size, r) in enumerate(dims) if r): return []
  found: list[KernelNode] = []

  def sources(n: KernelNode) -> tuple[KernelNode, ...]:
    """The walk stops at the reduce and at each costly node, found in the order it reaches them."""
    if isinstance(n.op, ReduceOps): return ()
    if id(n) in kernel.below and n.dtype in _ROW_CACHE_DTYPES and any(m.op in _ROW_CACHE_OPS for m in n.walk()):
      found.append(n)
      return ()
    return n.srcs[::-1]    # last source first: the order the scratch rows have always been declared in
  toposort([kernel.ast.srcs[0]], sources)
  if sum(node.dtype.itemsize for node in found) * row_elements(kernel, opts) > ROW_CACHE_MAX_BYTES: return []
  return found
