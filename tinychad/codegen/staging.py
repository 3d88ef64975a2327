"""The staging pass: a load's panel copied into a scratch array inside the kernel (opt.py's `stage`).

in: the analyze pass's Kernel and the chosen Opts (which leaf is staged); then, while lowering, a Context
out: the Staged load (which node, inside how many outer loops its panel is copied, its lanes), and the
     copy itself: a loop over the reduce indices that reads the load in vector rows into the panel
A staged load (B in a matmul) is copied into a scratch array (DEFINE_LOCAL, on the stack of the thread
running the call) inside the last outer loop it moves along; the register tile below then reads that
panel (values.py) instead of B:
  for panel: { for k: local[k*64 : k*64+64] = B[k, panel*64 : +64];  for rows: { for k: acc += A * local[k*64 ...] } }
"""
from __future__ import annotations
from tinychad.codegen.analyze import Kernel
from tinychad.codegen.context import Context, Staged, Tail
from tinychad.codegen.opt import Opts, stage_depth, staging_fits
from tinychad.codegen.symbolic import Num, to_node
from tinychad.codegen.uops import UOps
from tinychad.codegen.values import read


def plan_stage(kernel: Kernel, opts: Opts, name: str) -> Staged | None:
  """The load `opts` stages, checked to fit; None when nothing is staged."""
  if opts.stage is None: return None
  if not staging_fits(kernel.dims, kernel.access, opts, opts.stage):
    raise ValueError(f"{name}: leaf {opts.stage} can't be staged under {opts}")
  depth = stage_depth(kernel.dims, kernel.access[opts.stage], opts)
  return Staged(kernel.leaves[opts.stage], depth, opts.upcast[opts.vector[0]])


def copy_panel(ctx: Context, tail: Tail) -> None:
  """Copy the staged load's panel for the loops open now into the scratch array, one vector row
  of the tile per reduce index. The dims it doesn't move along (the tile's, not open yet) are 0."""
  staged, (vec, width), dims = ctx.staged, ctx.opts.vector, ctx.kernel.dims
  tracker = ctx.kernel.tracker(staged.node)
  picked = set(ctx.opts.order[:staged.depth])
  opened = [ctx.out.open_loop(ctx.loop_vars[d], extent) for d, extent in ctx.reduce_extents()]
  for offset in range(0, staged.lanes, width):
    lane = tuple(offset if d == vec else 0 for d in range(len(dims)))
    exprs = []
    for ln in ctx.vector_lanes(lane):
      idxs = [ctx.dim_index(d, ln[d], tail) if r or d in picked else Num(0) for d, (_, r) in enumerate(dims)]
      index, valid = tracker.expr_idxs(idxs)
      exprs.append((to_node(index), None if valid is None else to_node(valid)))
    row = read(ctx, staged.node, exprs)
    ctx.out.emit(UOps.STORE, None, (ctx.panel, ctx.out.index(ctx.panel_index(lane, tail)), row), cse=False)
  ctx.close_loops(opened)
