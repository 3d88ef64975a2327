"""The analyze pass: the facts about a kernel tree that lowering and opt.py need, worked out once.

in: a kernel tree (STORE root, ALU ops, at most one reduce, LOAD/CONST/GATHER leaves with ShapeTrackers)
out: a Kernel: its simplified dims ((size, is_reduce) per axis), its leaves (the store last) with their
     top views rewritten over those dims, which nodes lie below the reduce, whether it is a row reduce,
     and one LeafAccess per leaf plus the dtypes and ops it uses (what opt.choose_opts takes).
Size-1 axes are dropped and neighbouring axes that every view walks contiguously are merged, so an
elementwise kernel over a contiguous tensor becomes one flat loop.
"""
from __future__ import annotations
from dataclasses import dataclass
from tinychad.dtype import DType
from tinychad.ops import Op, UnaryOps, ReduceOps, BufferOps, KernelNode
from tinychad.view import ShapeTracker, View
from tinychad.codegen.symbolic import Node, Num, Var, to_node
from tinychad.codegen.opt import Dims, LeafAccess

LEAF_OPS = (BufferOps.LOAD, BufferOps.CONST, BufferOps.GATHER)


def _top(st: ShapeTracker) -> View: return st.views[-1]


def all_invalid(st: ShapeTracker) -> bool:
  """Every element of the tracker is masked off (an empty window): it reads nothing."""
  return any(v.mask is not None and any(lo >= hi for lo, hi in v.mask) for v in st.views)


def _drop_axes(view: View, keep: list[int]) -> View:
  mask = tuple(view.mask[i] for i in keep) if view.mask is not None else None
  return View(tuple(view.shape[i] for i in keep), tuple(view.strides[i] for i in keep), view.offset, mask)


def _can_merge(view: View, i: int) -> bool:
  """Axes i and i+1 of the view walk memory as one axis (and the mask allows it)."""
  if view.strides[i] != view.strides[i + 1] * view.shape[i + 1]: return False
  return view.mask is None or view.mask[i + 1] == (0, view.shape[i + 1])


def _merge(view: View, i: int) -> View:
  inner = view.shape[i + 1]
  shape = view.shape[:i] + (view.shape[i] * inner,) + view.shape[i + 2:]
  strides = view.strides[:i] + (view.strides[i + 1],) + view.strides[i + 2:]
  mask = None
  if view.mask is not None:
    lo, hi = view.mask[i]
    mask = view.mask[:i] + ((lo * inner, hi * inner),) + view.mask[i + 2:]
  return View(shape, strides, view.offset, mask)


def simplify_dims(full_shape: tuple[int, ...], reduce_axes: tuple[int, ...],
                  views: list[View]) -> tuple[Dims, list[View]]:
  """Drop size-1 axes and merge mergeable neighbours. Returns the dims as (size, is_reduce) and the
  top views rewritten to match. `views` are the top views of every tracker, each over full_shape or
  over the output shape (reduce axes of size 1); both change the same way."""
  keep = [i for i, s in enumerate(full_shape) if s != 1]
  dims = [(full_shape[i], i in reduce_axes) for i in keep]
  views = [_drop_axes(v, keep) for v in views]
  i = 0
  while i < len(dims) - 1:
    (s0, r0), (s1, r1) = dims[i], dims[i + 1]
    if r0 == r1 and s0 != 0 and s1 != 0 and all(_can_merge(v, i) for v in views):
      dims[i:i + 2] = [(s0 * s1, r0)]
      views = [_merge(v, i) for v in views]
    else: i += 1
  return dims, views


def key_of(node: Node | None): return None if node is None else node.key


@dataclass(frozen=True, eq=False)
class Kernel:
  """What lowering knows about a kernel before any lanes are chosen."""
  ast: KernelNode                    # the STORE root
  reduce: KernelNode | None          # its one reduce, if any
  below: set[int]                    # ids of the nodes inside the reduce (computed in its loop)
  row_pass: bool                     # a row reduce: the output spans the reduce axes (see linearize.py)
  leaves: list[KernelNode]           # LOAD/CONST/GATHER nodes, then the store
  dims: Dims                         # simplified (size, is_reduce) per axis
  views: dict[int, View]             # id(leaf) -> its top view over dims
  access: list[LeafAccess]           # per leaf, what opt.py decides lanes from
  dtypes_used: set[DType]
  ops_used: set[Op]

  def tracker(self, leaf: KernelNode) -> ShapeTracker:
    """The leaf's ShapeTracker with its top view over the simplified dims."""
    return ShapeTracker(leaf.arg[1].views[:-1] + (self.views[id(leaf)],))

  def walks_reduce_axes(self, leaf: KernelNode) -> bool:
    """The leaf's index moves along the reduce axes: it is read in the reduce loop, or in a row reduce's
    second pass, where the loop over the row runs again; elsewhere a reduce axis is 0 (the output has
    size 1 there)."""
    return id(leaf) in self.below or self.row_pass


def _strides(node: KernelNode, view: View, dims: Dims, below: bool) -> tuple[int | None, ...]:
  """Per dim, how far node's index (top view `view`) moves when that dim steps by one (None: not a
  constant step or the validity changes). One view gives it directly; stacked views are asked
  symbolically. `below`: the node is read inside the reduce loop."""
  # a gathered row moves with its index wherever row 0's view stands still: not a known step there
  if node.op is BufferOps.GATHER: return tuple(None if stride == 0 else stride for stride in view.strides)
  if len(node.arg[1].views) == 1: return view.strides
  st, out = ShapeTracker(node.arg[1].views[:-1] + (view,)), []
  for d, (size, is_reduce) in enumerate(dims):
    if (is_reduce and not below) or size < 2: out.append(0); continue
    pair = []
    for shift in (0, 1):
      idxs = [Num(0) if r and not below else Var(f"d{i}", 0, s - 1 - (i == d)) + (shift if i == d else 0)
              for i, (s, r) in enumerate(dims)]
      index, valid = st.expr_idxs(idxs)
      pair.append((to_node(index), None if valid is None else to_node(valid)))
    step = pair[1][0] - pair[0][0]
    same_valid = key_of(pair[0][1]) == key_of(pair[1][1])
    out.append(step.value if isinstance(step, Num) and same_valid else None)
  return tuple(out)


def _masked(node: KernelNode, view: View, dims: Dims) -> tuple[bool, ...]:
  """Per dim, whether the leaf's validity changes along it: a padded or concatenated input read through a mask."""
  if node.op is BufferOps.GATHER: return (False,) * len(dims)
  if len(node.arg[1].views) == 1:
    if view.mask is None: return (False,) * len(dims)
    return tuple(bounds != (0, size) for bounds, (size, _) in zip(view.mask, dims))
  st = ShapeTracker(node.arg[1].views[:-1] + (view,))
  _, valid = st.expr_idxs([Var(f"d{i}", 0, size - 1) if size > 1 else Num(0) for i, (size, _) in enumerate(dims)])
  names = set() if valid is None else {v.name for v in to_node(valid).vars()}
  return tuple(f"d{i}" in names for i in range(len(dims)))


def analyze(ast: KernelNode) -> Kernel:
  """The kernel's facts: simplified dims, leaves and their views, and how each leaf is accessed."""
  nodes = ast.walk()
  reduce = next((n for n in nodes if isinstance(n.op, ReduceOps)), None)
  out_shape = ast.arg[1].shape
  full_shape = reduce.arg[1] if reduce is not None else out_shape
  reduce_axes = tuple(reduce.arg[0]) if reduce is not None else ()
  below = {id(n) for n in reduce.walk()} if reduce is not None else set()
  leaves = [n for n in nodes if n.op in LEAF_OPS] + [ast]
  dims, views = simplify_dims(full_shape, reduce_axes, [_top(n.arg[1]) for n in leaves])
  access = [LeafAccess(_strides(n, v, dims, id(n) in below), n.op in (BufferOps.LOAD, BufferOps.GATHER), n is ast,
                        id(n) in below, n.dtype.itemsize, n.op is BufferOps.GATHER, _masked(n, v, dims))
            for n, v in zip(leaves, views)]
  dtypes_used = {n.dtype for n in nodes} | {n.arg for n in nodes if n.op is UnaryOps.CAST}
  # a row reduce (engine/schedule.py): the output spans the reduce axes, so after the reduce loop
  # closes, the kernel loops over them again to compute and store every element of the row
  return Kernel(ast, reduce, below, reduce is not None and out_shape == full_shape, leaves, dims,
                {id(n): v for n, v in zip(leaves, views)}, access, dtypes_used, {n.op for n in nodes})
