"""What the lowering passes share while one kernel is lowered, and where in the kernel they stand.

in: the analyze pass's Kernel, the chosen Opts, the program being emitted (emit.py)
out: a Context: every field the passes read, declared in one place and set when it is made, with the
     lane and index arithmetic they all use (which lanes a value has, the symbolic index of a leaf
     at a lane); and Place, the small immutable value each lowering call is given to say where it is:
     in which tail tile, in which phase (outside the reduce, inside its loop, in a row pass), and,
     outside the reduce loop, the reduce's results.
What changes while lowering is the program (the Emitter: UOps, CSE scopes, open loops), which values
the reduce loop wrote to scratch rows (`row_written`, read back by the row pass) and a cache of leaf indices.
"""
from __future__ import annotations
from dataclasses import dataclass, field
from enum import Enum, auto
from tinychad.ops import KernelNode
from tinychad.codegen.analyze import Kernel, all_invalid
from tinychad.codegen.emit import Emitter
from tinychad.codegen.opt import Opts, panel_strides, reduce_size
from tinychad.codegen.symbolic import Node, Num, Var, plus_constant, to_node
from tinychad.codegen.uops import UOp

Lane = tuple[int, ...]             # the unrolled offset along every dim (0 on dims that aren't upcast)
Tail = tuple[tuple[int, int], ...]  # (axis, lanes of its tail tile) while a tail tile is lowered, else ()


class Phase(Enum):
  OUTSIDE = auto()   # around the reduce loop, or a kernel without one
  REDUCE = auto()    # in the reduce loop: the staged load reads its panel; row-cached values are written
  ROW = auto()       # a row reduce's second pass: row-cached values are read back from their scratch row


@dataclass(frozen=True, eq=False)
class Place:
  """Where a value is lowered: handed down every lowering call (modes are arguments, not flags)."""
  tail: Tail = ()
  phase: Phase = Phase.OUTSIDE
  acc: dict[Lane, UOp] = field(default_factory=dict)    # the reduce's result per outer lane, once it ran
  slots: dict[Lane, int] = field(default_factory=dict)  # outer lane -> its row in a scratch row cache


@dataclass(frozen=True)
class Staged:
  """The load copied into a scratch panel inside the kernel (opt.py's `stage`)."""
  node: KernelNode
  depth: int     # the outer loops (opts.order) open when the panel is copied
  lanes: int     # panel elements per reduce index: the vector axis's tile lanes


def tail_lanes(tail: Tail, d: int) -> int | None:
  for axis, lanes in tail:
    if axis == d: return lanes
  return None


@dataclass(eq=False)
class Context:
  kernel: Kernel
  name: str
  opts: Opts
  out: Emitter                          # the program being emitted
  loop_vars: list[Var]                  # per dim, its loop variable (over whole tiles)
  globals: list[UOp]                    # DEFINE_GLOBALs: the output, then the inputs by number
  staged: Staged | None
  panel: UOp | None                     # the staged panel (DEFINE_LOCAL)
  row_cache: dict[KernelNode, UOp]      # node -> its scratch row (DEFINE_LOCAL), see rowcache.py
  streams: bool                         # whole aligned SIMD stores of the output go straight to memory
  # (node, lane, tail) -> lanes of the value the reduce loop wrote to its scratch row
  row_written: dict = field(default_factory=dict)
  # (leaf id, lane, tail) -> (index, validity) of the leaf at that lane
  expr_cache: dict = field(default_factory=dict)

  def dim_index(self, d: int, offset: int, tail: Tail) -> Node:
    """Dim d's index at lane offset `offset`: in a tail tile the whole tiles' end, without a loop the
    offset alone, else the loop variable times the tile."""
    amount = self.opts.upcast.get(d, 1)
    if tail and tail_lanes(tail, d) is not None: return Num(self.kernel.dims[d][0] // amount * amount + offset)
    if self.kernel.dims[d][0] < 2 * amount: return Num(offset)       # at most one whole tile: no loop
    return self.loop_vars[d] * amount + offset if amount > 1 else self.loop_vars[d]

  def vector_lanes(self, lane: Lane) -> list[Lane]:
    """The lanes one SIMD value at `lane` covers (just `lane` without a vector axis)."""
    if self.opts.vector is None: return [lane]
    d, width = self.opts.vector
    return [lane[:d] + (lane[d] + i,) + lane[d + 1:] for i in range(width)]

  def lanes(self, reduce: bool, tail: Tail) -> list[Lane]:
    """Every unrolled lane over the upcast dims of one kind (reduce or not); vector lanes step by the width."""
    dims = self.kernel.dims
    out = [tuple(0 for _ in dims)]
    for d, amount in self.opts.upcast.items():
      if dims[d][1] != reduce: continue
      amount = tail_lanes(tail, d) or amount
      step = self.opts.vector[1] if self.opts.vector is not None and self.opts.vector[0] == d else 1
      out = [ln[:d] + (off,) + ln[d + 1:] for ln in out for off in range(0, amount, step)]
    return out

  def leaf_expr(self, node: KernelNode, lane: Lane, tail: Tail) -> tuple[Node, Node | None]:
    """The symbolic (index, validity) of a leaf at one lane."""
    key = (id(node), lane, tail)
    if key not in self.expr_cache:
      kernel = self.kernel
      flat = not kernel.walks_reduce_axes(node)
      top = kernel.views[id(node)]
      if all_invalid(node.arg[1]): self.expr_cache[key] = (Num(0), Num(0))
      elif len(node.arg[1].views) == 1 and top.mask is None and any(lane):
        # one view, no mask: the index is linear in each dim's index, and a lane moves each dim by a constant, so
        # the lane's index is lane 0's plus a constant (the same expression, built once per leaf, not per lane)
        first, _ = self.leaf_expr(node, (0,) * len(lane), tail)
        shift = sum(offset * stride for offset, stride, (_, r) in zip(lane, top.strides, kernel.dims) if not (r and flat))
        self.expr_cache[key] = (plus_constant(first, shift), None)
      else:
        idxs = [Num(0) if r and flat else self.dim_index(d, lane[d], tail) for d, (_, r) in enumerate(kernel.dims)]
        index, valid = kernel.tracker(node).expr_idxs(idxs)
        self.expr_cache[key] = (to_node(index), None if valid is None else to_node(valid))
    return self.expr_cache[key]

  def reduce_extents(self) -> list[tuple[int, int]]:
    """(dim, loop extent) of every reduce dim that has a loop."""
    extents = [(d, s // self.opts.upcast.get(d, 1)) for d, (s, r) in enumerate(self.kernel.dims) if r]
    return [(d, extent) for d, extent in extents if extent != 1]

  def open_reduce_loops(self) -> list[UOp]:
    extents = self.reduce_extents()
    # the unroll hint goes on the innermost loop, whose body is the one the hint repeats
    return [self.out.open_loop(self.loop_vars[d], extent, unroll=self.opts.unroll if i == len(extents) - 1 else 1)
            for i, (d, extent) in enumerate(extents)]

  def close_loops(self, loops: list[UOp]) -> None:
    for loop in reversed(loops): self.out.close_loop(loop)

  def panel_index(self, lane: Lane, tail: Tail) -> Node:
    """Where the staged load's element at `lane` sits in the panel: reduce index (row-major over the
    reduce dims, at the open reduce loops) times the panel's lanes, plus the lane along the vector axis."""
    index: Node = Num(lane[self.opts.vector[0]])
    for d, step in panel_strides(self.kernel.dims, self.staged.lanes).items():
      index = index + self.dim_index(d, 0, tail) * step
    return index

  def row_slot(self, lane: Lane, at: Place) -> UOp:
    """Where the value at `lane` sits in its scratch row: the outer lane's row, then the reduce position
    row-major with the vector axis innermost, so that the lanes of a SIMD value are consecutive."""
    dims = self.kernel.dims
    reduce_dims = [d for d, (_, r) in enumerate(dims) if r]
    if self.opts.vector is not None:
      reduce_dims = [d for d in reduce_dims if d != self.opts.vector[0]] + [self.opts.vector[0]]
    outer = tuple(0 if r else x for x, (_, r) in zip(lane, dims))
    index: Node = Num(at.slots[outer] * reduce_size(dims))
    step = 1
    for d in reversed(reduce_dims):
      index = index + self.dim_index(d, lane[d], at.tail) * step
      step *= dims[d][0]
    return self.out.index(index)
