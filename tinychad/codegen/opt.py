"""Choosing how a kernel's loops are shaped: which axis becomes SIMD lanes, which axes are unrolled
into a register tile, and in which order the outer loops run.

in: the kernel's simplified dims ((size, is_reduce) per axis), one LeafAccess per LOAD/CONST/STORE
    (its strides over the dims, or None when stacked views make them unknown), the kernel's dtypes
    and ops, and the host's SIMD width in bytes
out: an Opts: `upcast[d]` lanes per axis (the loop over d then steps by that many, the lanes are
     unrolled), `vector` = (axis, width) whose lanes are one SIMD value, and `order`, the order of
     the non-reduce loops (the first one is what threads split).
The heuristics, in order (every choice divides its axis, except a register tile's rows: see "tail"):
  - vector axis: an axis along which every load reads either one element (stride 0) or consecutive
    elements (stride 1) and, when it is not a reduce axis, the store writes consecutive elements;
    a non-reduce axis wins over a reduce axis (no horizontal sum at the end); the full SIMD width
    first, then half and a quarter of it;
  - transpose block (a large elementwise kernel without a vector axis whose load runs along another
    axis than its store): a cache line along the load's axis and a few elements along the store's
    are unrolled, the store's axis innermost. Where a SIMD width divides both axes (and the loads that
    don't run along the load's axis run along the store's, or stay put), the block is SIMD along the
    store's axis instead: each transposed load reads whole vectors along its own axis and swaps them
    into the store's in registers (`transposed`, codegen/values.py);
  - masked unroll (an elementwise kernel reading an input through a mask that changes along a short axis:
    a cat, a pad, an LSTM's gate slots): that axis is unrolled whole, so each copy's masks are constants;
  - register tile (kernels with a reduce): a non-reduce axis along which a load is reused (stride 0)
    is unrolled, so each loaded value feeds several accumulators: the matmul micro-kernel, found
    from strides alone, so convolutions and their gradients get it too; TILE_ROWS rows of
    TILE_ROW_VECTORS vectors (6x64 floats with AVX-512), 4 rows for a reduce of at most SHORT_REDUCE
    elements; where 4 vectors don't divide the vector axis, 5x5, 8x3 or 3x7 (ODD_ROW_TILES), else 8
    rows of NARROW_ROW_VECTORS;
    these sizes are the AVX-512 host's row of the tuning table (TUNING); an AVX2 host (half the vector
    registers) and an export for another machine pick their own row (host.target_tuning(): WebAssembly's,
    whose engine has fewer vector registers);
  - tail: a tile's rows need not divide their axis. The loop runs the whole tiles, then one tile of
    the leftover rows follows it (codegen/linearize.py). Only one axis, never the vector axis, and
    only inside another loop (`tails_are_valid`): the outermost loop is the one threads split;
  - more accumulators: a reduce with no register tile keeps several vector partial sums (latency);
  - the reduce loop's body is unrolled REDUCE_UNROLL times (same accumulators, fewer loop steps; the
    tuning table's `reduce_unroll`);
  - staging (`stage`): the one load a register tile shares (stride 0 along every tile axis: B in a
    matmul) is copied, for each pass of the loops it moves along, into a contiguous scratch panel
    (reduce index x the vector axis's tile lanes) that the tile then reads instead: one stream,
    every L1 set, instead of one row of B per page (codegen/staging.py). Only where the panel
    fits STAGE_MAX_BYTES and the tile sweeps it at least STAGE_MIN_REUSE times; a bigger one is
    packed ahead of the kernel (codegen/pack.py decides, the scheduler copies);
  - loop order: with a register tile and a non-reduce vector axis, the vector axis's loop goes
    outermost (after the batch axes of a batched matmul, along which every operand moves), then
    the other axes along which the tile's shared load (stride 0 along the tile:
    B in a matmul) moves, so the panel of B they select stays in cache while the tile axis sweeps
    A under it. This matters once the scheduler packed B into panels (engine/schedule.py): the
    vector axis is then split into (panel, lane) and the panel axis must stay outside the tile's.
    Axes B doesn't move along keep their natural order (a convolution's batch axis stays
    outermost: moving it inward would stride through the activations).
  - thread balance: the threads split the outermost loop that has more than one pass. Where its passes
    keep less than BALANCE_MIN_SHARE of them busy (192 columns are 3 panels of 64: 2 threads ran 2 and
    1, so the kernel took two panels' time for three panels' work) and the tile's shared operand fits
    BALANCE_MAX_BYTES, the axis with the most passes among those that share well and that B stays put
    along (the tile's rows, a batch) goes outermost instead: each tile of rows then reads all of B from
    L2, unstaged (a ViT's 1040 x 768 @ 768 x 192: ~150 -> ~200 GFLOP/s on 2 threads, bench/README.md).
    A tail can't be in that loop: the rows take a tile that divides them, unless only a much smaller one
    does (then the tail tile stays, unbalanced). Lowering for an export (one thread) never reorders.
  - row cache (`cache_rows`): a row reduce's second pass (engine/schedule.py) reads back the costly
    values its reduce loop computed (softmax's exp), from a scratch row, instead of computing them
    again (codegen/rowcache.py);
  - streaming stores (`stream`): a kernel whose output is bigger than the last-level cache writes its
    whole aligned SIMD vectors straight to memory (codegen/linearize.py, the renderers), instead of
    reading each cache line in first only to overwrite it and then evicting what the next kernel needs;
`NOOPT=1` returns plain loops (no lanes, natural order, no row cache, plain stores); the scheduler
then packs nothing either.
For the BEAM search (search.py), `candidate_opts` lists valid alternatives to the heuristic's choice
(the heuristic's first) and `order_variants` the other loop orders of one of them.
"""
from __future__ import annotations
import functools
from dataclasses import dataclass, field
from pathlib import Path
from tinychad.dtype import NATIVE_VECTOR_DTYPES, VECTOR_DTYPES, DType
from tinychad.helpers import getenv, prod
from tinychad.host import simd_bytes, target_threads, target_tuning
from tinychad.ops import OP_INFO, Op

# ops a SIMD kernel may not contain (the dtypes it may hold are dtype.VECTOR_DTYPES)
SCALAR_ONLY_OPS = {op for op, info in OP_INFO.items() if not info.simd}
MIN_VECTOR_WIDTH = 4          # narrower vectors aren't worth their shuffles
MIN_REDUCE_FOR_TILE = 16       # shorter reductions are not worth a register tile
TILE_AMOUNTS = (8, 7, 6, 5, 4, 3, 2) # register-tile unroll per reuse axis, the first that fits wins
# vector accumulators a tile may hold, unless it is TILE_ROWS x TILE_ROW_VECTORS: more rows of A, a
# power of two apart, share L1 sets (measurements: bench/README.md, "Tuning notes: codegen")
MAX_TILE_ACCUMULATORS = 16
TILE_ROW_VECTORS = 4           # SIMD vectors along a non-reduce vector axis in a register tile
TILE_ROWS = 6                  # its rows: 24 accumulators, the 4 row vectors and a broadcast fit 32 registers
# where 4 vectors don't divide the vector axis (784 floats = 49 vectors, 800 = 50): row vectors -> rows,
# the first count that divides it wins; each fills the registers as 6x4 does
ODD_ROW_TILES = {5: 5, 3: 8, 7: 3}
NARROW_ROW_VECTORS = 2         # the last resort: 8 rows of 2 vectors
# a short reduce (attention's q@k^T over 64, weights@v over 128) runs its tile for few steps: a
# shallower tile (4x64, as BEAM found) sweeps fewer rows of A per panel of B
SHORT_REDUCE = 128
REDUCE_ACCUMULATORS = 4        # vector partial sums of a reduce along the vector axis, without a tile
# copies of the reduce loop's body per iteration (a hint to the C compiler): the loop's counter and
# index arithmetic then cost a quarter as much per multiply-add; 2 and 8 measured slower than 4
REDUCE_UNROLL = 4
# a staged panel lives on the stack of the thread running the kernel: 8 MiB for the pool's workers
# (runtime/threads.py) and, with the default ulimit, the main thread. 512 KiB holds a 2048 x 64 float panel
STAGE_MAX_BYTES = 512 * 1024
TRANSPOSE_LINE_BYTES = 64      # a cache line: what one step of a transposing copy reads (_transpose_opts)
TRANSPOSE_MIN_POINTS = 1 << 18  # smaller transposing kernels keep plain loops (the compile costs more than it saves)
TRANSPOSE_SIMD_MIN_POINTS = 1 << 16  # the same for a SIMD block (_transposed_block), which compiles in half the time
TRANSPOSE_BLOCK = 16           # at most this many elements of a line along the load's axis
TRANSPOSE_STORE_LANES = 8      # elements along the store's axis per step: 16x8 compiles in half the time of
                               # 16x16 and runs about as fast
# a masked axis (a cat's, a pad's) this short is unrolled whole, within this many unrolled lanes (_unroll_masked):
# an LSTM's (16, 5, 256) gate-gradient kernel ran 2.7x faster unrolled, a cat of 9 tensors 1.5x (bench/README.md)
MASKED_UNROLL_MAX = 16
MASKED_UNROLL_LANES = 128
STAGE_MIN_REUSE = 4            # passes of the tile over a staged panel: fewer don't repay the copy
# thread balance: another axis goes outermost where the outermost loop keeps less than this share of the threads busy
BALANCE_MIN_SHARE = 0.9
# ... and the shared operand, which each tile of rows then reads whole, is at most this big (it stays in L2)
BALANCE_MAX_BYTES = 1 << 20
# the search may try more than the heuristic does: which tile wins depends on the machine and the shape
SEARCH_MAX_ACCUMULATORS = 32
SEARCH_ROW_VECTORS = (1, 2, 4)
SEARCH_REDUCE_ACCUMULATORS = (1, 2, 4, 8)


@dataclass(frozen=True)
class Tuning:
  """The register-tile sizes of one kind of machine (the module docstring's register tile)."""
  tile_rows: int                     # rows of a tile of `tile_row_vectors` vectors
  tile_row_vectors: int
  odd_row_tiles: dict[int, int]      # row vectors -> rows, where tile_row_vectors don't divide the axis
  narrow_row_vectors: int            # the last resort's row vectors, max_tile_accumulators // it rows
  max_tile_accumulators: int
  reduce_unroll: int                 # copies of the reduce loop's body


# A row per kind of machine the kernels are made for (host.target_tuning()). "wasm": WebAssembly's
# SIMD128 run by V8 on x86-64, which allocates 15 xmm registers (xmm15 is its scratch) to a function and
# spills the rest to the stack on every use; clang's wasm keeps a tile's row vectors, its broadcasts and
# one product live beside the accumulators, so 4 rows x 2 vectors (8 + 2 + 4 + 1 = 15) or 2 x 4 fit, and
# the host's 6 x 4 spilled its accumulators at every multiply-add. 4 x 2 ran ResNet-18 13% faster than
# 2 x 4 (the MNIST CNN the same). Unrolling the reduce loop let clang interleave the copies' loads ahead
# of their use, which spilled again even with 2 x 4 (measurements: bench/README.md, "Export").
# "avx2": a CPU with AVX2 but not AVX-512 (16 ymm registers): the host's 6 x 4 spilled its 24 accumulators at every
# multiply-add. 3 x 4 (12 accumulators; the compiler folds the row vectors' loads into the multiply-adds) ran the
# GPT's matmuls at 2x the speed of 6 x 4 and of 6 x 2, and keeps the packed panels' width (bench/README.md).
TUNING = {
  "host": Tuning(TILE_ROWS, TILE_ROW_VECTORS, ODD_ROW_TILES, NARROW_ROW_VECTORS, MAX_TILE_ACCUMULATORS, REDUCE_UNROLL),
  "avx2": Tuning(3, TILE_ROW_VECTORS, {5: 2, 3: 4, 7: 1}, NARROW_ROW_VECTORS, 8, REDUCE_UNROLL),
  "wasm": Tuning(4, 2, {5: 1, 3: 2}, 2, 8, 1),
}


Dims = list[tuple[int, bool]]          # (size, is_reduce) per axis
Vector = tuple[int, int] | None        # (axis, width) of the SIMD lanes, or none


@dataclass
class LeafAccess:
  strides: tuple[int | None, ...]    # element stride per dim; None where the index isn't affine in it
  is_load: bool                      # LOAD or GATHER (True), CONST or STORE (False)
  is_store: bool
  below_reduce: bool                 # read inside the reduce loop
  itemsize: int = 4                  # bytes per element
  is_gather: bool = False            # a GATHER: its rows move with an index the strides can't show
  masked: tuple[bool, ...] = ()      # per dim: whether the leaf's validity (a pad's or a cat's mask) changes along it


@dataclass
class Opts:
  upcast: dict[int, int] = field(default_factory=dict)
  vector: Vector = None
  order: list[int] = field(default_factory=list)
  unroll: int = 1                    # copies of the innermost reduce loop's body per iteration
  stage: int | None = None           # the leaf (index into the leaves) copied into a scratch panel
  cache_rows: bool = True            # a row pass reads the costly values its reduce computed (rowcache.py)
  stream: bool = True                # a big output is written with streaming stores (stream_min_bytes)
  transposed: int | None = None      # the axis along which the loads that don't run along the vector axis are
                                     # read as whole vectors, then transposed in registers (_transpose_opts)


# a kernel writes with streaming stores only an output at least this big (and at least the last-level
# cache): a smaller one may still be in cache when the next kernel reads it
STREAM_MIN_BYTES = 8 << 20
STREAM_DTYPES = NATIVE_VECTOR_DTYPES   # the renderers' streaming stores


@functools.lru_cache(maxsize=None)
def stream_min_bytes() -> int:
  """The smallest kernel output (in bytes) written with streaming stores on this host: the size of its
  last-level cache, at least STREAM_MIN_BYTES; none without AVX (the renderers' streaming stores are
  AVX instructions, and their whole-vector alignment is what SIMD lanes of that width give)."""
  if simd_bytes() < 32: return 1 << 62
  largest = 0
  for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
    try: size = (index / "size").read_text().strip()
    except OSError: continue
    unit = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
    largest = max(largest, int(size.rstrip("KM")) * unit)
  return max(largest, STREAM_MIN_BYTES)


def panel_width(dtype: DType) -> int:
  """Elements in one row of a register tile along a non-reduce vector axis (TILE_ROW_VECTORS SIMD
  vectors, see choose_opts): the width of the panels the scheduler packs a strided operand into."""
  return TILE_ROW_VECTORS * simd_bytes() // dtype.itemsize


def _contiguous_along(leaf: LeafAccess, d: int, reduce_dim: bool) -> str | None:
  """How leaf reads along dim d: "same", "next" (stride 1), or None (anything else)."""
  if reduce_dim and not leaf.below_reduce and not leaf.is_store: return "same"
  stride = leaf.strides[d]
  return "same" if stride == 0 else "next" if stride == 1 else None


def _vector_score(dims: Dims, leaves: list[LeafAccess], d: int, width: int) -> int | None:
  """How well dim d takes `width` SIMD lanes: None when width doesn't divide it or some access along
  it is neither one element nor consecutive ones, else higher for more consecutive accesses and for
  a non-reduce axis."""
  size, is_reduce = dims[d]
  if size % width != 0: return None
  touching = [leaf for leaf in leaves if leaf.is_load or (leaf.is_store and not is_reduce)]
  kinds = [_contiguous_along(leaf, d, is_reduce) for leaf in touching]
  if None in kinds or "next" not in kinds: return None
  return kinds.count("next") + (0 if is_reduce else len(leaves))


def _pick_vector(dims: Dims, leaves: list[LeafAccess], width: int) -> int | None:
  best, best_score = None, 0
  for d in range(len(dims)):
    score = _vector_score(dims, leaves, d, width)
    if score is not None and score > best_score: best, best_score = d, score
  return best


def _reuse_axes(dims: Dims, leaves: list[LeafAccess], skip: int | None) -> list[int]:
  """Non-reduce axes along which a load inside the reduce stays put: its lanes share that load."""
  loads = [leaf for leaf in leaves if leaf.is_load and leaf.below_reduce]
  axes = []
  for d, (size, is_reduce) in enumerate(dims):
    if is_reduce or d == skip: continue
    strides = [leaf.strides[d] for leaf in loads]
    if 0 in strides: axes.append(d)
  return axes


def _shared_loads(leaves: list[LeafAccess], tile: list[int]) -> list[int]:
  """The loads inside the reduce that stay put along every tile axis (B in a matmul), by leaf index."""
  return [i for i, leaf in enumerate(leaves) if leaf.is_load and leaf.below_reduce and all(leaf.strides[d] == 0 for d in tile)]


def _panel_axes(dims: Dims, leaves: list[LeafAccess], tile: list[int], vec: int) -> list[int]:
  """Non-reduce axes besides the vector axis along which a load shared by the tile (stride 0 along
  every tile axis: B in a matmul) moves: with the vector axis they pick the panel of B that the tile
  axes sweep over (a matmul whose B was packed has its vector axis split in two, and both go here)."""
  shared = [leaves[i] for i in _shared_loads(leaves, tile)]
  return [d for d, (_, r) in enumerate(dims) if not r and d != vec and d not in tile
          and any(leaf.strides[d] != 0 for leaf in shared)]


def _batch_axes(leaves: list[LeafAccess], panel: list[int]) -> list[int]:
  """The panel axes along which every load inside the reduce moves: the batch of a batched matmul
  (attention's batch x heads), whose items share nothing. They go outermost, so each thread keeps
  its own items' operands in its cache."""
  loads = [leaf for leaf in leaves if leaf.is_load and leaf.below_reduce]
  return [d for d in panel if all(leaf.strides[d] != 0 for leaf in loads)]


def _natural_order(dims: Dims) -> list[int]: return [d for d, (_, r) in enumerate(dims) if not r]


def _may_use_lanes(dtypes_used: set[DType], ops_used: set[Op]) -> bool:
  return dtypes_used <= VECTOR_DTYPES and not ops_used & SCALAR_ONLY_OPS


def _vector_widths(dtypes_used: set[DType]) -> list[int]:
  """The SIMD widths worth trying, widest first: a full register, half and a quarter of one."""
  full = simd_bytes() // max(dt.itemsize for dt in dtypes_used)
  return [w for w in (full, full // 2, full // 4) if w >= MIN_VECTOR_WIDTH]


def reduce_size(dims: Dims) -> int:
  """Elements each output point reduces over."""
  out = 1
  for size, r in dims:
    if r: out *= size
  return out


def _wants_tile(dims: Dims) -> bool:
  """The kernel reduces over enough elements for a register tile or extra accumulators to pay."""
  return any(r for _, r in dims) and reduce_size(dims) >= MIN_REDUCE_FOR_TILE


def _vector_fits(dims: Dims, vector: Vector, count: int) -> bool:
  """`count` SIMD vectors side by side divide the vector axis."""
  return vector is not None and dims[vector[0]][0] % (count * vector[1]) == 0


def _build_opts(dims: Dims, leaves: list[LeafAccess], vector: Vector,
               count: int = 1, tile: dict[int, int] | None = None, balance: bool = True) -> Opts:
  """The Opts for one set of choices: `vector` = (axis, width) or None, `count` SIMD vectors along the
  vector axis (a tile's row on a non-reduce axis, partial sums on a reduce axis) and `tile`, the
  unroll of each register-tile axis. The loop order follows the heuristic's rule (module docstring), thread
  balance included unless `balance` is False."""
  opts, tile = Opts(order=_natural_order(dims)), tile or {}
  if vector is not None:
    opts.vector, opts.upcast[vector[0]] = vector, count * vector[1]
  opts.upcast.update(tile)
  if tile and vector is not None and not dims[vector[0]][1]:
    vec = vector[0]
    panel = _panel_axes(dims, leaves, list(tile), vec)
    batch = _batch_axes(leaves, panel)
    opts.order = batch + [vec] + [d for d in panel if d not in batch] + [d for d in opts.order if d != vec and d not in panel]
    if balance: opts.order = _balanced_order(dims, leaves, opts, list(tile))
    opts.stage = _pick_stage(dims, leaves, opts, list(tile))
  return opts


def _busy_share(passes: int, threads: int) -> float:
  """The share of `threads` kept busy by a loop of `passes` equal passes split among them."""
  return passes / (-(-passes // threads) * threads)


def _balanced_order(dims: Dims, leaves: list[LeafAccess], opts: Opts, tile: list[int]) -> list[int]:
  """opts.order, or it with an axis the tile's shared operand stays put along moved outermost, where the threads would
  share the outermost loop badly (module docstring: thread balance)."""
  threads, order = target_threads(), opts.order
  outer = next((d for d in order if _loop_passes(dims, opts, d) > 1), None)
  if outer is None or _busy_share(_loop_passes(dims, opts, outer), threads) >= BALANCE_MIN_SHARE: return order
  shared = _shared_loads(leaves, tile)
  if len(shared) != 1: return order
  leaf = leaves[shared[0]]
  if prod(size for d, (size, _) in enumerate(dims) if leaf.strides[d]) * leaf.itemsize > BALANCE_MAX_BYTES: return order
  # the axes B stays put along (the tile's rows, a batch of images) may go outermost without B moving any more often
  still = [d for d in order if leaf.strides[d] == 0 and _busy_share(_loop_passes(dims, opts, d), threads) >= BALANCE_MIN_SHARE]
  if not still: return order
  rows = max(still, key=lambda d: _loop_passes(dims, opts, d))
  return [rows] + [d for d in order if d != rows]


def panel_strides(dims: Dims, lanes: int) -> dict[int, int]:
  """A staged panel's layout: per reduce dim, its element step (reduce index row-major, times the lanes)."""
  step, strides = lanes, {}
  for d in reversed(range(len(dims))):
    if dims[d][1]: strides[d], step = step, step * dims[d][0]
  return strides


def stage_depth(dims: Dims, leaf: LeafAccess, opts: Opts) -> int:
  """How many of the outer loops (opts.order, outermost first) pick the panel of `leaf` that is staged:
  the copy runs inside the last loop along which leaf moves, before the loops it stays put in."""
  moving = [i for i, d in enumerate(opts.order) if leaf.strides[d] != 0]
  return moving[-1] + 1 if moving else 0


def _loop_passes(dims: Dims, opts: Opts, d: int) -> int:
  """Iterations of d's loop, its tail tile counted as one more."""
  amount = opts.upcast.get(d, 1)
  return dims[d][0] // amount + (1 if dims[d][0] % amount else 0)


def staging_fits(dims: Dims, leaves: list[LeafAccess], opts: Opts, i: int) -> bool:
  """Leaf i can be staged under `opts`: a plain load inside the reduce, read in consecutive lanes
  along the (non-reduce) vector axis, whose panel (every reduce index x the vector axis's tile lanes)
  fits STAGE_MAX_BYTES, isn't laid out as one already, and is swept STAGE_MIN_REUSE times or more."""
  leaf = leaves[i]
  if not leaf.is_load or leaf.is_gather or not leaf.below_reduce or None in leaf.strides: return False
  if opts.vector is None or dims[opts.vector[0]][1]: return False
  vec = opts.vector[0]
  if leaf.strides[vec] != 1 or any(r and d in opts.upcast for d, (_, r) in enumerate(dims)): return False
  lanes = opts.upcast.get(vec, 1)
  if reduce_size(dims) * lanes * leaf.itemsize > STAGE_MAX_BYTES: return False
  if all(leaf.strides[d] == stride for d, stride in panel_strides(dims, lanes).items()): return False
  reuse = 1
  for d in opts.order[stage_depth(dims, leaf, opts):]: reuse *= _loop_passes(dims, opts, d)
  return reuse >= STAGE_MIN_REUSE


def _pick_stage(dims: Dims, leaves: list[LeafAccess], opts: Opts, tile: list[int]) -> int | None:
  """The load the register tile shares (stride 0 along every tile axis), if it alone is and fits."""
  shared = _shared_loads(leaves, tile)
  if len(shared) != 1 or not staging_fits(dims, leaves, opts, shared[0]): return None
  return shared[0]


def _heuristic_vector(dims: Dims, leaves: list[LeafAccess], dtypes_used: set[DType]) -> Vector:
  # the widest vector that some axis divides: a 24-wide convolution row still gets 8 lanes
  for width in _vector_widths(dtypes_used):
    vec = _pick_vector(dims, leaves, width)
    if vec is not None: return vec, width
  return None


def _tile_axes(dims: Dims, leaves: list[LeafAccess], vec: int | None, budget: int, tails: bool) -> list[int]:
  """The reuse axes a register tile goes along, in the order it tries them. Two or fewer: as they come. A
  convolution's output has three or more (batch, rows, columns, ...): the axis with the largest amount first and,
  among equals, the one whose input is nearest in memory (the columns, for a stride-1 conv: the tile's rows then
  read neighbouring floats, in the same cache lines, where rows along the batch read streams a whole image apart; a
  ResNet-18's 3x3 convs ran 20-30% faster on an AVX2 host, bench/README.md). Two axes aren't sorted so: by
  nearness, the projections of a ViT in a permuted layout ran slower."""
  axes = _reuse_axes(dims, leaves, vec)
  if len(axes) <= 2: return axes
  return sorted(axes, key=lambda d: (-(_tile_amount(dims[d][0], budget, tails) or 0), _input_step(leaves, d)))


def _heuristic_tile(dims: Dims, leaves: list[LeafAccess], vec: int | None, budget: int, tails: bool) -> dict[int, int]:
  """Up to two reuse axes (_tile_axes' order), each unrolled by the first TILE_AMOUNT that fits the accumulators
  left in the budget and divides it (or, with `tails`, is no longer than it: the rest is a tail tile)."""
  tile = {}
  for d in _tile_axes(dims, leaves, vec, budget, tails):
    amount = _tile_amount(dims[d][0], budget, tails)
    if amount is None: continue
    tile[d], budget = amount, budget // amount
    if len(tile) == 2: break
  return tile


def _tile_amount(size: int, budget: int, tails: bool) -> int | None:
  """The first TILE_AMOUNT within the budget and the axis that divides it (or, with `tails`, is no longer than it)."""
  return next((a for a in TILE_AMOUNTS if a <= min(budget, size) and (tails or size % a == 0)), None)


def _input_step(leaves: list[LeafAccess], d: int) -> int:
  """The smallest step along axis d of a load inside the reduce that moves along it."""
  moving = [leaf for leaf in leaves if leaf.is_load and leaf.below_reduce and leaf.strides[d]]
  return min((abs(leaf.strides[d]) for leaf in moving), default=0)


def tails_are_valid(dims: Dims, opts: Opts) -> bool:
  """At most one axis has a tail (an unroll that doesn't divide it), and it is a non-reduce axis
  without vector lanes whose loop runs inside another loop: the tail tile runs once per pass of the
  loops around it, and the outermost loop is the one threads split."""
  tails = [d for d, amount in opts.upcast.items() if dims[d][0] % amount]
  if not tails: return True
  if len(tails) > 1: return False
  d = tails[0]
  if dims[d][1] or (opts.vector is not None and opts.vector[0] == d) or d not in opts.order: return False
  before = opts.order[:opts.order.index(d)]
  return any(dims[a][0] // opts.upcast.get(a, 1) > 1 for a in before)


def _transpose_opts(dims: Dims, leaves: list[LeafAccess], dtypes_used: set[DType]) -> Opts | None:
  """An elementwise kernel that stores along one axis and loads along another (an NHWC -> NCHW copy,
  x.T.contiguous(), a momentum update reading a transposed gradient) has no SIMD axis, and its plain loop
  reads one element per cache line. Instead it moves a block at a time: a cache line of elements along the
  load's axis (unrolled), times TRANSPOSE_STORE_LANES along the store's axis (unrolled too when they divide
  it; its loop is the innermost either way). Each step reads whole lines and writes half lines that the next
  step completes, however far apart the rows are. Where a SIMD width divides both axes, the block is SIMD
  along the store's axis (_transposed_block)."""
  if any(r for _, r in dims) or any(None in leaf.strides for leaf in leaves): return None
  # the unrolled block is slow to compile: worth it only for a copy that takes a while
  points = prod(size for size, _ in dims)
  if points < TRANSPOSE_SIMD_MIN_POINTS: return None
  store = next(leaf for leaf in leaves if leaf.is_store)
  if 1 not in store.strides: return None
  inner = store.strides.index(1)
  for leaf in leaves:
    if not leaf.is_load or leaf.strides[inner] in (0, 1) or 1 not in leaf.strides: continue
    axis, per_line = leaf.strides.index(1), min(TRANSPOSE_BLOCK, TRANSPOSE_LINE_BYTES // leaf.itemsize)
    if dims[axis][0] % per_line or dims[inner][0] < per_line: continue
    order = [d for d in _natural_order(dims) if d != inner] + [inner]
    block = _transposed_block(dims, leaves, dtypes_used, inner, axis, per_line)
    if block is not None: return Opts(upcast=block, vector=(inner, block[inner]), order=order, transposed=axis)
    if points < TRANSPOSE_MIN_POINTS: return None
    upcast = {axis: per_line}
    if dims[inner][0] % TRANSPOSE_STORE_LANES == 0: upcast[inner] = TRANSPOSE_STORE_LANES
    return Opts(upcast=upcast, order=order)
  return None


def _transposed_block(dims: Dims, leaves: list[LeafAccess], dtypes_used: set[DType], inner: int, axis: int,
                      per_line: int) -> dict[int, int] | None:
  """The upcasts of a transpose block that is SIMD along the store's axis `inner`, `width` lanes wide: a line
  along the load's `axis` (whole vectors of it), one vector along `inner`. Each load either runs along
  `inner` or stays put there (a vector or one element per step), or runs along `axis` (read as `width`
  vectors along it, one per lane of the store's vector, and transposed in registers: values.py). None where
  the SIMD width doesn't divide both axes, or a load runs along neither."""
  widths = _vector_widths(dtypes_used)
  if not widths: return None
  width = widths[0]
  if per_line % width or dims[inner][0] % width: return None
  for leaf in leaves:
    if leaf.is_load and leaf.strides[inner] not in (0, 1) and leaf.strides[axis] != 1: return None
  return {axis: per_line, inner: width}


def _unroll_masked(dims: Dims, leaves: list[LeafAccess], opts: Opts) -> Opts:
  """`opts` with a short axis along which some input's mask changes (a cat's or a pad's) unrolled whole: each
  unrolled copy then knows which inputs are valid, so the masks fold away and the copies share what doesn't
  move along the axis. Without it every element computes and masks every input of a cat, and an LSTM's gate
  gradients (a (N, 5, H) kernel whose slots pick different formulas) compute all five formulas per element.
  The smallest such axis (not the vector axis, no reduce in the kernel) of at most MASKED_UNROLL_MAX, while the
  unrolled lanes stay within MASKED_UNROLL_LANES."""
  if any(r for _, r in dims): return opts
  vec = opts.vector[0] if opts.vector is not None else None
  lanes = prod(opts.upcast.values())
  masked = [d for d, (size, _) in enumerate(dims) if d != vec and d not in opts.upcast and 1 < size <= MASKED_UNROLL_MAX
            and size * lanes <= MASKED_UNROLL_LANES and any(leaf.masked and leaf.masked[d] for leaf in leaves)]
  if masked:
    d = min(masked, key=lambda a: dims[a][0])
    opts.upcast[d] = dims[d][0]
  return opts


def _complete(dims: Dims, leaves: list[LeafAccess], vector: Vector, dtypes_used: set[DType]) -> Opts:
  """The heuristic's choices around a given vector: row vectors, register tile, accumulators."""
  if not _wants_tile(dims):
    transposed = _transpose_opts(dims, leaves, dtypes_used) if vector is None else None
    return transposed or _unroll_masked(dims, leaves, _build_opts(dims, leaves, vector))
  # without a vector axis the tile is scalar accumulators, which still share every load they can
  vec_is_reduce = vector is not None and dims[vector[0]][1]
  tuning = TUNING[target_tuning()]
  row_counts = (tuning.tile_row_vectors, *tuning.odd_row_tiles, tuning.narrow_row_vectors)
  fitting = [c for c in row_counts if _vector_fits(dims, vector, c)]
  count = 1 if vec_is_reduce or not fitting else fitting[0]
  short = reduce_size(dims) <= SHORT_REDUCE
  if count == tuning.tile_row_vectors and not short: budget = tuning.tile_rows
  elif count in tuning.odd_row_tiles: budget = tuning.odd_row_tiles[count]
  else: budget = tuning.max_tile_accumulators // count
  vec = vector[0] if vector is not None else None
  tile = _heuristic_tile(dims, leaves, vec, budget, tails=True)
  opts = _build_opts(dims, leaves, vector, count, tile)
  if not tails_are_valid(dims, opts):
    # a tile without a tail, or (where thread balance moved the tail's axis outermost) the tail tile unbalanced, when
    # the tiles that divide the axis are much smaller (997 rows: none; 1042: 2 rows, against 6 and a tail of 4)
    exact = _heuristic_tile(dims, leaves, vec, budget, tails=False)
    unbalanced = _build_opts(dims, leaves, vector, count, tile, balance=False)
    if _tile_size(exact) * 3 < _tile_size(tile) * 2 and tails_are_valid(dims, unbalanced): opts = unbalanced
    else: tile, opts = exact, _build_opts(dims, leaves, vector, count, exact)
  if not tile and vec_is_reduce and _vector_fits(dims, vector, REDUCE_ACCUMULATORS):
    opts = _build_opts(dims, leaves, vector, REDUCE_ACCUMULATORS)
  opts.unroll = tuning.reduce_unroll
  return opts


def choose_opts(dims: Dims, leaves: list[LeafAccess], dtypes_used: set[DType], ops_used: set[Op]) -> Opts:
  if getenv("NOOPT", 0): return Opts(order=_natural_order(dims), cache_rows=False, stream=False)
  if not _may_use_lanes(dtypes_used, ops_used): return Opts(order=_natural_order(dims))
  return _complete(dims, leaves, _heuristic_vector(dims, leaves, dtypes_used), dtypes_used)


# ---- candidates for the search ----

def _effective_order(dims: Dims, opts: Opts) -> tuple[int, ...]:
  """The loops that exist: a fully unrolled axis has no loop, so its place in the order is moot."""
  return tuple(d for d in opts.order if dims[d][0] // opts.upcast.get(d, 1) > 1)


def distinct_opts(dims: Dims, found: list[Opts]) -> list[Opts]:
  """`found` without repeats (the first of equal ones stays): equal upcasts, vector and loops."""
  seen, out = set(), []
  for opts in found:
    key = (tuple(sorted(opts.upcast.items())), opts.vector, _effective_order(dims, opts), opts.unroll, opts.stage,
           opts.transposed)
    if key in seen: continue
    seen.add(key)
    out.append(opts)
  return out


def _vector_variants(dims: Dims, leaves: list[LeafAccess], dtypes_used: set[DType]) -> list[Opts]:
  # the heuristic takes the widest vector on the axis with the most consecutive accesses; another
  # axis, or a narrower vector (fewer shuffles, more rows in the tile), can be faster
  return [_complete(dims, leaves, (d, width), dtypes_used) for width in _vector_widths(dtypes_used)
          for d in range(len(dims)) if _vector_score(dims, leaves, d, width) is not None]


def _vector_counts(dims: Dims, vector: Vector) -> list[int]:
  """SIMD vectors to try along the vector axis: a tile's row on a non-reduce axis, partial sums on a
  reduce axis."""
  if vector is None: return [1]
  counts = SEARCH_REDUCE_ACCUMULATORS if dims[vector[0]][1] else SEARCH_ROW_VECTORS
  return [c for c in counts if _vector_fits(dims, vector, c)]


def _tile_size(tile: dict[int, int]) -> int:
  size = 1
  for amount in tile.values(): size *= amount
  return size


def _tiles(dims: Dims, leaves: list[LeafAccess], vec: int | None, budget: int) -> list[dict[int, int]]:
  """Every register tile over the first two reuse axes (_tile_axes' order) whose unrolls divide them and whose
  accumulators fit the budget, the empty tile included."""
  tiles: list[dict[int, int]] = [{}]
  for d in _tile_axes(dims, leaves, vec, budget, tails=False)[:2]:
    amounts = [a for a in TILE_AMOUNTS if dims[d][0] % a == 0]
    tiles += [{**t, d: a} for t in tiles for a in amounts if a * _tile_size(t) <= budget]
  return tiles


def _lane_variants(dims: Dims, leaves: list[LeafAccess], vector: Vector) -> list[Opts]:
  # the fastest register tile depends on the register count, L1 sets and the shape, and the
  # heuristic's budget was tuned on one machine at one size: try every tile that fits a larger one
  if not _wants_tile(dims): return []
  vec = vector[0] if vector is not None else None
  vec_is_reduce = vec is not None and dims[vec][1]
  out = []
  for count in _vector_counts(dims, vector):
    # partial sums along a reduce axis stand in for a tile (the tile's accumulators hide latency too)
    if vec_is_reduce and count > 1:
      out.append(_build_opts(dims, leaves, vector, count))
      continue
    tiles = _tiles(dims, leaves, vec, SEARCH_MAX_ACCUMULATORS // count)
    out += [_build_opts(dims, leaves, vector, count, tile) for tile in tiles]
  return out


def candidate_opts(dims: Dims, leaves: list[LeafAccess], dtypes_used: set[DType], ops_used: set[Op]) -> list[Opts]:
  """The lane choices worth timing, the heuristic's first, then one family varied at a time around
  it: other vector axes and widths (each completed by the heuristic's rules), then row vectors,
  register tiles and partial sums for the heuristic's vector. All distinct, and every upcast divides
  its dim but tile rows the heuristic's rules chose, which may leave one tail (tails_are_valid). Loop orders
  are order_variants: the search tries them on the fastest of these only."""
  heuristic = choose_opts(dims, leaves, dtypes_used, ops_used)
  if getenv("NOOPT", 0) or not _may_use_lanes(dtypes_used, ops_used): return [heuristic]
  found = [heuristic] + _vector_variants(dims, leaves, dtypes_used)
  found += _lane_variants(dims, leaves, heuristic.vector)
  return distinct_opts(dims, found)


def order_variants(dims: Dims, opts: Opts) -> list[Opts]:
  """`opts` with other orders of its outer loops: reversed, and each axis moved outermost."""
  # the order decides which operand stays in cache and which loop the threads split; the heuristic
  # reorders only tiled kernels (by its panel rule), so a transposing copy, say, may prefer another
  natural = _natural_order(dims)
  orders = [natural, natural[::-1]] + [[d] + [a for a in natural if a != d] for d in natural]
  # without staging: which loops pick the staged panel is what these orders change
  found = [Opts(dict(opts.upcast), opts.vector, order, opts.unroll, transposed=opts.transposed) for order in orders]
  # a tail tile must run inside another loop: an order that moves its axis outside them can't keep it
  return [o for o in distinct_opts(dims, [opts] + found) if o is not opts and tails_are_valid(dims, o)]
