"""Refining a kernel's shape so that stacked views become one affine view.

in: a kernel tree (STORE root)
out: the same kernel over a finer shape, or the tree unchanged

A load stacks two views when it reads a reshape that its layout can't express, e.g. the gradient of
a 2x2 max-pool: the (b, c, 12, 2, 12, 2) pooled result expanded over each window, read as
(b, c, 24, 24). Indexed in the kernel's shape, that load needs `x // 2` and `x % 2`, which no SIMD
axis survives. Run the kernel over (b, c, 12, 2, 12, 2) instead (every axis of the kernel split the
way the lower view splits it) and the load is one view with plain strides; the store, being
contiguous, splits for free. The lowering merges back whatever axes didn't need splitting.

A kernel with a reduce gets the same treatment axis by axis: a matmul whose operand is the
attention's (batch, heads, tokens, head size) output read as (batch, tokens, width) sums over a width
axis that is really (heads, head size); split so, the operand's load is affine, and the register
tile and SIMD lanes apply.
"""
from __future__ import annotations
import functools
import math
from tinychad.ops import BufferOps, KernelNode, ReduceOps, rebuild, rewrite

Shape = tuple[int, ...]


def _boundaries(shape: Shape) -> set[int]:
  """Products of the innermost axes: where a flat index splits into this shape's axes."""
  out, acc = {1}, 1
  for size in reversed(shape):
    acc *= size
    out.add(acc)
  return out


def common_refinement(shape: Shape, other: Shape) -> Shape | None:
  """The coarsest shape that splits into both `shape` and `other` (same size) by splitting axes only."""
  if math.prod(shape) != math.prod(other) or 0 in shape: return None
  cuts = sorted(_boundaries(shape) | _boundaries(other))
  if any(outer % inner for inner, outer in zip(cuts, cuts[1:])): return None
  return tuple(outer // inner for inner, outer in reversed(list(zip(cuts, cuts[1:])))) or ()


def _reshaped(node: KernelNode, srcs: tuple[KernelNode, ...], shape: Shape) -> KernelNode:
  """`node` (with its rebuilt sources) over `shape`: the views of loads, consts and the store reshaped."""
  if node.op in (BufferOps.LOAD, BufferOps.CONST, BufferOps.STORE): return rebuild(node, srcs, (node.arg[0], node.arg[1].reshape(shape)))
  return rebuild(node, srcs)


# kernel trees are interned, so a schedule that repeats (a training loop) refines each kernel once
@functools.lru_cache(maxsize=4096)
def refine_kernel_shape(ast: KernelNode) -> KernelNode:
  nodes = ast.walk()
  if any(n.op is BufferOps.GATHER for n in nodes): return ast
  reduces = [n for n in nodes if isinstance(n.op, ReduceOps)]
  if reduces: return _refine_reduce(ast, reduces[0])
  leaves = [n for n in nodes if n.op in (BufferOps.LOAD, BufferOps.CONST)]
  shape = ast.arg[1].shape
  refined = shape
  for leaf in leaves:
    views = leaf.arg[1].views
    if len(views) < 2 or not views[-1].contiguous: continue
    finer = common_refinement(refined, views[-2].shape)
    if finer is not None: refined = finer
  if refined == shape: return _refine_by_cuts(ast, leaves)
  # keep the split only if no leaf gains a view (a masked axis may not split inside one view)
  if any(len(leaf.arg[1].reshape(refined).views) > len(leaf.arg[1].views) for leaf in leaves): return ast
  return rewrite(ast, lambda node, srcs: _reshaped(node, srcs, refined))


def _refine_by_cuts(ast: KernelNode, leaves: list[KernelNode]) -> KernelNode:
  """An elementwise kernel whose stacked-view loads read a padded or strided top view (a cat of attention heads'
  gradients into (batch, tokens, 3 x width), the heads' layout below): each axis cut where a lower view cuts it
  (_axis_cuts), if then no leaf has more views and some have fewer."""
  shape = ast.arg[1].shape
  refined = tuple(p for axis in _cut_axes(shape, leaves) for p in axis)
  if refined == shape: return ast
  old = [len(n.arg[1].views) for n in leaves + [ast]]
  new = [len(n.arg[1].reshape(refined).views) for n in leaves + [ast]]
  if any(a > b for a, b in zip(new, old)) or sum(new) >= sum(old): return ast
  return rewrite(ast, lambda node, srcs: _reshaped(node, srcs, refined))


def _cut_axes(shape: Shape, leaves: list[KernelNode]) -> list[tuple[int, ...]]:
  """Per axis of `shape`, its pieces: the axis cut wherever a stacked-view leaf's lower view cuts it."""
  cuts: list[set[int]] = [set() for _ in shape]
  for leaf in leaves:
    views = leaf.arg[1].views
    if len(views) < 2: continue
    for i, (size, stride) in enumerate(zip(shape, views[-1].strides)):
      if size > 1 and stride != 0: cuts[i].update(_axis_cuts(size, stride, views[-2].shape))
  return [_pieces(size, axis_cuts) for size, axis_cuts in zip(shape, cuts)]


def _axis_cuts(size: int, stride: int, lower: Shape) -> list[int]:
  """Where an axis of `size` steps of `stride` (in the flat index of a view below, shaped `lower`) may be
  cut so that each piece moves within one axis of `lower`: the f dividing size with f*stride a boundary
  of `lower`."""
  bounds = _boundaries(lower)
  return [f for f in range(2, size) if size % f == 0 and abs(stride) * f in bounds]


def _pieces(size: int, cuts: set[int]) -> tuple[int, ...]:
  """An axis of `size` split at `cuts` (each dividing the next, the others dropped): its sizes, outermost first."""
  sizes, inner = [], 1
  for f in sorted(cuts) + [size]:
    if f % inner: continue
    sizes.append(f // inner)
    inner = f
  return tuple(reversed(sizes))


def _refine_reduce(ast: KernelNode, reduce: KernelNode) -> KernelNode:
  """A kernel with a reduce over a finer shape: each axis cut where a stacked-view load's lower view
  cuts it (_axis_cuts), if then no leaf has more views and some have fewer."""
  axes, full = reduce.arg
  out_shape = ast.arg[1].shape
  # a row reduce (its output spans the reduce axes) keeps its shape: its second pass is laid out by it
  if out_shape != tuple(1 if i in axes else s for i, s in enumerate(full)): return ast
  below = [n for n in reduce.walk() if n.op in (BufferOps.LOAD, BufferOps.CONST)]
  pieces = _cut_axes(full, below)
  refined = tuple(p for axis in pieces for p in axis)
  if refined == full: return ast
  new_axes, at = [], 0
  for i, axis in enumerate(pieces):
    if i in axes: new_axes += range(at, at + len(axis))
    at += len(axis)
  refined_out = tuple(1 if i in new_axes else s for i, s in enumerate(refined))
  inside = set(below)
  above = [n for n in ast.walk() if n.op in (BufferOps.LOAD, BufferOps.CONST) and n not in inside] + [ast]
  old = [len(n.arg[1].views) for n in below + above]
  new = [len(n.arg[1].reshape(refined).views) for n in below] + [len(n.arg[1].reshape(refined_out).views) for n in above]
  if any(a > b for a, b in zip(new, old)) or sum(new) >= sum(old): return ast
  inner = rewrite(reduce, lambda node, srcs: _reshaped(node, srcs, refined))
  inner = rebuild(inner, inner.srcs, (tuple(new_axes), refined))
  def outer(node: KernelNode, srcs: tuple[KernelNode, ...]) -> KernelNode:
    return _reshaped(node, tuple(inner if src is reduce else src for src in srcs), refined_out)
  return rewrite(ast, outer, keep=lambda node: node is reduce)
