"""The scheduler: a lazy graph becomes an ordered list of kernels.

in: the LazyBuffers to realize
out: ScheduleItems, dependencies first. Each is one kernel tree (loads with views -> ALU ops -> at most
     one reduce -> ALU ops -> store) plus the buffers it reads and writes.

Which bases get a kernel of their own (REALIZE_RULES; the first rule that holds decides; a base
computed already is read from its buffer):
  - output: a base to realize is stored;
  - const: a constant is no buffer: each kernel that reads it has it inline;
  - load_op: a load op (COPY, EMPTY, CONTIGUOUS, GATHER, SCATTER_ADD, ATTENTION) is its own kernel;
  - padded: a base read through a view that pads (a cat's piece) is loaded by that reader (see pads_or_expands
    below), so it is computed in a kernel of its own, and what it reads is decided knowing that;
  - read_once: a base read once (one edge of the graph) is inlined into its reader's kernel (how: the
    read rules below);
  - one_kernel: a base whose every read lands in one kernel (gelu's input, read by x * 0.5 and by erf) is
    computed there once, in registers (not through a reduce, nor a view that pads or expands);
  - cheap: an elementwise base that takes at most CHEAP_OPS ALU ops and no reduce to recompute (over
    inputs in memory) is recomputed by each reader: re-reading its inputs costs less than writing it
    to memory and reading it back (softmax's exp). What it reads from bases that are read elsewhere
    too is loaded unless those are cheap themselves: recomputed in several kernels, it leaves nothing
    to one kernel;
  - shared: any other base read more than once is its own kernel, so it is computed once.
The rules are evaluated once per base, before any kernel is built, in two loops over the graph in
topological order: sources first for what `cheap` counts (recompute_ops), then readers first for
`one_kernel`'s kernel (owner) and the rules. Every answer is then a lookup: an unrolled RNN thousands
of ops deep schedules without Python recursion.
How a kernel reads a base it reaches (_KernelBuilder._build), in order:
  - constant: a constant is a CONST leaf, its view composed with the reader's;
  - load: a base with a kernel of its own (the rules above, or forced by an earlier read) is a LOAD;
  - fused_reduce: the first reduce a kernel reads through a plain contiguous view is inlined, its
    consumer running in the reduce's output space; a kernel holds at most one reduce, any other is
    loaded (forced);
  - row_value: a per-row value on the way to the kernel's row reduce (softmax's 1/sum), read expanded
    over each row, is computed once per row, in registers;
  - pads_or_expands: a view that pads (padding reads zeros, which the op may not map to zero) or
    expands (a matmul operand would be recomputed for every reuse) loads the base (forced);
  - inline: anything else is inlined, its views composed with the reader's (no copy).
Subgraphs (LoadOps.SUBGRAPH, an LSTM's time steps) are built first (expand_subgraphs): each such node takes the op and
sources of the graph its builder records, so the rules and kernels see ordinary ops. A graph scheduled before never
gets here (schedule_cache.py), so the nodes of its subgraphs are recorded only once.
Composite ops (EXPANSIONS: erf) are one base to the rules, too many ops to recompute, and become their
primitive nodes when a kernel tree is built (_alu_node).
Row reduce (row_reduce_of): a reduce over the innermost axes (a row of at most ROW_REDUCE_MAX_ELEMENTS)
whose consumer reads it back expanded over the same rows (softmax's 1/sum, layernorm's variance) is
inlined into the consumer with the per-row ops between them; the kernel reduces a row, then loops over
the row again while it is in cache to compute and store it (codegen's "row pass"). Of several
candidates, the one the others feed (the variance, not the mean).
Depth (too_deep): a chain of inlined ops at most MAX_FUSED_DEPTH deep: a base deeper than that in its
kernel's tree is realized, so a loop of updates realized once at the end becomes several kernels.
Cats in place (cats_in_place): a cat (function.cat's sum of padded pieces) on a host device whose every piece gets
a kernel of its own here (the padded rule) and fills one contiguous, 64-byte aligned stretch of it whole (a cat
along the first axis that isn't 1 long) gets no kernel, whatever the rules said (it is decided "in_place", after
them: it takes every piece's decision): an EMPTY item allocates its buffer before its first piece,
and each piece's item writes a view of it (ScheduleItem.into; device.BufferView), so an LSTM's 65 steps' states are
written once, where they are read, instead of once per step, once per group and once in the whole. Not with NOOPT=1,
nor while export captures (schedule_cache.CatsInPlace).
Kernels are scheduled in the graph's order, sources first. After fusion, a kernel may run over a finer
shape (codegen/refine.py: a load that reads a reshape its layout can't express becomes one view, a
matmul's operand with merged heads included), and a reduce kernel may read some operands from
panels that a kernel of their own packs first (codegen/pack.py decides which and rewrites the kernel;
the scheduler makes the panel copies, one per operand and layout whatever the kernels reading it; off
with NOOPT=1).
"""
from __future__ import annotations
from dataclasses import dataclass, field
from typing import Callable
from tinychad.codegen.pack import Panels, pack_plan, split_lanes
from tinychad.codegen.refine import refine_kernel_shape
from tinychad.engine.erf import erf_node
from tinychad.device import DEVICE_MEMORY
from tinychad.engine.schedule_cache import CatsInPlace, GraphKey, Template, graph_key, lookup, remember
from tinychad.helpers import getenv, prod, toposort
from tinychad.lazy import LazyBuffer, broadcast_tracker
from tinychad.ops import BinaryOps, BufferOps, KernelNode, LoadOps, ReduceOps, UnaryOps, ALU_OPS, Op, rebuild, rewrite
from tinychad.view import ShapeTracker, strides_for_shape

# ALU ops an elementwise base may take to recompute and still be recomputed by each reader
CHEAP_OPS = 8
# ops one kernel may chain: a longer chain (a loop of elementwise updates, realized once at the end)
# is cut into kernels this deep. Building, lowering and rendering a kernel tree recurse along it,
# ~3 Python frames per op, which keeps a kernel well inside Python's default limit of 1000
MAX_FUSED_DEPTH = 128
# where a cat's piece may start in the cat's buffer to be written there in place: kernels vectorize their stores
# for a buffer aligned to this many bytes (a cat's own buffer is)
PIECE_ALIGN_BYTES = 64
# a row reduce (see row_reduce_of) needs a row that stays in L1/L2 between its two passes, and
# enough rows for every thread
ROW_REDUCE_MAX_ELEMENTS = 8192
ROW_REDUCE_MIN_ROWS = 16


# the kernel trees that compile: a STORE root, or a load op with a lowering of its own
_KERNEL_OPS = (BufferOps.STORE, LoadOps.SCATTER_ADD, LoadOps.ATTENTION)


@dataclass
class ScheduleItem:
  ast: KernelNode                  # STORE root for compute kernels; a LoadOps node for EMPTY / COPY
  output: LazyBuffer               # the base this item realizes
  inputs: tuple[LazyBuffer, ...]   # bases read, as LOAD buffer numbers 1..n
  # a cat's piece: (the cat, the element where the piece starts in it), whose buffer the output is a view of
  into: tuple[LazyBuffer, int] | None = None
  # (name, iteration space, ops per point, points, bytes read and written): looked up on first use, then
  # read per run
  _info: tuple[str, tuple[int, ...], int, int, int] | None = field(default=None, init=False, repr=False, compare=False)

  @property
  def is_kernel(self) -> bool: return self.ast.op in _KERNEL_OPS

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
  elif ast.op is LoadOps.ATTENTION:
    a = ast.arg
    rows = a.batch * (a.kv_heads * a.source if a.mode == "dkv" else a.heads * a.length)
    lanes = a.length if a.mode == "dkv" else a.source
    # the multiply-adds of each (row, lane) pair: two dot products in the forward pass, four for dkv
    ops = {"forward": 2 * (a.dim + a.vdim), "dq": 2 * (2 * a.dim + a.vdim), "dmask": 2 * (a.dim + a.vdim),
           "dkv": 4 * (a.dim + a.vdim) * (a.heads // a.kv_heads)}[a.mode]
    info = (f"attention_{a.mode}_{rows}_{lanes}_{a.dim}_{a.vdim}", (rows, lanes), ops)
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


# The fusion rules (see the module docstring): each predicate a function of (scheduler, base) that reads
# only answers filled in before it is asked: recompute_ops (sources first) and the base's owner (worked
# out from its readers' answers, readers first).
def _output(s: _Scheduler, base: LazyBuffer) -> bool: return base in s.targets
def _const(s: _Scheduler, base: LazyBuffer) -> bool: return base.op is LoadOps.CONST
def _load_op(s: _Scheduler, base: LazyBuffer) -> bool: return isinstance(base.op, LoadOps)
def _padded(s: _Scheduler, base: LazyBuffer) -> bool: return any(st.has_mask for _, st in s.readers.get(base, ()))
def _read_once(s: _Scheduler, base: LazyBuffer) -> bool: return s.uses.get(base, 0) <= 1
def _one_kernel(s: _Scheduler, base: LazyBuffer) -> bool: return s.owner[base] is not None
def _cheap(s: _Scheduler, base: LazyBuffer) -> bool: return s.recompute_ops[base] <= CHEAP_OPS
def _shared(s: _Scheduler, base: LazyBuffer) -> bool: return True


# (name, predicate, whether the base gets a kernel of its own), in order: the first rule that holds decides
REALIZE_RULES: tuple[tuple[str, Callable[[_Scheduler, LazyBuffer], bool], bool], ...] = (
  ("output", _output, True),
  ("const", _const, False),
  ("load_op", _load_op, True),
  ("padded", _padded, True),
  ("read_once", _read_once, False),
  ("one_kernel", _one_kernel, False),
  ("cheap", _cheap, False),
  ("shared", _shared, True),
)
TOO_MANY_OPS = CHEAP_OPS + 1   # where recompute_ops stops counting; a reduce or a load op is too many


def _sources_to_compute(base: LazyBuffer) -> list[LazyBuffer]:
  return [b for src in base.srcs if (b := src.base).realized is None]


def expand_subgraphs(outs: list[LazyBuffer]) -> list[LazyBuffer]:
  """Every base to compute under `outs`, sources before the bases that read them, with each SUBGRAPH base made the
  graph its builder records (LazyBuffer.subgraph): the base takes the op, argument and sources of the built graph's
  output, so what reads the node reads that graph (a copy of it where the output is a view or a constant). A built
  graph may hold SUBGRAPH nodes of its own: they are built next."""
  while True:
    order = toposort([o.base for o in outs if o.base.realized is None], _sources_to_compute)
    pending = [base for base in order if base.op is LoadOps.SUBGRAPH]
    if not pending: return order
    for base in pending:
      build, params = base.arg
      out = build(base.srcs, *params)
      if out.shape != base.shape or out.dtype != base.dtype:
        raise RuntimeError(f"{build.__name__} built {out.shape} {out.dtype.name} for a node of {base.shape} {base.dtype.name}")
      # a view that reads its whole base in order (a reshape there and back) is that base
      if out._base is not None and out.st == out._base.st: out = out._base
      if out._base is None and out.realized is None and out.op is not LoadOps.CONST: base.op, base.arg, base.srcs = out.op, out.arg, out.srcs
      else: base.op, base.arg, base.srcs = LoadOps.CONTIGUOUS, None, (out,)


class _Scheduler:
  def __init__(self, outs: list[LazyBuffer]):
    self.targets = {o.base for o in outs}
    self.items: list[ScheduleItem] = []
    self.scheduled: set[LazyBuffer] = set()
    self.forced: set[LazyBuffer] = set()     # bases a kernel loads although the rules inline them
    self.inlined: set[LazyBuffer] = set()    # bases some kernel built so far computes inline
    self.forced_late = False                 # a base was forced after a kernel had inlined it
    self.packed: dict[tuple[LazyBuffer, tuple], LazyBuffer] = {}   # (operand, its panels' _layout) -> its panels
    # every base to compute, sources before the bases that read them (subgraphs built)
    self.order = expand_subgraphs(outs)
    self.uses: dict[LazyBuffer, int] = {}    # how many graph edges read each base
    self.readers: dict[LazyBuffer, list[tuple[LazyBuffer, ShapeTracker]]] = {}   # base -> (reader, view)
    self.has_reduce = False    # any reduce left to compute (else there is no row reduce to look for)
    for base in self.order:
      if isinstance(base.op, ReduceOps): self.has_reduce = True
      for src in base.srcs:
        self.uses[src.base] = self.uses.get(src.base, 0) + 1
        self.readers.setdefault(src.base, []).append((base, src.st))
    self.recompute_ops: dict[LazyBuffer, int] = {}
    self.owner: dict[LazyBuffer, LazyBuffer | None] = {}
    self.realizes: dict[LazyBuffer, bool] = {}
    self.decided_by: dict[LazyBuffer, str] = {}   # the rule that decided, by name
    # only a base read more than once asks one_kernel and cheap: where there is none (a tree of ops, as
    # most eager ops make) neither pass's answers are needed
    shared = any(self.uses.get(base, 0) > 1 for base in self.order)
    if shared:
      for base in self.order: self.recompute_ops[base] = self._recompute_ops(base)
    for base in reversed(self.order):
      if shared: self.owner[base] = self._owner(base)
      self.decided_by[base], self.realizes[base] = self._decide(base)
    # piece -> (cat, element offset) of the cats written in place (see cats_in_place)
    self.into: dict[LazyBuffer, tuple[LazyBuffer, int]] = \
      self.cats_in_place() if CatsInPlace.allowed and not getenv("NOOPT", 0) else {}

  def cats_in_place(self) -> dict[LazyBuffer, tuple[LazyBuffer, int]]:
    """{piece: (cat, element offset)} for each cat whose pieces' kernels write straight into its buffer: a cat
    (function.cat's sum of padded pieces) on a host device whose every piece is a base with a kernel of its own in
    this schedule (the padded rule gives it one), filling one contiguous stretch of the cat in order, starting
    PIECE_ALIGN_BYTES-aligned, and a piece of no other cat. Such a cat gets no kernel: its buffer is allocated
    before its first piece runs, and its readers load it, as they would a cat with a kernel of its own, instead of
    one masked load per piece where the rules inlined it (an LSTM's gate gradients, read by three matmuls). Sources
    first, so a cat of cats (function.cat's groups) nests."""
    into: dict[LazyBuffer, tuple[LazyBuffer, int]] = {}
    for cat in self.order:
      if cat.op not in (BinaryOps.ADD, BinaryOps.OR) or cat.device in DEVICE_MEMORY: continue
      pieces = self._pieces(cat)
      if pieces is None or any(piece in into for piece, _ in pieces): continue
      for piece, start in pieces: into[piece] = (cat, start)
      self.decided_by[cat], self.realizes[cat] = "in_place", True
    return into

  def _pieces(self, cat: LazyBuffer) -> list[tuple[LazyBuffer, int]] | None:
    """(piece, element offset) of a cat whose pieces can be written in place (see cats_in_place), else None."""
    pieces, stack = [], [cat]
    while stack:
      node = stack.pop()
      for src in node.srcs:
        base = src.base
        # the sum's own partial sums, which only the cat's kernel would compute
        partial_sum = base.op is cat.op and base.realized is None and self.uses[base] == 1 and not self.realizes[base]
        if src is base and partial_sum:
          stack.append(base)
          continue
        stretch = _stretch(src.st, cat.shape)
        if stretch is None or stretch[1] != base.size or base.realized is not None or base in self.targets: return None
        if not self.realizes[base] or base.op is LoadOps.CONST: return None
        pieces.append((base, stretch[0]))
    pieces.sort(key=lambda piece: piece[1])
    end = 0
    for piece, start in pieces:
      if start != end or start * cat.dtype.itemsize % PIECE_ALIGN_BYTES: return None
      end += piece.size
    if end != cat.size or len({piece for piece, _ in pieces}) != len(pieces): return None
    return pieces

  def _decide(self, base: LazyBuffer) -> tuple[str, bool]:
    """(name, gets a kernel of its own) of the first rule in REALIZE_RULES that holds for `base`."""
    for name, holds, realize in REALIZE_RULES:
      if holds(self, base): break   # the last rule always holds
    return name, realize

  def _recompute_ops(self, base: LazyBuffer) -> int:
    """ALU ops a kernel inlines to recompute `base`, counting at most to TOO_MANY_OPS (a reduce, a
    load op or a composite op's dozens is too many)."""
    if isinstance(base.op, (ReduceOps, LoadOps)) or base.op in EXPANSIONS: return TOO_MANY_OPS
    ops = 1
    for src in base.srcs:
      child = src.base
      if self._loaded_when_recomputing(child): continue
      if isinstance(child.op, ReduceOps) and not _plain(src.st, child): continue   # it will be loaded
      if src.st.has_mask or src.size > child.size: continue   # build() force-loads it (layernorm's mean)
      ops += self.recompute_ops[child]
    return min(ops, TOO_MANY_OPS)

  def _loaded_when_recomputing(self, child: LazyBuffer) -> bool:
    """A kernel that recomputes a reader of `child` loads it (or has it inline, a constant): the rules
    without one_kernel, since what a base recomputed by each reader reads lands in several kernels."""
    return child.realized is not None or child in self.targets or isinstance(child.op, LoadOps) or \
      (self.uses[child] > 1 and self.recompute_ops[child] > CHEAP_OPS)

  def _owner(self, base: LazyBuffer) -> LazyBuffer | None:
    """The output of the one kernel every read of elementwise `base` is inlined into, or None when
    its reads land in several kernels (or in a reduce, or through a view that forces a load)."""
    owner: LazyBuffer | None = None
    for reader, st in self.readers.get(base, ()):
      if isinstance(reader.op, ReduceOps) or isinstance(base.op, ReduceOps): return None
      if st.has_mask or prod(st.shape) > base.size: return None
      here = reader if self.realizes[reader] else self.owner[reader]
      if here is None or (owner is not None and here is not owner): return None
      owner = here
    return owner

  def must_realize(self, base: LazyBuffer) -> bool:
    """Whether a kernel reads `base` from memory: computed already, given a kernel by the rules, or
    forced by a kernel built before (a read that pads or expands it, a second reduce)."""
    return base.realized is not None or base in self.forced or self.realizes[base]

  def _inlined_reduces(self, base: LazyBuffer, through_reduces: bool) -> set[LazyBuffer]:
    """The reduces a kernel computing `base` could inline: reached through bases that aren't realized,
    past other reduces' inputs only when `through_reduces`."""
    def inlined(node: LazyBuffer) -> bool:
      return node.realized is None and node.op is not LoadOps.CONST and not self.must_realize(node)
    def sources(node: LazyBuffer) -> list[LazyBuffer]:
      if isinstance(node.op, ReduceOps) and not through_reduces: return []
      return [src.base for src in node.srcs if inlined(src.base)]
    reached = toposort([src.base for src in base.srcs if inlined(src.base)], sources)
    return {node for node in reached if isinstance(node.op, ReduceOps)}

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
    the next (only into a base a build decides to load, which has nothing left to wait for).
    A base one kernel inlines may be forced into memory by a kernel built after it (read through an
    expanding view): it would then be computed twice, and which kernel comes first depends on the
    order the outputs were asked in. So the kernels are built again, loading every forced base, until
    no base is forced late (the forced set only grows, so this ends; most graphs need one pass)."""
    self._schedule_pass()
    while self.forced_late:
      self.items, self.scheduled, self.packed, self.inlined, self.forced_late = [], set(), {}, set(), False
      self._schedule_pass()

  def _schedule_pass(self) -> None:
    # too_deep: how many ops deep each base's inlined tree would be: past MAX_FUSED_DEPTH the base gets
    # a kernel of its own, so no kernel tree is deep enough to recurse past Python's limit
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
    into = self.into.get(base)
    if base.op is LoadOps.EMPTY:
      ast, inputs = KernelNode(LoadOps.EMPTY), ()
    elif base.op is LoadOps.COPY:
      src = base.srcs[0].base
      self.realize(src)
      ast, inputs = KernelNode(LoadOps.COPY), (src,)
    elif base.op is LoadOps.SCATTER_ADD:
      # both sources are contiguous (LazyBuffer.scatter_add made them so): the kernel reads their buffers
      rows, indices = (src.base for src in base.srcs)
      for src in (rows, indices): self.realize(src)
      arg = (base.arg, indices.size, base.size // max(base.arg, 1), indices.dtype)
      ast, inputs = KernelNode(LoadOps.SCATTER_ADD, (), arg, base.dtype), (rows, indices)
    elif base.op is LoadOps.ATTENTION:
      # every source is contiguous (LazyBuffer.attention made them so): the kernel reads their buffers
      inputs = tuple(src.base for src in base.srcs)
      for src in inputs: self.realize(src)
      ast = KernelNode(LoadOps.ATTENTION, (), base.arg, base.dtype)
    else:
      builder = _KernelBuilder(self, base)
      ast = refine_kernel_shape(builder.kernel())
      if builder.fused_reduce is not None and not getenv("NOOPT", 0): ast = builder.pack_strided_loads(ast)
      inputs = tuple(builder.inputs)
    if into is not None: self.allocate(into[0])
    self.items.append(ScheduleItem(ast, base, inputs, into))

  def allocate(self, cat: LazyBuffer) -> None:
    """The buffer of a cat written in place, as an item of its own (nothing to compute), before its first piece's
    kernel; a view of its own cat's buffer where it is a piece of one."""
    if cat in self.scheduled: return
    self.scheduled.add(cat)
    into = self.into.get(cat)
    if into is not None: self.allocate(into[0])
    self.items.append(ScheduleItem(KernelNode(LoadOps.EMPTY), cat, (), into))


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
      body = _alu_node(out, tuple(self.build(s, None) for s in out.srcs), None)
    out_shape = out.shape
    if self.fused_reduce is not None and self.fused_reduce is not out and self.fused_reduce is not self.row_reduce:
      # the consumer of a fused reduce runs in the reduce's output space
      out_shape = self.fused_reduce.shape
      body = _reshape_outside_reduce(body, out_shape)
    return KernelNode(BufferOps.STORE, (body,), (0, ShapeTracker.from_shape(out_shape)), out.dtype)

  def pack_strided_loads(self, ast: KernelNode) -> KernelNode:
    """The kernel with the operands codegen/pack.py picks read from their panels (a kernel each,
    scheduled first), its lane axes split into (panels, P), and its inputs renumbered."""
    plan = pack_plan(ast)
    if not plan: return ast
    old_inputs, self.inputs = self.inputs, []
    packed = self.scheduler.packed
    def relink(load: KernelNode, st: ShapeTracker, panels: Panels | None) -> KernelNode:
      base = old_inputs[load.arg[0] - 1]
      if panels is None: return self.load(base, st)
      key = (base, _layout(panels.kept.permute(panels.order)))
      if key not in packed:
        packed[key] = LazyBuffer(base.device, panels.kept, base.dtype, base=base).permute(panels.order).contiguous()
      # base itself (reshaped) when it already holds its elements in panel order: then nothing is copied
      return self.load(packed[key].base, panels.view)
    return split_lanes(ast, plan, relink)

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
    if base in self.scheduler.inlined: self.scheduler.forced_late = True
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
    """The read rules of the module docstring, in order."""
    st = lb.st if outer is None else lb.st + outer
    base = lb.base
    if base.realized is None and base.op is LoadOps.CONST:   # constant
      return KernelNode(BufferOps.CONST, (), (base.arg, st), base.dtype)
    if self.scheduler.must_realize(base): return self.load(base, st)   # load
    if isinstance(base.op, ReduceOps):   # fused_reduce
      if self.fused_reduce is None and (_plain(st, base) or (base is self.row_reduce and self._row_view(st, base))):
        self.fused_reduce = base
        return self.reduce_node(base)
      return self.force_load(base, st)
    # pads_or_expands, except a row_value
    if (st.has_mask or prod(st.shape) > base.size) and not self._row_value(st, base): return self.force_load(base, st)
    self.scheduler.inlined.add(base)
    srcs = tuple(self.build(s, st) for s in base.srcs)   # inline
    if base.op is LoadOps.CONTIGUOUS: return srcs[0]
    return _alu_node(base, srcs, st)

  def _row_value(self, st: ShapeTracker, base: LazyBuffer) -> bool:
    """`base` is a per-row value on the way to this kernel's row reduce, read once per row element."""
    return self.fused_reduce is None and self._row_view(st, base) and self.scheduler.reaches(base, self.row_reduce)

  def _row_view(self, st: ShapeTracker, base: LazyBuffer) -> bool:
    """`st` reads base (shaped like the row reduce's output) once per element of this kernel's rows."""
    return self.row_reduce is not None and base.shape == self.row_reduce.shape and \
      st == ShapeTracker.from_shape(base.shape).expand(self.output.shape)


# composite ops: one node of the lazy graph (cheap to record and to key), expanded into primitive kernel nodes
# here, from (its sources' nodes, the view its constants are read through)
EXPANSIONS: dict[Op, Callable[[tuple[KernelNode, ...], ShapeTracker], KernelNode]] = {
  UnaryOps.ERF: lambda srcs, const_view: erf_node(srcs[0], const_view),
}


def _alu_node(base: LazyBuffer, srcs: tuple[KernelNode, ...], outer: ShapeTracker | None) -> KernelNode:
  """The node of elementwise `base` over its sources' nodes, read at the kernel's index through `outer`."""
  expand = EXPANSIONS.get(base.op)
  if expand is None: return KernelNode(base.op, srcs, base.arg, base.dtype)
  # constants read as one of base's own sources would be: a zero-stride view of base's shape, then outer
  const_view = broadcast_tracker(base.shape)
  return expand(srcs, const_view if outer is None else const_view + outer)


def _row_reduce_fits(reduce: LazyBuffer, shape: tuple[int, ...]) -> bool:
  full, axes = reduce.srcs[0].shape, tuple(sorted(reduce.arg))
  if full != shape or not axes or axes != tuple(range(len(full) - len(axes), len(full))): return False
  row = prod(full[a] for a in axes)
  return 1 < row <= ROW_REDUCE_MAX_ELEMENTS and prod(full) // row >= ROW_REDUCE_MIN_ROWS


def _layout(st: ShapeTracker) -> tuple:
  """Which elements a copy through `st` (one view, no mask) writes in which order: its offset and its axes longer
  than 1. Two kernels' panels of one operand alike in this are one buffer (an LSTM's gate gradients, transposed
  for the gradients of W_ih and of W_hh, whose kernels order their axes differently)."""
  view = st.views[0]
  return view.offset, tuple((size, stride) for size, stride in zip(view.shape, view.strides) if size != 1)


def _stretch(st: ShapeTracker, shape: tuple[int, ...]) -> tuple[int, int] | None:
  """(first element, elements) of the stretch of a cat of `shape` that a piece read through `st` fills: one view that
  pads the piece, read in order, along one axis with only size-1 axes before it; None for any other view."""
  if len(st.views) != 1 or st.views[0].mask is None: return None
  view = st.views[0]
  cut = [axis for axis, (lo, hi) in enumerate(view.mask) if (lo, hi) != (0, shape[axis])]
  if len(cut) != 1 or prod(shape[:cut[0]]) != 1: return None
  axis, (lo, hi) = cut[0], view.mask[cut[0]]
  # a piece one long along the cut axis has no stride there (a size-1 axis)
  contiguous = strides_for_shape(shape)
  if any(view.strides[a] != contiguous[a] for a in range(len(shape)) if a != axis or hi - lo > 1): return None
  inner = prod(shape[axis + 1:])
  return (lo * inner, (hi - lo) * inner) if view.offset == -lo * view.strides[axis] else None


def _plain(st: ShapeTracker, base: LazyBuffer) -> bool:
  """True when `st` reads all of base's buffer in order (a reshape at most)."""
  return st.contiguous and prod(st.shape) == base.size


def _reshape_outside_reduce(ast: KernelNode, shape: tuple[int, ...]) -> KernelNode:
  """`ast`'s part after the reduce, over `shape` (the reduce and what it reads stay as they are)."""
  def reshaped(node: KernelNode, srcs: tuple[KernelNode, ...]) -> KernelNode:
    if node.op in (BufferOps.LOAD, BufferOps.CONST): return rebuild(node, srcs, (node.arg[0], node.arg[1].reshape(shape)))
    return rebuild(node, srcs)
  return rewrite(ast, reshaped, keep=lambda node: isinstance(node.op, ReduceOps))


def create_schedule(outs: list[LazyBuffer]) -> list[ScheduleItem]:
  """The kernels that compute `outs`: the ones made for an earlier graph of the same shape
  (engine/schedule_cache.py), else made now and remembered."""
  key, nodes = graph_key(outs)
  return schedule_graph(outs, key, nodes, lookup(key))[0]


def schedule_graph(outs: list[LazyBuffer], key: GraphKey | tuple, nodes: list[LazyBuffer],
                   template: Template | None) -> tuple[list[ScheduleItem], Template]:
  """create_schedule for a graph whose key, nodes and template (None: not seen yet) are known: its
  items, and the template that remembers them."""
  if template is not None: return template.items(nodes, _item_from_template), template
  scheduler = _Scheduler(outs)
  scheduler.schedule()
  return scheduler.items, remember(key, nodes, scheduler.items)


def _item_from_template(ast: KernelNode, output: LazyBuffer, inputs: tuple[LazyBuffer, ...], info: tuple,
                        into: tuple[LazyBuffer, int] | None) -> ScheduleItem:
  item = ScheduleItem(ast, output, inputs, into)
  item._info = info
  return item
