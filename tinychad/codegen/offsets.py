"""Kernel trees that differ only in where their inputs start share one kernel.

in: a kernel tree (a STORE root) whose loads read their buffers from some offset on: an LSTM's time step reads its
    gates t * batch * 4 * hidden elements into the buffer of all steps' input projections, and its backward pass a
    slice per step of buffers that hold every step
out: the tree with each input's offsets lowered by a shift, and the shifts, in bytes, one per buffer (the output's,
     buffer 0, is always 0). engine/realize.py lowers and compiles the shifted tree once and calls it with each
     input's address plus its shift: the 64 time steps of an LSTM layer then build one kernel, not 64.
Only the view nearest memory (views[0]) carries a buffer's offset, so moving part of it into the address moves
every element read by the same amount. A shift is a multiple of SHIFT_ALIGN bytes: each load keeps its offset
modulo the widest SIMD vector and the cache line, so the code generator plans the same vector loads over the same
alignment it would have planned for the offsets left in place, and buffers start 64-byte aligned either way.
"""
from __future__ import annotations
import functools
from tinychad.ops import BufferOps, KernelNode, rebuild, rewrite
from tinychad.view import ShapeTracker, View

SHIFT_ALIGN = 64   # bytes: an AVX-512 vector, a cache line


@functools.lru_cache(maxsize=4096)
def split_offsets(ast: KernelNode) -> tuple[KernelNode, tuple[int, ...]]:
  """(the tree with its inputs' offsets lowered, each buffer's shift in bytes); (ast, ()) when nothing moves."""
  if ast.op is not BufferOps.STORE: return ast, ()
  lowest: dict[int, int] = {}    # buffer number -> the smallest offset a load reads it from
  itemsize: dict[int, int] = {}  # buffer number -> its element's bytes
  for node in ast.walk():
    if node.op is BufferOps.LOAD:
      buffer, offset = node.arg[0], node.arg[1].views[0].offset
      lowest[buffer] = min(lowest.get(buffer, offset), offset)
      itemsize[buffer] = node.dtype.itemsize
    elif node.op is BufferOps.GATHER:
      lowest[node.arg[0]] = 0      # a gather's table is read at rows its index picks: left where it is
  shifts: dict[int, int] = {}    # buffer number -> its shift in elements: whole SHIFT_ALIGN bytes
  for buffer, offset in lowest.items():
    if buffer not in itemsize: continue
    step = SHIFT_ALIGN // itemsize[buffer]
    if offset >= step: shifts[buffer] = offset - offset % step
  if not shifts: return ast, ()

  def shifted(node: KernelNode, srcs: tuple[KernelNode, ...]) -> KernelNode:
    if node.op is not BufferOps.LOAD or node.arg[0] not in shifts: return rebuild(node, srcs)
    buffer, st = node.arg
    first = st.views[0]
    view = View(first.shape, first.strides, first.offset - shifts[buffer], first.mask)
    return rebuild(node, srcs, (buffer, ShapeTracker((view,) + st.views[1:])))

  return rewrite(ast, shifted), tuple(shifts[b] * itemsize[b] if b in shifts else 0 for b in range(max(shifts) + 1))
