"""Kernels that only move data, as the geometry of one generic strided copy instead of code of their own.

in: a kernel tree
out: a CopyPlan, or None when the kernel computes something (or is too big, see below)
A kernel qualifies when it stores contiguously, in the dtype it reads, either one load through a single
view (a permute's, a shrink's or a pad's copy) whose innermost dimension runs along the source (so every
row is one memcpy; a transpose stays compiled, with its SIMD block), or a sum (for booleans an OR) of such loads whose masks don't overlap (a cat:
each element comes from at most one source and the other terms are the masked-out zeros). The plan is,
per source, the box of the output it fills (its mask) as (count, source stride, output stride) per
dimension, with the offsets of the box's first element; dimensions a box covers whole merge with the
next where both layouts allow. Around a pad's one box, boxes of zeros fill the rest. runtime/copy.py runs every plan with one precompiled function, so a
shape never seen before costs no compile: a KV cache grown by concatenation has new copy kernels at
every token (~100 ms of compiling each, engine/realize.py). The copy keeps -0.0 where the compiled
kernel's `x + 0` made it 0.0: as torch.cat does; a sum of padded tensors written out (no overlap) keeps it
too, where torch's add gives 0.0.
Only outputs up to MAX_BYTES: a bigger copy is worth its compile (streaming stores past the cache, opt.py),
and its shape rarely changes.
"""
from __future__ import annotations
from dataclasses import dataclass
from tinychad.helpers import prod
from tinychad.ops import BinaryOps, BufferOps, KernelNode
from tinychad.view import View, strides_for_shape

MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class CopySource:
  buffer: int                                   # the LOAD's buffer number (1.. : the kernel's inputs); 0: zeros
  source_offset: int                            # elements, the box's first element in the source
  output_offset: int                            # elements, the same in the output
  dims: tuple[tuple[int, int, int], ...]        # (count, source stride, output stride), outermost first


@dataclass(frozen=True)
class CopyPlan:
  itemsize: int
  elements: int                                 # of the output
  sources: tuple[CopySource, ...]               # the loads' boxes, and the boxes of zeros around a pad's
  zero_all: bool                                # several sources leave gaps: the output is zeroed first


def copy_plan(ast: KernelNode) -> CopyPlan | None:
  """The plan of a kernel that only moves data (module docstring), or None."""
  if ast.op is not BufferOps.STORE: return None
  store = ast.arg[1]
  if len(store.views) != 1 or not store.views[0].contiguous: return None
  shape, dtype = store.shape, ast.dtype
  if prod(shape) * dtype.itemsize > MAX_BYTES or prod(shape) == 0: return None
  loads = _summed_loads(ast.srcs[0])
  if loads is None or any(load.dtype != dtype or len(load.arg[1].views) != 1 for load in loads): return None
  boxes = [_box(load.arg[1].views[0]) for load in loads]
  if any(_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:]): return None
  out_strides = strides_for_shape(shape)
  sources = [_source(load.arg[0], load.arg[1].views[0].strides, load.arg[1].views[0].offset, box, out_strides)
             for load, box in zip(loads, boxes)]
  if any(s is not None and s.dims[-1][0] > 1 and s.dims[-1][1:] != (1, 1) for s in sources): return None
  covered = sum(prod(hi - lo for lo, hi in box) for box in boxes) == prod(shape)
  # one box short of the output (a pad): the zeros around it, written once, instead of the whole output twice
  if not covered and len(boxes) == 1:
    zeros = (0,) * len(shape)
    sources += [_source(0, zeros, 0, box, out_strides) for box in _around(boxes[0], shape)]
  return CopyPlan(dtype.itemsize, prod(shape), tuple(s for s in sources if s is not None), not covered and len(boxes) > 1)


def _summed_loads(node: KernelNode) -> list[KernelNode] | None:
  """The LOADs a tree of ADDs (ORs for booleans) combines, or None if it holds anything else."""
  if node.op is BufferOps.LOAD: return [node]
  if node.op not in (BinaryOps.ADD, BinaryOps.OR): return None
  left, right = _summed_loads(node.srcs[0]), _summed_loads(node.srcs[1])
  return None if left is None or right is None else left + right


def _box(view: View) -> tuple[tuple[int, int], ...]:
  return view.mask if view.mask is not None else tuple((0, size) for size in view.shape)


def _overlap(a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]) -> bool:
  return all(max(lo_a, lo_b) < min(hi_a, hi_b) for (lo_a, hi_a), (lo_b, hi_b) in zip(a, b))


def _around(box: tuple[tuple[int, int], ...], shape: tuple[int, ...]) -> list[tuple[tuple[int, int], ...]]:
  """Boxes that, with `box`, tile `shape` without overlapping: per dimension d, the slabs before and after the box
  along d, inside the box along the dimensions before d and whole along those after."""
  out = []
  for d, ((lo, hi), size) in enumerate(zip(box, shape)):
    inside, whole = box[:d], tuple((0, n) for n in shape[d + 1:])
    if lo > 0: out.append(inside + ((0, lo),) + whole)
    if hi < size: out.append(inside + ((hi, size),) + whole)
  return out


def _source(buffer: int, strides: tuple[int, ...], offset: int, box: tuple[tuple[int, int], ...],
            out_strides: tuple[int, ...]) -> CopySource | None:
  """The box as a CopySource, its dimensions merged where both layouts run on; None for an empty box."""
  counts = [hi - lo for lo, hi in box]
  if 0 in counts: return None
  source_offset = offset + sum(lo * st for (lo, _), st in zip(box, strides))
  output_offset = sum(lo * st for (lo, _), st in zip(box, out_strides))
  dims: list[list[int]] = []
  for count, src, out in zip(counts, strides, out_strides):
    if count == 1: continue
    if dims and dims[-1][1] == src * count and dims[-1][2] == out * count: dims[-1] = [dims[-1][0] * count, src, out]
    else: dims.append([count, src, out])
  return CopySource(buffer, source_offset, output_offset, tuple(tuple(d) for d in dims) or ((1, 0, 0),))
