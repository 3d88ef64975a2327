"""Choosing how a kernel's loops are shaped: which axis becomes SIMD lanes, which axes are unrolled
into a register tile, and in which order the outer loops run.

in: the kernel's simplified dims ((size, is_reduce) per axis), one LeafAccess per LOAD/CONST/STORE
    (its strides over the dims, or None when stacked views make them unknown), the kernel's dtypes
    and ops, and the host's SIMD width in bytes
out: an Opts: `upcast[d]` lanes per axis (the loop over d then steps by that many, the lanes are
     unrolled), `vector` = (axis, width) whose lanes are one SIMD value, and `order`, the order of
     the non-reduce loops (the first one is what threads split).
The heuristics, in order (every choice needs the axis size to divide evenly, so no remainder loops):
  - vector axis: an axis along which every load reads either one element (stride 0) or consecutive
    elements (stride 1) and, when it is not a reduce axis, the store writes consecutive elements;
    a non-reduce axis wins over a reduce axis (no horizontal sum at the end); the full SIMD width
    first, then half and a quarter of it;
  - register tile (kernels with a reduce): a non-reduce axis along which a load is reused (stride 0)
    is unrolled, so each loaded value feeds several accumulators: the matmul micro-kernel, found
    from strides alone, so convolutions and their gradients get it too;
  - more accumulators: a reduce with no register tile keeps several vector partial sums (latency);
  - loop order: with a register tile and a non-reduce vector axis, the vector axis's loop goes
    outermost, then the other axes along which the tile's shared load (stride 0 along the tile:
    B in a matmul) moves, so the panel of B they select stays in cache while the tile axis sweeps
    A under it. This matters once the scheduler packed B into panels (engine/schedule.py): the
    vector axis is then split into (panel, lane) and the panel axis must stay outside the tile's.
    Axes B doesn't move along keep their natural order (a convolution's batch axis stays
    outermost: moving it inward would stride through the activations).
`NOOPT=1` returns plain loops (no lanes, natural order); the scheduler then packs nothing either.
"""
from __future__ import annotations
import functools
from dataclasses import dataclass, field
from tinychad.dtype import DType, dtypes
from tinychad.helpers import getenv
from tinychad.ops import Op, UnaryOps

# dtypes a SIMD value may hold: the renderers have vector types for these (half keeps per-op rounding scalar)
VECTOR_DTYPES = {dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64, dtypes.bool}
# ops a SIMD kernel may not contain: BITCAST goes through memory per element in C
SCALAR_ONLY_OPS = {UnaryOps.BITCAST}
MIN_VECTOR_WIDTH = 4          # narrower vectors aren't worth their shuffles
MIN_REDUCE_FOR_TILE = 16       # shorter reductions are not worth a register tile
TILE_AMOUNTS = (8, 6, 4, 3, 2)       # register-tile unroll per reuse axis, first that divides wins
# vector accumulators a tile may hold. AVX-512 has 32 registers, but on this Zen 5 a 12x32 fp32 tile
# (24 accumulators) ran slower than 8x32 (157 vs 171 GFLOP/s, 2048, one thread, packed B): its 12
# rows of A, a power of two apart, fall in one L1 set. 6x64 was faster (201), but 6 divides no
# power-of-two size and there are no remainder loops.
MAX_TILE_ACCUMULATORS = 16
TILE_ROW_VECTORS = 2           # SIMD vectors along a non-reduce vector axis in a register tile


@dataclass
class LeafAccess:
  strides: tuple[int | None, ...]    # element stride per dim; None where the index isn't affine in it
  is_load: bool                      # LOAD (True), CONST or STORE (False)
  is_store: bool
  below_reduce: bool                 # read inside the reduce loop


@dataclass
class Opts:
  upcast: dict[int, int] = field(default_factory=dict)
  vector: tuple[int, int] | None = None
  order: list[int] = field(default_factory=list)


@functools.lru_cache(maxsize=None)
def simd_bytes() -> int:
  """Bytes in one SIMD register of this host: 64 with AVX-512, 32 with AVX2, else 16."""
  try:
    with open("/proc/cpuinfo") as f: flags = next((ln for ln in f if ln.startswith("flags")), "").split()
  except OSError:
    flags = []
  if "avx512f" in flags: return 64
  return 32 if "avx2" in flags else 16


def panel_width(dtype: DType) -> int:
  """Elements in one row of a register tile along a non-reduce vector axis (TILE_ROW_VECTORS SIMD
  vectors, see choose_opts): the width of the panels the scheduler packs a strided operand into."""
  return TILE_ROW_VECTORS * simd_bytes() // dtype.itemsize


def _contiguous_along(leaf: LeafAccess, d: int, reduce_dim: bool) -> str | None:
  """How leaf reads along dim d: "same", "next" (stride 1), or None (anything else)."""
  if reduce_dim and not leaf.below_reduce and not leaf.is_store: return "same"
  stride = leaf.strides[d]
  return "same" if stride == 0 else "next" if stride == 1 else None


def _pick_vector(dims: list[tuple[int, bool]], leaves: list[LeafAccess], width: int) -> int | None:
  best, best_score = None, 0
  for d, (size, is_reduce) in enumerate(dims):
    if size % width != 0: continue
    kinds = [_contiguous_along(leaf, d, is_reduce) for leaf in leaves if leaf.is_load or (leaf.is_store and not is_reduce)]
    if None in kinds or "next" not in kinds: continue
    score = kinds.count("next") + (0 if is_reduce else len(leaves))
    if score > best_score: best, best_score = d, score
  return best


def _reuse_axes(dims: list[tuple[int, bool]], leaves: list[LeafAccess], skip: int | None) -> list[int]:
  """Non-reduce axes along which a load inside the reduce stays put: its lanes share that load."""
  loads = [leaf for leaf in leaves if leaf.is_load and leaf.below_reduce]
  axes = []
  for d, (size, is_reduce) in enumerate(dims):
    if is_reduce or d == skip: continue
    strides = [leaf.strides[d] for leaf in loads]
    if 0 in strides: axes.append(d)
  return axes


def _panel_axes(dims: list[tuple[int, bool]], leaves: list[LeafAccess], tile: list[int], vec: int) -> list[int]:
  """Non-reduce axes besides the vector axis along which a load shared by the tile (stride 0 along
  every tile axis: B in a matmul) moves: with the vector axis they pick the panel of B that the tile
  axes sweep over (a matmul whose B was packed has its vector axis split in two, and both go here)."""
  shared = [leaf for leaf in leaves if leaf.is_load and leaf.below_reduce and all(leaf.strides[d] == 0 for d in tile)]
  return [d for d, (_, r) in enumerate(dims) if not r and d != vec and d not in tile
          and any(leaf.strides[d] != 0 for leaf in shared)]


def choose_opts(dims: list[tuple[int, bool]], leaves: list[LeafAccess], dtypes_used: set[DType], ops_used: set[Op]) -> Opts:
  opts = Opts(order=[d for d, (_, r) in enumerate(dims) if not r])
  if getenv("NOOPT", 0): return opts
  if not dtypes_used <= VECTOR_DTYPES or ops_used & SCALAR_ONLY_OPS: return opts
  # the widest vector that some axis divides: a 24-wide convolution row still gets 8 lanes
  vec, full_width = None, simd_bytes() // max(dt.itemsize for dt in dtypes_used)
  for width in (full_width, full_width // 2, full_width // 4):
    if width >= MIN_VECTOR_WIDTH: vec = _pick_vector(dims, leaves, width)
    if vec is not None: break
  if vec is not None: opts.vector, opts.upcast[vec] = (vec, width), width
  reduce_size = 1
  for size, r in dims:
    if r: reduce_size *= size
  if reduce_size < MIN_REDUCE_FOR_TILE or all(not r for _, r in dims): return opts
  # without a vector axis the tile is scalar accumulators, which still share every load they can
  vec_is_reduce = vec is not None and dims[vec][1]
  if vec is not None and not vec_is_reduce and dims[vec][0] % (TILE_ROW_VECTORS * width) == 0:
    opts.upcast[vec] = TILE_ROW_VECTORS * width
  budget = MAX_TILE_ACCUMULATORS // (opts.upcast[vec] // width if vec is not None else 1)
  tile = []
  for d in _reuse_axes(dims, leaves, vec)[:2]:
    amount = next((a for a in TILE_AMOUNTS if dims[d][0] % a == 0 and a <= budget), None)
    if amount is None: continue
    opts.upcast[d], budget = amount, budget // amount
    tile.append(d)
  if not tile and vec_is_reduce and dims[vec][0] % (4 * width) == 0: opts.upcast[vec] = 4 * width
  if tile and vec is not None and not vec_is_reduce:
    panel = _panel_axes(dims, leaves, tile, vec)
    opts.order = [vec] + panel + [d for d in opts.order if d != vec and d not in panel]
  return opts
