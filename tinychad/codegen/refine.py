"""Refining an elementwise kernel's shape so that stacked views become one affine view.

in: a kernel tree (STORE root) without a reduce
out: the same kernel over a finer shape, or the tree unchanged

A load stacks two views when it reads a reshape that its layout can't express, e.g. the gradient of
a 2x2 max-pool: the (b, c, 12, 2, 12, 2) pooled result expanded over each window, read as
(b, c, 24, 24). Indexed in the kernel's shape, that load needs `x // 2` and `x % 2`, which no SIMD
axis survives. Run the kernel over (b, c, 12, 2, 12, 2) instead (every axis of the kernel split the
way the lower view splits it) and the load is one view with plain strides; the store, being
contiguous, splits for free. The lowering merges back whatever axes didn't need splitting.
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
  if any(isinstance(n.op, ReduceOps) or n.op is BufferOps.GATHER for n in nodes): return ast
  leaves = [n for n in nodes if n.op in (BufferOps.LOAD, BufferOps.CONST)]
  shape = ast.arg[1].shape
  refined = shape
  for leaf in leaves:
    views = leaf.arg[1].views
    if len(views) < 2 or not views[-1].contiguous: continue
    finer = common_refinement(refined, views[-2].shape)
    if finer is not None: refined = finer
  if refined == shape: return ast
  # keep the split only if no leaf gains a view (a masked axis may not split inside one view)
  if any(len(leaf.arg[1].reshape(refined).views) > len(leaf.arg[1].views) for leaf in leaves): return ast
  return rewrite(ast, lambda node, srcs: _reshaped(node, srcs, refined))
