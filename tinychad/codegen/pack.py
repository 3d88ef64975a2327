"""Layout packing: which operands of a reduce kernel are read from panels, and the kernel that reads them.

in: a kernel tree with one reduce (STORE root)
out: pack_plan(ast) = {LOAD node: (lane axis, P)} for each load to read from panels (none under NOOPT=1: the
     scheduler doesn't ask); split_lanes(ast, plan, relink) = the kernel over the shape with each of those
     lane axes split into (panels, P), each LOAD handed to `relink` with its view over that shape and,
     for a packed one, the Panels to read instead. Making the panel buffers (a kernel of movement ops +
     contiguous each) is the scheduler's part: it alone makes buffers (engine/schedule.py).

The rule (codegen/opt.py's staging handles what fits in a kernel):
  - a realized operand that the reduce reads with a large step along a reduce axis (a row of B in a
    matmul: one page and one L1 set per step), contiguously along a non-reduce axis and many times
    over (stride 0 along another axis) is copied into panels first: panel p holds columns
    [p*P, (p+1)*P) for every reduce index, so the register tile reads one contiguous stream
    (P = opt.panel_width, one tile row). Only where one panel is too big to stage (STAGE_MAX_BYTES):
    codegen copies a smaller one inside the kernel, each thread its own panel while it is in cache
    (opt.py's `stage`), which costs no pass over memory and no kernel launch;
  - a transposed operand (w.T in x @ w.T: contiguous along the reduce, along no output axis) read by
    TRANSPOSED_PACK_MIN_REUSE rows or more is packed into panels whatever its size, so the kernel gets
    SIMD lanes along its output columns instead of dot products along the reduce;
  - A read down its columns (y.T in y.T @ x, a weight's gradient: contiguous along an output axis the
    store doesn't write in order, so it runs along the register tile's rows) for more reduce steps than L1
    holds lines, TRANSPOSED_PACK_MIN_REUSE times or more: each reduce step reads a few floats of a new
    line (of a new page, all in one L1 set, for a row of 1024 floats), and the next tile of rows reads
    the same lines again from L2. Its panels are 1 wide (P = 1): the transpose, y.T row-major, which the
    tile reads as the rows of a plain matmul.
"""
from __future__ import annotations
from typing import Callable, NamedTuple
from tinychad.codegen.opt import STAGE_MAX_BYTES, panel_width
from tinychad.helpers import inverse_permutation, prod
from tinychad.ops import BufferOps, KernelNode, ReduceOps, rebuild, rewrite
from tinychad.view import ShapeTracker

# a reduce step of a page or more puts every read on its own page and in the same L1 set, so a panel
# of B can't stay in L1 or the TLB: pack it
PACK_MIN_STRIDE_BYTES = 4096
# packing reads and writes the operand once; it pays off when the kernel reads it this many times over
PACK_MIN_REUSE = 16
# a transposed operand's pack is a transposing copy, dearer: it pays off from this many rows (bench/README.md)
TRANSPOSED_PACK_MIN_REUSE = 64
LINE_BYTES = 64                 # a cache line
# lines L1 holds (32 KiB of LINE_BYTES): a column of A read over more reduce steps than this leaves L1 before the
# next tile of rows reads it again
COLUMN_PACK_MIN_STEPS = 512


class Panels(NamedTuple):
  """An operand's panels: the elements `kept` (its view without the broadcast axes), stored in the axis
  order `order`, and `view`, how the split kernel reads them."""
  kept: ShapeTracker
  order: tuple[int, ...]
  view: ShapeTracker


def pack_plan(ast: KernelNode) -> dict[KernelNode, tuple[int, int]]:
  """The loads of `ast`'s reduce to read from panels, each with its lane axis (in ast's shape) and panel width."""
  reduce = next(n for n in ast.walk() if isinstance(n.op, ReduceOps))
  axes, full = reduce.arg
  loads = [n for n in ast.walk() if n.op is BufferOps.LOAD]
  return {n: split for n in reduce.walk() if n.op is BufferOps.LOAD
          if (split := _lane_to_pack(n, axes, full, panel_width(n.dtype), ast, loads)) is not None}


def split_lanes(ast: KernelNode, plan: dict[KernelNode, tuple[int, int]],
                relink: Callable[[KernelNode, ShapeTracker, Panels | None], KernelNode]) -> KernelNode:
  """`ast` over the shape with every lane axis of `plan` split into (panels, P); each LOAD becomes
  relink(load, its view over that shape, its Panels or None), called in the order the tree's loads
  first appear (sources first), so the relinked loads can renumber the kernel's inputs."""
  splits = dict(plan.values())
  axes, full = next(n for n in ast.walk() if isinstance(n.op, ReduceOps)).arg
  reduce_axes = tuple(_split_axis(a, splits) for a in axes)
  packed = {n: _split_axis(lane, splits) for n, (lane, _) in plan.items()}

  def split(node: KernelNode, srcs: tuple[KernelNode, ...]) -> KernelNode:
    if node.op in (BufferOps.LOAD, BufferOps.CONST, BufferOps.STORE):
      st = node.arg[1].reshape(_split_shape(node.arg[1].shape, splits))
      if node.op is not BufferOps.LOAD: return rebuild(node, srcs, (node.arg[0], st))
      return relink(node, st, _panels(st, packed[node], reduce_axes) if node in packed else None)
    if isinstance(node.op, ReduceOps): return rebuild(node, srcs, (reduce_axes, _split_shape(full, splits)))
    return rebuild(node, srcs)
  return rewrite(ast, split)


def _panels(st: ShapeTracker, lane: int, reduce_axes: tuple[int, ...]) -> Panels:
  """The panels of an operand a kernel reads through `st`, whose lane axis is split into (panels, P) at
  (lane, lane+1): its elements in the order (other kept axes, panel, reduce axes, P), so one tile row
  (P lanes) at consecutive reduce steps is one stream."""
  shape, strides = st.shape, st.views[0].strides
  # the broadcast axes (stride 0) are not materialized: the panels hold each element once
  kept = st.shrink(tuple((0, 1) if stride == 0 else (0, s) for s, stride in zip(shape, strides)))
  outer = [a for a in range(len(shape)) if a not in reduce_axes and a not in (lane, lane + 1)]
  order = tuple(outer + [lane] + list(reduce_axes) + [lane + 1])
  inverse = inverse_permutation(order)
  view = ShapeTracker.from_shape(tuple(kept.shape[a] for a in order)).permute(inverse).expand(shape)
  return Panels(kept, order, view)


def _lane_to_pack(load: KernelNode, reduce_axes: tuple[int, ...], full: tuple[int, ...], panel: int,
                  store: KernelNode, loads: list[KernelNode]) -> tuple[int, int] | None:
  """The lane axis (a multiple of `panel` long) along which `load` should be packed into panels and the
  panels' width (`panel`; 1 for A read down its columns, the module docstring's third rule), or None.
  Packing needs one plain view that is reused (stride 0 along other output axes, for at least
  PACK_MIN_REUSE points, TRANSPOSED_PACK_MIN_REUSE for a transposed operand) and either
  steps far along a reduce axis while it runs along the lane axis (B in a matmul too big to stage in
  the kernel), or is transposed: it runs along a reduce axis and along no output axis (the weight of
  x @ weight.T, a Linear layer). A transposed operand would make the kernel take its SIMD lanes along
  the reduce, as dot products (several loads per multiply-add, and a horizontal sum per output); its
  panels put the lanes along the output axis the store writes in order, which gets the matmul's
  register tile, provided the kernel's other loads allow lanes there too (codegen/opt.py's vector axis)."""
  st = load.arg[1]
  if len(st.views) != 1 or st.views[0].mask is not None: return None
  strides, itemsize = st.views[0].strides, load.dtype.itemsize
  reuse = prod(s for a, s in enumerate(full) if a not in reduce_axes and strides[a] == 0)
  if reuse < PACK_MIN_REUSE: return None
  lanes = [a for a, s in enumerate(full) if a not in reduce_axes and s % panel == 0]
  steps = prod(full[a] for a in reduce_axes)
  column = next((a for a in range(len(full)) if a not in reduce_axes and strides[a] == 1
                 and store.arg[1].views[-1].strides[a] not in (0, 1)), None)
  if column is not None and steps >= COLUMN_PACK_MIN_STEPS and reuse >= TRANSPOSED_PACK_MIN_REUSE and \
      all(abs(strides[a]) * itemsize >= LINE_BYTES for a in reduce_axes if full[a] > 1):
    return column, 1
  if any(strides[a] == 1 for a in range(len(full)) if a not in reduce_axes):
    if not any(abs(strides[a]) * itemsize >= PACK_MIN_STRIDE_BYTES for a in reduce_axes): return None
    if steps * panel * itemsize <= STAGE_MAX_BYTES: return None   # staged in the kernel
    lane = next((a for a in lanes if strides[a] == 1), None)
    return None if lane is None else (lane, panel)
  if reuse < TRANSPOSED_PACK_MIN_REUSE or not any(strides[a] == 1 for a in reduce_axes): return None
  def lanes_fit(a: int) -> bool:
    """The store writes consecutive elements along a, and every other load one or consecutive ones."""
    if store.arg[1].views[-1].strides[a] != 1: return False
    return all(len(n.arg[1].views) == 1 and n.arg[1].views[0].strides[a] in (0, 1) for n in loads if n is not load)
  lane = next((a for a in lanes if strides[a] != 0 and lanes_fit(a)), None)
  return None if lane is None else (lane, panel)


def _split_axis(axis: int, splits: dict[int, int]) -> int:
  """Where `axis` lands once every axis in `splits` is split in two."""
  return axis + sum(1 for a in splits if a < axis)


def _split_shape(shape: tuple[int, ...], splits: dict[int, int]) -> tuple[int, ...]:
  """`shape` with each axis a in `splits` split into (shape[a] // P, P)."""
  out: list[int] = []
  for a, s in enumerate(shape): out += [s // splits[a], splits[a]] if a in splits else [s]
  return tuple(out)
