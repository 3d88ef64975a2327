"""The scheduler: a lazy graph becomes an ordered list of kernels.

in: the LazyBuffers to realize
out: ScheduleItems, dependencies first. Each is one kernel tree (loads with views -> ALU ops -> at most
     one reduce -> ALU ops -> store) plus the buffers it reads and writes.
Fusion rules, in order:
  - a base that is already realized, a load op (COPY, EMPTY, CONTIGUOUS, GATHER, SCATTER_ADD) or used more than once is
    its own kernel (so a tensor used twice is computed once), except a cheap elementwise base (a few
    ALU ops over realized inputs, no reduce): re-reading its inputs costs less than writing it to
    memory and reading it back, so each consumer recomputes it (softmax's exp is one), and an
    elementwise base whose every read lands in one kernel (erf's x*x, read by two polynomials): it
    is computed there once, in registers;
  - an elementwise base read by exactly one consumer is inlined into that consumer's kernel, its views
    composed with the consumer's (no copy), unless the view pads (padding reads zeros, and the op
    may not map zero to zero) or expands (a matmul operand would be recomputed for every reuse);
  - a reduce is inlined into its single elementwise consumer when that consumer reads it through a
    plain contiguous view; then the consumer runs in the reduce's output space;
  - a row reduce: a reduce over the innermost axes (a row of at most ROW_REDUCE_MAX_ELEMENTS) whose
    consumer reads it back expanded over the same rows (softmax's 1/sum, layernorm's variance) is
    inlined too, with the per-row ops between them; the kernel reduces a row, then loops over the
    row again while it is in cache to compute and store it (codegen's "row pass"). Of several
    candidates, the one the others feed (the variance, not the mean);
  - a kernel holds at most one reduce; any other reduce it needs is realized first;
  - a chain of inlined ops at most MAX_FUSED_DEPTH deep: a base deeper than that in its kernel's tree
    is realized, so a loop of updates realized once at the end becomes several kernels.
Kernels are scheduled in the graph's order, sources first, and the fusion questions that walk
along the graph run on a stack of their own (_answer): an unrolled RNN thousands of ops deep
schedules without Python recursion.
After fusion, an elementwise kernel may run over a finer shape (codegen/refine.py: a load that reads a
reshape its layout can't express becomes one view), and one layout rule (off with NOOPT=1):
  - a realized operand that a reduce reads with a large step along a reduce axis (a row of B in a
    matmul: one page and one L1 set per step), contiguously along a non-reduce axis and many times
    over (stride 0 along another axis) is first copied into panels, by a kernel of its own made of
    movement ops + contiguous: panel p holds columns [p*P, (p+1)*P) for every reduce index, so the
    register tile reads one contiguous stream (P = opt.panel_width, one tile row). The consumer's
    lane axis is split into (panels, P) to read it through a single view. Only where one panel
    is too big to stage: codegen copies a smaller one inside the kernel, each thread its own panel
    while it is in cache (opt.py's `stage`), which costs no pass over memory and no kernel launch.
    A transposed operand (w.T in x @ w.T: contiguous along the reduce, along no output axis) read
    by TRANSPOSED_PACK_MIN_REUSE rows or more is packed into panels whatever its size, so the kernel
    gets SIMD lanes along its output columns.
"""
from __future__ import annotations
from dataclasses import dataclass, field
import time
from typing import Any, Generator
from tinychad.codegen.opt import STAGE_MAX_BYTES, panel_width
from tinychad.codegen.refine import refine_kernel_shape
from tinychad.device import Buffer, Device
from tinychad.engine.schedule_cache import graph_key, remember, remembered
from tinychad.helpers import DEBUG, GlobalCounters, getenv, inverse_permutation, prod
from tinychad.lazy import LazyBuffer
from tinychad.ops import BufferOps, KernelNode, LoadOps, ReduceOps, ALU_OPS
from tinychad.view import ShapeTracker

# a reduce step of at least this many bytes puts every read on its own 4 KiB page, in the same L1 set
# (48 KiB, 12 ways: one way is 4 KiB), so a panel of B can't stay in L1 or the TLB: pack it
PACK_MIN_STRIDE_BYTES = 4096
# packing reads and writes the operand once; it pays off when the kernel reads it this many times over
PACK_MIN_REUSE = 16
# a transposed operand's pack is a transposing copy, dearer: x (M rows) @ w.T, w 1024x1024, 2 threads:
# M=16 0.21 -> 0.41 ms, M=32 0.39 -> 0.52, M=64 0.81 -> 0.69, M=256 3.3 -> 1.8 ms (w 1024x256: M=32
# 0.15 -> 0.12, M=64 0.32 -> 0.16)
TRANSPOSED_PACK_MIN_REUSE = 64
# ops one kernel may chain: a longer chain (a loop of elementwise updates, realized once at the end)
# is cut into kernels this deep. Building, lowering and rendering a kernel tree recurse along it,
# ~3 Python frames per op, which keeps a kernel well inside Python's default limit of 1000
MAX_FUSED_DEPTH = 128


@dataclass
class ScheduleItem:
  ast: KernelNode                  # STORE root for compute kernels; a LoadOps node for EMPTY / COPY
  output: LazyBuffer               # the base this item realizes
  inputs: tuple[LazyBuffer, ...]   # bases read, as LOAD buffer numbers 1..n
  # (name, iteration space, ops per point, points, bytes read and written): looked up on first use, then
  # read per run
  _info: tuple[str, tuple[int, ...], int, int, int] | None = field(default=None, init=False, repr=False, compare=False)

  @property
  def is_kernel(self) -> bool: return self.ast.op is BufferOps.STORE or self.ast.op is LoadOps.SCATTER_ADD

  @property
  def info(self) -> tuple[str, tuple[int, ...], int, int, int]:
    if self._info is None:
      name, full_shape, op_count = _kernel_info(self.ast, self.output.shape)
      moved = sum(buf.size * buf.dtype.itemsize for buf in (self.output,) + self.inputs)
      self._info = (name, full_shape, op_count, prod(full_shape), moved)
    return self._info

  @property
  def name(self) -> str:
    """What the kernel does and its sizes: E_4096 for elementwise, r_64_10_784 for a reduce."""
    return self.info[0]

  @property
  def full_shape(self) -> tuple[int, ...]:
    """The iteration space: the reduce's input shape, else the output shape."""
    return self.info[1]

  @property
  def op_count(self) -> int:
    """ALU and reduce ops per point of the iteration space (for FLOP counts)."""
    return self.info[2]

  @property
  def points(self) -> int:
    """The size of the iteration space."""
    return self.info[3]

  def __repr__(self) -> str: return f"<ScheduleItem {self.name} -> {self.output.shape} {self.output.dtype.name}>"


_info_cache: dict = {}


def _kernel_info(ast: KernelNode, out_shape: tuple[int, ...]) -> tuple[str, tuple[int, ...], int]:
  """(name, iteration space, ops per point) of a kernel tree, worked out once per distinct tree."""
  key = (ast, out_shape)
  if key in _info_cache: return _info_cache[key]
  if ast.op is LoadOps.SCATTER_ADD:
    rows, count, width, _ = ast.arg
    info = (f"scatter_add_{rows}_{count}_{width}", (count, width), 1)
  elif ast.op is not BufferOps.STORE:
    info = (ast.op.name.lower(), out_shape, 0)
  else:
    nodes = ast.walk()
    ops = sum(1 for n in nodes if isinstance(n.op, ALU_OPS) or isinstance(n.op, ReduceOps))
    reduce = next((n for n in nodes if isinstance(n.op, ReduceOps)), None)
    if reduce is None:
      info = ("E_" + ("_".join(str(s) for s in out_shape if s != 1) or "1"), ast.arg[1].shape, ops)
    else:
      axes, full = reduce.arg
      kept = [str(s) for i, s in enumerate(full) if i not in axes and s != 1]
      reduced = [str(s) for i, s in enumerate(full) if i in axes]
      info = ("r_" + "_".join(kept + reduced), full, ops)
  _info_cache[key] = info
  return info


# a fusion question: a generator that yields the questions it needs answered and returns its answer
Question = Generator[Generator, Any, Any]


def _answer(question: Question) -> Any:
  """Run `question`, sending each question it yields that one's answer, with the questions still
  waiting on a list: a chain of them thousands long needs no Python recursion."""
  waiting, answer = [question], None
  while True:
    try:
      asked = waiting[-1].send(answer)
    except StopIteration as finished:
      waiting.pop()
      if not waiting: return finished.value
      answer = finished.value
    else:
      waiting.append(asked)
      answer = None


class _Scheduler:
  def __init__(self, outs: list[LazyBuffer]):
    self.targets = {o.base for o in outs}
    self.items: list[ScheduleItem] = []
    self.scheduled: set[LazyBuffer] = set()
    self.forced: set[LazyBuffer] = set()
    self.uses: dict[LazyBuffer, int] = {}    # how many graph edges read each base
    self.readers: dict[LazyBuffer, list[tuple[LazyBuffer, ShapeTracker]]] = {}   # base -> (reader, view)
    self._owner_memo: dict[LazyBuffer, LazyBuffer | None] = {}
    self.has_reduce = False    # any reduce left to compute (else there is no row reduce to look for)
    self._cheap_memo: dict[LazyBuffer, bool] = {}
    self.packed: dict[tuple[LazyBuffer, ShapeTracker], LazyBuffer] = {}   # (operand, its view) -> its panels
    self._count_uses([o.base for o in outs])

  def _count_uses(self, roots: list[LazyBuffer]) -> None:
    """Fill uses and readers, and `order`: every base to compute, sources before the bases that read
    them. Depth first with a stack of its own: graphs thousands of ops deep (an unrolled RNN's
    backward) must not recurse."""
    self.order: list[LazyBuffer] = []
    seen: set[LazyBuffer] = set()
    stack = [(root, False) for root in reversed(roots)]
    while stack:
      base, sources_done = stack.pop()
      if sources_done:
        self.order.append(base)
        continue
      if base in seen or base.realized is not None: continue
      seen.add(base)
      if isinstance(base.op, ReduceOps): self.has_reduce = True
      stack.append((base, True))
      for src in reversed(base.srcs):
        child = src.base
        self.uses[child] = self.uses.get(child, 0) + 1
        self.readers.setdefault(child, []).append((base, src.st))
        stack.append((child, False))

  # The fusion questions below (must this base be realized? does one kernel read all of it? is it
  # cheap to recompute?) ask each other along chains of ops, forwards and backwards, and an unrolled
  # RNN's backward chains thousands of ops. So they are generators that yield the questions they
  # need answered, and _answer runs them on a list of its own instead of Python's call stack.
  def must_realize(self, base: LazyBuffer) -> bool: return _answer(self._must_realize(base))

  def _must_realize(self, base: LazyBuffer) -> Question:
    if base.realized is not None or base in self.targets or base in self.forced: return True
    if base.op is LoadOps.CONST: return False
    if isinstance(base.op, LoadOps): return True
    if self.uses.get(base, 0) <= 1: return False
    if (yield self._single_kernel(base)) is not None: return False
    return not (yield self._cheap(base))

  def _single_kernel(self, base: LazyBuffer) -> Question:
    """The output of the one kernel every read of elementwise `base` is inlined into, or None when
    its reads land in several kernels (or in a reduce, or through a view that forces a load).
    erf's x*x is read by both of its polynomials: it stays in registers instead of memory."""
    if base in self._owner_memo: return self._owner_memo[base]
    self._owner_memo[base] = None   # a cycle can't happen in a DAG; this only guards re-entry
    owner: LazyBuffer | None = None
    for reader, st in self.readers.get(base, ()):
      if isinstance(reader.op, ReduceOps) or isinstance(base.op, ReduceOps): return None
      if st.has_mask or prod(st.shape) > base.size: return None
      here = reader if (yield self._must_realize(reader)) else (yield self._single_kernel(reader))
      if here is None or (owner is not None and here is not owner): return None
      owner = here
    self._owner_memo[base] = owner
    return owner

  CHEAP_OPS = 8   # ALU ops an elementwise base may have and still be recomputed by each consumer

  def _cheap(self, base: LazyBuffer) -> Question:
    if base not in self._cheap_memo:
      self._cheap_memo[base] = (yield self._count_fused_ops(base, self.CHEAP_OPS)) is not None
    return self._cheap_memo[base]

  def _count_fused_ops(self, base: LazyBuffer, budget: int) -> Question:
    """ALU ops in the part of base's graph a kernel would inline; None if over budget or a reduce is inlined."""
    if isinstance(base.op, ReduceOps) or isinstance(base.op, LoadOps): return None
    used = 1
    for src in base.srcs:
      child = src.base
      if child.realized is not None or child.op is LoadOps.CONST or (yield self._must_realize(child)): continue
      if isinstance(child.op, ReduceOps) and not _plain(src.st, child): continue   # it will be loaded
      if src.st.has_mask or src.size > child.size: continue   # build() force-loads it (layernorm's mean)
      more = yield self._count_fused_ops(child, budget - used)
      if more is None: return None
      used += more
    return used if used <= budget else None

  def _inlined_reduces(self, base: LazyBuffer, through_reduces: bool) -> set[LazyBuffer]:
    """The reduces a kernel computing `base` could inline: reached through bases that aren't realized,
    past other reduces' inputs only when `through_reduces`."""
    found, seen, stack = set(), set(), [src.base for src in base.srcs]
    while stack:
      node = stack.pop()
      if node in seen or node.realized is not None or node.op is LoadOps.CONST or self.must_realize(node): continue
      seen.add(node)
      if isinstance(node.op, ReduceOps):
        found.add(node)
        if not through_reduces: continue
      stack.extend(src.base for src in node.srcs)
    return found

  def reaches(self, base: LazyBuffer, reduce: LazyBuffer | None) -> bool:
    """`reduce` is `base` or one of the reduces base's kernel could inline."""
    return reduce is not None and (base is reduce or reduce in self._inlined_reduces(base, False))

  def row_reduce_of(self, out: LazyBuffer) -> LazyBuffer | None:
    """The reduce an elementwise `out` can compute in its own kernel, row by row: a reduce over the
    innermost axes of out's shape, read back expanded over each row (softmax's sum, layernorm's
    variance). Its kernel sums a row, then runs over the same row again while it is still in cache,
    instead of writing the sums and reading the rows back from memory in a second kernel. When several
    reduces qualify, the one the others feed (layernorm's variance needs the mean); never two."""
    if not self.has_reduce or isinstance(out.op, (ReduceOps, LoadOps)): return None
    candidates = [r for r in self._inlined_reduces(out, False) if _row_reduce_fits(r, out.shape)]
    last = [r for r in candidates if not any(r in self._inlined_reduces(other, True) for other in candidates if other is not r)]
    return last[0] if len(last) == 1 else None

  def schedule(self) -> None:
    """A kernel for every base that must be realized, sources first: when a kernel is built, the
    kernels it loads from are scheduled already, so building never recurses from one kernel into
    the next (only into a base a build decides to load, which has nothing left to wait for)."""
    # how many ops deep each base's inlined tree would be: past MAX_FUSED_DEPTH the base gets a
    # kernel of its own, so no kernel tree is deep enough to recurse past Python's limit
    depth: dict[LazyBuffer, int] = {}
    for base in self.order:
      if not self.must_realize(base):
        depth[base] = 1 + max((depth.get(src.base, 0) for src in base.srcs), default=0)
        if depth[base] <= MAX_FUSED_DEPTH: continue
        self.forced.add(base)
      depth[base] = 0
      self.realize(base)

  def realize(self, base: LazyBuffer) -> None:
    """Schedule the kernel that computes `base` (after everything it needs)."""
    if base.realized is not None or base in self.scheduled: return
    self.scheduled.add(base)
    if base.op is LoadOps.EMPTY:
      self.items.append(ScheduleItem(KernelNode(LoadOps.EMPTY), base, ()))
    elif base.op is LoadOps.COPY:
      src = base.srcs[0].base
      self.realize(src)
      self.items.append(ScheduleItem(KernelNode(LoadOps.COPY), base, (src,)))
    elif base.op is LoadOps.SCATTER_ADD:
      # both sources are contiguous (LazyBuffer.scatter_add made them so): the kernel reads their buffers
      rows, indices = (src.base for src in base.srcs)
      for src in (rows, indices): self.realize(src)
      arg = (base.arg, indices.size, base.size // max(base.arg, 1), indices.dtype)
      self.items.append(ScheduleItem(KernelNode(LoadOps.SCATTER_ADD, (), arg, base.dtype), base, (rows, indices)))
    else:
      builder = _KernelBuilder(self, base)
      ast = refine_kernel_shape(builder.kernel())
      if builder.fused_reduce is not None and not getenv("NOOPT", 0): ast = builder.pack_strided_loads(ast)
      self.items.append(ScheduleItem(ast, base, tuple(builder.inputs)))


class _KernelBuilder:
  """Builds one kernel tree for `output`, inlining what the fusion rules allow."""
  def __init__(self, scheduler: _Scheduler, output: LazyBuffer):
    self.scheduler, self.output = scheduler, output
    self.inputs: list[LazyBuffer] = []
    self.fused_reduce: LazyBuffer | None = None
    # the reduce this kernel may compute per row before running over the row again (see row_reduce_of)
    self.row_reduce: LazyBuffer | None = None
    self.built: dict[tuple[LazyBuffer, ShapeTracker | None], KernelNode] = {}

  def kernel(self) -> KernelNode:
    out = self.output
    if isinstance(out.op, ReduceOps):
      self.fused_reduce = out
      body = self.reduce_node(out)
    elif out.op is LoadOps.CONTIGUOUS:
      body = self.build(out.srcs[0], None)
    elif out.op is LoadOps.CONST:
      body = KernelNode(BufferOps.CONST, (), (out.arg, ShapeTracker.from_shape(out.shape)), out.dtype)
    elif out.op is LoadOps.GATHER:
      body = self.gather_node(out)
    else:
      self.row_reduce = self.scheduler.row_reduce_of(out)
      body = KernelNode(out.op, tuple(self.build(s, None) for s in out.srcs), out.arg, out.dtype)
    out_shape = out.shape
    if self.fused_reduce is not None and self.fused_reduce is not out and self.fused_reduce is not self.row_reduce:
      # the consumer of a fused reduce runs in the reduce's output space
      out_shape = self.fused_reduce.shape
      body = _reshape_outside_reduce(body, out_shape, {})
    return KernelNode(BufferOps.STORE, (body,), (0, ShapeTracker.from_shape(out_shape)), out.dtype)

  def pack_strided_loads(self, ast: KernelNode) -> KernelNode:
    """The kernel with every operand that _lane_to_pack picks read from its panels instead (see the
    module docstring), its lane axes split into (panels, P), and its inputs renumbered."""
    reduce = next(n for n in ast.walk() if isinstance(n.op, ReduceOps))
    axes, full = reduce.arg
    loads = [n for n in ast.walk() if n.op is BufferOps.LOAD]
    lanes = {n: lane for n in reduce.walk() if n.op is BufferOps.LOAD
             if (lane := _lane_to_pack(n, axes, full, panel_width(n.dtype), ast, loads)) is not None}
    if not lanes: return ast
    splits = {lane: panel_width(n.dtype) for n, lane in lanes.items()}
    old_inputs, self.inputs = self.inputs, []
    packed = {n: _split_axis(lane, splits) for n, lane in lanes.items()}
    return self.split_lanes(ast, splits, tuple(_split_axis(a, splits) for a in axes), packed, old_inputs, {})

  def split_lanes(self, node: KernelNode, splits: dict[int, int], reduce_axes: tuple[int, ...],
                  packed: dict[KernelNode, int], old_inputs: list[LazyBuffer], done: dict[KernelNode, KernelNode]) -> KernelNode:
    """`node` rebuilt over the shape with the axes in `splits` split (the reduce's axes are then
    `reduce_axes`); the loads in `packed` (with their split lane axis) read panels. `done` holds the
    nodes already rebuilt (a subtree read twice is rebuilt once). A method, not a closure: a recursive
    closure is a reference cycle that would keep this kernel's output alive (through self) until the
    garbage collector runs, so the memory pool could not reuse it."""
    if node not in done: done[node] = self._split_lanes(node, splits, reduce_axes, packed, old_inputs, done)
    return done[node]

  def _split_lanes(self, node: KernelNode, splits: dict[int, int], reduce_axes: tuple[int, ...],
                   packed: dict[KernelNode, int], old_inputs: list[LazyBuffer], done: dict[KernelNode, KernelNode]) -> KernelNode:
    if node.op in (BufferOps.LOAD, BufferOps.CONST):
      st = node.arg[1].reshape(_split_shape(node.arg[1].shape, splits))
      if node.op is BufferOps.CONST: return KernelNode(node.op, (), (node.arg[0], st), node.dtype)
      base = old_inputs[node.arg[0] - 1]
      return self.load_panels(base, st, packed[node], reduce_axes) if node in packed else self.load(base, st)
    srcs = tuple(self.split_lanes(s, splits, reduce_axes, packed, old_inputs, done) for s in node.srcs)
    if isinstance(node.op, ReduceOps):
      return KernelNode(node.op, srcs, (reduce_axes, _split_shape(node.arg[1], splits)), node.dtype)
    if node.op is BufferOps.STORE:
      return KernelNode(node.op, srcs, (node.arg[0], node.arg[1].reshape(_split_shape(node.arg[1].shape, splits))), node.dtype)
    return KernelNode(node.op, srcs, node.arg, node.dtype)

  def load_panels(self, base: LazyBuffer, st: ShapeTracker, lane: int, reduce_axes: tuple[int, ...]) -> KernelNode:
    """A LOAD of `base`'s panels for a kernel that reads base through `st`, whose lane axis is split
    into (panels, P) at (lane, lane+1): the panels are base's elements in the order (other kept axes,
    panel, reduce axes, P), so one tile row (P lanes) at consecutive reduce steps is one stream."""
    shape, strides = st.shape, st.views[0].strides
    # the broadcast axes (stride 0) are not materialized: the panels hold each element once
    kept = st.shrink(tuple((0, 1) if stride == 0 else (0, s) for s, stride in zip(shape, strides)))
    outer = [a for a in range(len(shape)) if a not in reduce_axes and a not in (lane, lane + 1)]
    order = tuple(outer + [lane] + list(reduce_axes) + [lane + 1])
    key = (base, kept)
    if key not in self.scheduler.packed:
      self.scheduler.packed[key] = LazyBuffer(base.device, kept, base.dtype, base=base).permute(order).contiguous()
    # base itself (reshaped) when it already holds its elements in panel order: then nothing is copied
    panels = self.scheduler.packed[key]
    return self.load(panels.base, ShapeTracker.from_shape(panels.shape).permute(inverse_permutation(order)).expand(shape))

  def gather_node(self, out: LazyBuffer) -> KernelNode:
    """The GATHER leaf of `out`'s kernel: the index read over out's shape (broadcast along the row),
    and the table's row 0 as a view over out's shape, with the step from one row to the next."""
    table, indices = out.srcs
    row_axes = len(table.shape) - 1
    index = self.build(indices.reshape(indices.shape + (1,) * row_axes).expand(out.shape), None)
    view = table.st.views[0]
    row0 = table.st.shrink(((0, 1),) + tuple((0, s) for s in table.shape[1:]))
    row0 = row0.reshape((1,) * len(indices.shape) + table.shape[1:]).expand(out.shape)
    self.scheduler.realize(table.base)
    if table.base not in self.inputs: self.inputs.append(table.base)
    arg = (self.inputs.index(table.base) + 1, row0, view.strides[0], table.shape[0])
    return KernelNode(BufferOps.GATHER, (index,), arg, out.dtype)

  def reduce_node(self, base: LazyBuffer) -> KernelNode:
    src = self.build(base.srcs[0], None)
    return KernelNode(base.op, (src,), (base.arg, base.srcs[0].shape), base.dtype)

  def load(self, base: LazyBuffer, st: ShapeTracker) -> KernelNode:
    self.scheduler.realize(base)
    if base not in self.inputs: self.inputs.append(base)
    return KernelNode(BufferOps.LOAD, (), (self.inputs.index(base) + 1, st), base.dtype)

  def force_load(self, base: LazyBuffer, st: ShapeTracker) -> KernelNode:
    self.scheduler.forced.add(base)
    return self.load(base, st)

  def build(self, lb: LazyBuffer, outer: ShapeTracker | None) -> KernelNode:
    """The node that reads `lb` at the kernel's index; `outer` maps kernel indices into lb's shape."""
    # a base read several times in one kernel is built once (a chain of reuses would otherwise
    # rebuild its subtree exponentially often)
    key = (lb, outer)
    if key not in self.built: self.built[key] = self._build(lb, outer)
    return self.built[key]

  def _build(self, lb: LazyBuffer, outer: ShapeTracker | None) -> KernelNode:
    st = lb.st if outer is None else lb.st + outer
    base = lb.base
    if base.realized is None and base.op is LoadOps.CONST:
      return KernelNode(BufferOps.CONST, (), (base.arg, st), base.dtype)
    if self.scheduler.must_realize(base): return self.load(base, st)
    if isinstance(base.op, ReduceOps):
      if self.fused_reduce is None and (_plain(st, base) or (base is self.row_reduce and self._row_view(st, base))):
        self.fused_reduce = base
        return self.reduce_node(base)
      return self.force_load(base, st)
    # padding reads zeros, which the inlined op may not map to zero; an expanding read (a matmul
    # operand) would recompute the op once per reuse: both read a realized buffer instead. Except
    # the per-row value that leads to this kernel's row reduce (softmax's 1/sum): it is computed
    # once per row, in registers
    if (st.has_mask or prod(st.shape) > base.size) and not self._row_value(st, base): return self.force_load(base, st)
    srcs = tuple(self.build(s, st) for s in base.srcs)
    if base.op is LoadOps.CONTIGUOUS: return srcs[0]
    return KernelNode(base.op, srcs, base.arg, base.dtype)

  def _row_value(self, st: ShapeTracker, base: LazyBuffer) -> bool:
    """`base` is a per-row value on the way to this kernel's row reduce, read once per row element."""
    return self.fused_reduce is None and self._row_view(st, base) and self.scheduler.reaches(base, self.row_reduce)

  def _row_view(self, st: ShapeTracker, base: LazyBuffer) -> bool:
    """`st` reads base (shaped like the row reduce's output) once per element of this kernel's rows."""
    return self.row_reduce is not None and base.shape == self.row_reduce.shape and \
      st == ShapeTracker.from_shape(base.shape).expand(self.output.shape)


# a row reduce (see row_reduce_of) needs a row that stays in L1/L2 between its two passes, and
# enough rows for every thread
ROW_REDUCE_MAX_ELEMENTS = 8192
ROW_REDUCE_MIN_ROWS = 16


def _row_reduce_fits(reduce: LazyBuffer, shape: tuple[int, ...]) -> bool:
  full, axes = reduce.srcs[0].shape, tuple(sorted(reduce.arg))
  if full != shape or not axes or axes != tuple(range(len(full) - len(axes), len(full))): return False
  row = prod(full[a] for a in axes)
  return 1 < row <= ROW_REDUCE_MAX_ELEMENTS and prod(full) // row >= ROW_REDUCE_MIN_ROWS


def _plain(st: ShapeTracker, base: LazyBuffer) -> bool:
  """True when `st` reads all of base's buffer in order (a reshape at most)."""
  return st.contiguous and prod(st.shape) == base.size


def _lane_to_pack(load: KernelNode, reduce_axes: tuple[int, ...], full: tuple[int, ...], panel: int,
                  store: KernelNode, loads: list[KernelNode]) -> int | None:
  """The lane axis (a multiple of `panel` long) along which `load` should be packed into panels, or
  None. Packing needs one plain view that is reused (stride 0 along other output axes, for at least
  PACK_MIN_REUSE points, TRANSPOSED_PACK_MIN_REUSE for a transposed operand) and either
  steps far along a reduce axis while it runs along the lane axis (B in a matmul too big to stage in
  the kernel), or is transposed: it runs along a reduce axis and along no output axis (the weight of
  x @ weight.T, a Linear layer). A transposed operand would make the kernel take its SIMD lanes along
  the reduce, as dot products (10 loads per 16 multiply-adds, and a horizontal sum per output: 1024 x
  256 @ 256 x 1024 at 120 GFLOP/s on 2 threads); its panels put the lanes along the output axis the
  store writes in order, which gets the matmul's register tile (340 GFLOP/s, the pack included),
  provided the kernel's other loads allow lanes there too (codegen/opt.py's vector axis)."""
  st = load.arg[1]
  if len(st.views) != 1 or st.views[0].mask is not None: return None
  strides, itemsize = st.views[0].strides, load.dtype.itemsize
  reuse = prod(s for a, s in enumerate(full) if a not in reduce_axes and strides[a] == 0)
  if reuse < PACK_MIN_REUSE: return None
  lanes = [a for a, s in enumerate(full) if a not in reduce_axes and s % panel == 0]
  if any(strides[a] == 1 for a in range(len(full)) if a not in reduce_axes):
    if not any(abs(strides[a]) * itemsize >= PACK_MIN_STRIDE_BYTES for a in reduce_axes): return None
    if prod(full[a] for a in reduce_axes) * panel * itemsize <= STAGE_MAX_BYTES: return None   # staged in the kernel
    return next((a for a in lanes if strides[a] == 1), None)
  if reuse < TRANSPOSED_PACK_MIN_REUSE or not any(strides[a] == 1 for a in reduce_axes): return None
  def lanes_fit(a: int) -> bool:
    """The store writes consecutive elements along a, and every other load one or consecutive ones."""
    if store.arg[1].views[-1].strides[a] != 1: return False
    return all(len(n.arg[1].views) == 1 and n.arg[1].views[0].strides[a] in (0, 1) for n in loads if n is not load)
  return next((a for a in lanes if strides[a] != 0 and lanes_fit(a)), None)


def _split_axis(axis: int, splits: dict[int, int]) -> int:
  """Where `axis` lands once every axis in `splits` is split in two."""
  return axis + sum(1 for a in splits if a < axis)


def _split_shape(shape: tuple[int, ...], splits: dict[int, int]) -> tuple[int, ...]:
  """`shape` with each axis a in `splits` split into (shape[a] // P, P)."""
  out: list[int] = []
  for a, s in enumerate(shape): out += [s // splits[a], splits[a]] if a in splits else [s]
  return tuple(out)


def _reshape_outside_reduce(node: KernelNode, shape: tuple[int, ...], done: dict[KernelNode, KernelNode]) -> KernelNode:
  """`node`'s part after the reduce, over `shape`; `done` memoizes (a subtree read twice is rebuilt once)."""
  if isinstance(node.op, ReduceOps): return node
  if node not in done:
    if node.op in (BufferOps.LOAD, BufferOps.CONST):
      done[node] = KernelNode(node.op, (), (node.arg[0], node.arg[1].reshape(shape)), node.dtype)
    else:
      done[node] = KernelNode(node.op, tuple(_reshape_outside_reduce(s, shape, done) for s in node.srcs), node.arg, node.dtype)
  return done[node]


def create_schedule(outs: list[LazyBuffer]) -> list[ScheduleItem]:
  """The kernels that compute `outs`: the ones made for an earlier graph of the same shape
  (engine/schedule_cache.py), else made now and remembered."""
  key, nodes = graph_key(outs)
  items = remembered(key, nodes, _item_from_template)
  if items is None:
    scheduler = _Scheduler(outs)
    scheduler.schedule()
    items = scheduler.items
    remember(key, nodes, items)
  return items


def _item_from_template(ast: KernelNode, output: LazyBuffer, inputs: tuple[LazyBuffer, ...], info: tuple) -> ScheduleItem:
  item = ScheduleItem(ast, output, inputs)
  item._info = info
  return item


def realize(outs: list[LazyBuffer]) -> None:
  """Schedule and run: the one entry point Tensor.realize and LazyBuffer.realize use."""
  # a view of a computed buffer is never copied, so already-computed outputs leave nothing to do
  # (TinyJit realizes its inputs on every call)
  if all(out.base.realized is not None for out in outs): return
  items = create_schedule(outs)
  if getenv("GRAPH", 0):
    from tinychad.viz import save_graphs
    for path in save_graphs(outs, items): print(f"graph: {path}")
  if getenv("PORT", 0):
    from tinychad.export import write_port
    write_port(outs, items)
  run_schedule(items)


# set by TinyJit while it records: called with (item, buffers) for every kernel run, (None, [out, in]) for copies
capture = None


def run_schedule(items: list[ScheduleItem]) -> None:
  start = time.perf_counter()
  kernels, debug = 0, DEBUG()
  if len(items) > 1: _prepare(items)
  for item in items:
    out = item.output
    buf = Buffer(out.device, out.size, out.dtype).allocate()
    if item.ast.op is LoadOps.COPY:
      buf.copyin(item.inputs[0].realized.as_numpy())
      if capture is not None: capture(None, [buf, item.inputs[0].realized])
    elif item.is_kernel and out.size > 0:
      t0 = time.perf_counter()
      bufs = [buf] + [i.realized for i in item.inputs]
      Device[out.device].exec(item, bufs)
      if capture is not None: capture(item, bufs)
      elapsed = time.perf_counter() - t0
      kernels += 1
      _count(item, elapsed)
      if debug >= 2: print(f"  kernel {GlobalCounters.kernel_count:4d} {item.name:30s} {out.device:6s} {elapsed*1e6:9.1f} us")
    out.realized, out.srcs = buf, ()
  if debug >= 1 and items:
    elapsed = time.perf_counter() - start
    print(f"realize: {len(items)} items, {kernels} kernels, {elapsed*1e3:.2f} ms")


def _prepare(items: list[ScheduleItem]) -> None:
  """A device that can build kernels ahead (several compiler processes at once) gets its whole list first."""
  kernels_by_device: dict[str, list[ScheduleItem]] = {}
  for item in items:
    if item.is_kernel and item.output.size > 0: kernels_by_device.setdefault(item.output.device, []).append(item)
  for device, device_items in kernels_by_device.items():
    prepare = getattr(Device[device], "prepare", None) if len(device_items) > 1 else None
    if prepare is not None: prepare(device_items)


def _count(item: ScheduleItem, elapsed: float) -> None:
  _, _, op_count, points, moved = item.info
  GlobalCounters.kernel_count += 1
  GlobalCounters.global_ops += op_count * points
  GlobalCounters.global_mem += moved
  GlobalCounters.time_sum_s += elapsed
