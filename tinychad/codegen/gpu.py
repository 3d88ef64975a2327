"""GPU-style lowering: a kernel's loops become the work-items of a launch grid.

in: a ScheduleItem (its kernel tree and name), the same trees the CPU lowers
out: a GPU Program (uops.py's IR plus SPECIAL / IF / DEFINE_SHARED / BARRIER, renderer/gpu.py writes it) and
     its launch geometry: `parallel` holds (global sizes x3, local sizes x3), the kernel record's field
     for it (engine/realize.py writes it, a new process reads it back unchanged).
The kernel tree is lowered by linearize.py with plain loops (no SIMD lanes, no row cache: a GPU gets its
parallelism from work-items, not from lanes of one thread), except for a register tile: in a matmul or a
convolution each work-item computes a REGISTER_TILE x REGISTER_TILE block of outputs (`_register_tile`),
so each value it loads feeds several accumulators, and a row of the tile that runs along consecutive
elements is one vector (`_vector_axis`: a vector load or store). Then:
  - the perfectly nested non-reduce loops at the top of the program (no store before an inner one, nothing
    after it inside its parent) become work-item indices: the innermost one is dimension 0, so
    neighbouring work-items touch neighbouring elements (coalesced), the next dimension 1, and every
    outer one is folded into dimension 2 (recovered with a divide and a remainder); a dimension that
    would need more work-groups than MAX_GRID_BLOCKS allows (CUDA launches at most 65535 along 1 and 2)
    is folded into the one below it instead (`_grid_dims`);
  - a work-group size is chosen per dimension from the loop extents (`work_group`), at most
    MAX_WORK_GROUP work-items; the grid is rounded up to whole groups and an IF keeps the padding
    work-items from running;
  - a kernel with one reduce loop of at least GROUP_REDUCE_MIN steps and at most GROUP_REDUCE_MAX_OUTPUTS
    outputs (a full sum, a bias's gradient) is a grouped reduce (`_grouped_reduce`): GROUP_REDUCE_THREADS work-items share
    each output, each sums a strided slice of the reduce range, and the group adds their partial sums
    in work-group memory, halving with a barrier between steps;
  - on a device with work-group memory of its own, a matmul- or convolution-shaped kernel stages tiles of
    its operands there (localtile.py).
Loops left (reduce loops, a scatter-add's inner loops) run inside each work-item. Flash attention's kernels
(attention.py) keep their own lowering: each step of their parallel loop is a work-item.
"""
from __future__ import annotations
from tinychad.dtype import VECTOR_DTYPES, dtypes
from tinychad.helpers import DEBUG, prod
from tinychad.ops import BinaryOps, LoadOps
from tinychad.codegen.linearize import linearize, opt_inputs
from tinychad.codegen.localtile import local_tile
from tinychad.codegen.opt import SCALAR_ONLY_OPS, Opts
from tinychad.codegen.scatter import lower_scatter_add
from tinychad.codegen.attention import lower_attention
from tinychad.codegen.uops import Program, UOp, UOps

MAX_WORK_GROUP = 128     # work-items per group: 4 warps on NVIDIA; PoCL vectorizes across them
REGISTER_TILE = 4               # outputs per work-item along each of up to two axes of a reduce (matmul, conv)
REGISTER_TILE_MIN_REDUCE = 16
GROUP_REDUCE_THREADS = 128       # work-items sharing one output of a grouped reduce (a power of two)
GROUP_REDUCE_MIN = 256           # shorter reduces stay a loop in one work-item
GROUP_REDUCE_MAX_OUTPUTS = 2048  # more outputs than this keep the device busy one work-item each
MAX_GRID_BLOCKS = (2**31 - 1, 65535, 65535)   # work-groups per launch dimension: CUDA's limits; OpenCL has none


def lower_gpu(item, local_memory: bool = False) -> Program:
  """The GPU Program of a ScheduleItem's kernel (its `parallel` is the launch geometry). `local_memory`: the
  device has work-group memory of its own (a GPU), so matmul- and convolution-shaped kernels stage their
  operands there (localtile.py); where it is ordinary memory (PoCL on a CPU) that only adds copies and
  barriers."""
  if item.ast.op is LoadOps.ATTENTION:
    # flash attention's kernels (attention.py): each step of their parallel loop (a tile of query rows of one
    # head) becomes a work-item, its scratch array private to it
    program = to_grid(lower_attention(item.ast, item.name))
  elif item.ast.op is LoadOps.SCATTER_ADD: program = lower_scatter_add(item.ast, item.name)
  else:
    dims, access, dtypes_used, ops_used = opt_inputs(item.ast)
    order = [d for d, (_, is_reduce) in enumerate(dims) if not is_reduce]
    tile = _register_tile(dims, access)
    vector = _vector_axis(tile, access, dtypes_used, ops_used)
    program = linearize(item.ast, item.name, Opts(tile, vector, order=order, cache_rows=False, stream=False))
  if item.ast.op is not LoadOps.ATTENTION:
    # each of these rewrites the program's uops in place, so the next is tried only where one declined
    program = _grouped_reduce(program) or \
      (local_tile(program, _mapped_loops(program.uops), MAX_GRID_BLOCKS) if local_memory else None) or to_grid(program)
  if DEBUG() >= 3:
    print(item.ast.pretty())
    print(program.pretty())
  return program


def _register_tile(dims: list[tuple[int, bool]], access: list) -> dict[int, int]:
  """Axes unrolled into each work-item's register tile (axis -> rows): up to two non-reduce axes that
  REGISTER_TILE divides and along which a load inside the reduce is reused (stride 0: B's rows in a matmul
  reuse along A's row axis), in a reduce of at least REGISTER_TILE_MIN_REDUCE steps. Each loaded value then
  feeds several accumulators. Only dividing axes: a tile's leftover rows would be a loop after the tile, and
  that loop could not become work-items."""
  if prod(size for size, is_reduce in dims if is_reduce) < REGISTER_TILE_MIN_REDUCE: return {}
  loads = [a for a in access if a.is_load and a.below_reduce and None not in a.strides]
  tile = {}
  for d, (size, is_reduce) in reversed(list(enumerate(dims))):
    if is_reduce or size % REGISTER_TILE or size // REGISTER_TILE < 1 or len(tile) == 2: continue
    if any(a.strides[d] == 0 for a in loads) and any(a.strides[d] != 0 for a in loads): tile[d] = REGISTER_TILE
  return tile


def _vector_axis(tile: dict[int, int], access: list, dtypes_used: set, ops_used: set) -> tuple[int, int] | None:
  """The register tile's axis whose lanes become one vector (axis, lanes): every load reads one element or
  consecutive ones along it and the store writes consecutive ones, so a row of B is one vector load (the
  OpenCL dialect's vloadN; the arithmetic stays per lane)."""
  if not dtypes_used <= VECTOR_DTYPES or ops_used & SCALAR_ONLY_OPS: return None
  for d, lanes in tile.items():
    if all(a.strides[d] in (0, 1) for a in access if a.is_load) and \
       all(a.strides[d] == 1 for a in access if a.is_store) and not any(a.is_gather for a in access):
      return d, lanes
  return None


def work_group(extents: list[int], limit: int = MAX_WORK_GROUP) -> list[int]:
  """A work-group size per dimension (innermost first): a whole extent that fits what is left of
  `limit`, else the largest power of two that pads the grid by at most an eighth."""
  sizes = []
  for extent in extents:
    if extent <= limit: size = extent
    else:
      powers = [1 << p for p in range(limit.bit_length()) if 1 << p <= limit][::-1]
      size = next(p for p in powers if -(-extent // p) * p - extent <= extent // 8)
    sizes.append(max(size, 1))
    limit = max(limit // max(size, 1), 1)
  return sizes


def _mapped_loops(uops: list[UOp]) -> list[UOp]:
  """The outermost non-reduce loops, perfectly nested: each the first loop inside the one before it,
  with no store before it and nothing but its own end after it inside its parent."""
  ends = {id(u.srcs[0]): i for i, u in enumerate(uops) if u.op is UOps.ENDRANGE}
  loops: list[UOp] = []
  start, stop = 0, len(uops)
  while True:
    first = next((i for i in range(start, stop) if uops[i].op in (UOps.RANGE, UOps.STORE)), None)
    if first is None or uops[first].op is UOps.STORE or not uops[first].arg[0].startswith("gidx"): break
    end = ends[id(uops[first])]
    if loops and end != stop - 1: break      # something after it inside the parent: it stays a loop
    loops.append(uops[first])
    start, stop = first + 1, end
  return loops


def _grouped_reduce(program: Program) -> Program | None:
  """`program` as a grouped reduce (see the module docstring), or None where it doesn't qualify: at most
  two output loops, one reduce loop of at least GROUP_REDUCE_MIN steps holding one accumulator's add or
  max, and at most GROUP_REDUCE_MAX_OUTPUTS outputs."""
  uops = program.uops
  loops = _mapped_loops(uops)
  ranges = [u for u in uops if u.op is UOps.RANGE and u not in loops]
  accs = [u for u in uops if u.op is UOps.DEFINE_ACC]
  assigns = [u for u in uops if u.op is UOps.ASSIGN]
  if len(loops) > 2 or len(ranges) != 1 or len(accs) != 1 or len(assigns) != 1 or accs[0].vec != 1: return None
  loop, acc, assign = ranges[0], accs[0], assigns[0]
  combine = assign.srcs[1]
  if combine.op is not UOps.ALU or combine.arg not in (BinaryOps.ADD, BinaryOps.MAX) or combine.srcs[0] is not acc: return None
  extent, outputs = loop.arg[1], prod(u.arg[1] for u in loops)
  if extent < GROUP_REDUCE_MIN or outputs > GROUP_REDUCE_MAX_OUTPUTS: return None
  threads, idx = GROUP_REDUCE_THREADS, loop.dtype
  grid = [threads] + [u.arg[1] for u in loops[::-1]] + [1] * (2 - len(loops))
  if not _fits(grid, [threads, 1, 1]): return None

  def new(op: UOps, dtype, srcs=(), arg=None) -> UOp: return UOp(op, dtype, srcs, arg)

  def const(value, dtype=idx) -> UOp: return new(UOps.CONST, dtype, (), value)

  for dim, out_loop in enumerate(loops[::-1]): out_loop.op, out_loop.arg = UOps.SPECIAL, (out_loop.arg[0], "group", dim + 1)
  lid = new(UOps.SPECIAL, idx, (), ("lidx0", "local", 0))
  shared = new(UOps.DEFINE_SHARED, acc.dtype, (), threads)
  # the reduce loop: each work-item takes every `threads`-th step, from its local index on
  step = new(UOps.RANGE, idx, (), (loop.arg[0] + "_step", -(-extent // threads), False, 1))
  start = new(UOps.ALU, idx, (step, const(threads)), BinaryOps.MUL)
  loop.op, loop.srcs, loop.arg = UOps.ALU, (start, lid), BinaryOps.ADD
  gate = new(UOps.ALU, dtypes.bool, (loop, const(extent)), BinaryOps.CMPLT) if extent % threads else None
  end = next(i for i, u in enumerate(uops) if u.op is UOps.ENDRANGE and u.srcs[0] is loop)
  at = uops.index(loop)
  out = [u for u in uops[:at] if u not in loops] + [step, start, loop]
  out += ([gate, new(UOps.IF, None, (gate,))] if gate is not None else []) + uops[at + 1:end]
  out += [new(UOps.ENDIF, None)] if gate is not None else []
  out += [new(UOps.ENDRANGE, None, (step,)), new(UOps.STORE, None, (shared, lid, acc)), new(UOps.BARRIER, None)]
  # the group's partial sums halved in work-group memory, a barrier after each step
  half = threads // 2
  while half:
    inside = new(UOps.ALU, dtypes.bool, (lid, const(half)), BinaryOps.CMPLT)
    other = new(UOps.ALU, idx, (lid, const(half)), BinaryOps.ADD)
    a, b = new(UOps.LOAD, acc.dtype, (shared, lid)), new(UOps.LOAD, acc.dtype, (shared, other))
    both = new(UOps.ALU, acc.dtype, (a, b), combine.arg)
    out += [inside, new(UOps.IF, None, (inside,)), other, a, b, both, new(UOps.STORE, None, (shared, lid, both)),
            new(UOps.ENDIF, None), new(UOps.BARRIER, None)]
    half //= 2
  # work-item 0 finishes the output from the group's total
  total = new(UOps.LOAD, acc.dtype, (shared, const(0)))
  first = new(UOps.ALU, dtypes.bool, (lid, const(0)), BinaryOps.CMPEQ)
  out += [total, first, new(UOps.IF, None, (first,))]
  rest = [u for u in uops[end + 1:] if not (u.op is UOps.ENDRANGE and u.srcs[0] in loops)]
  for u in rest: u.srcs = tuple(total if s is acc else s for s in u.srcs)
  out += rest + [new(UOps.ENDIF, None)]
  tops = [u for u in out if u.op in (UOps.DEFINE_GLOBAL, UOps.DEFINE_LOCAL)]
  ordered = tops + [shared, lid] + loops[::-1] + [u for u in out if u.op not in (UOps.DEFINE_GLOBAL, UOps.DEFINE_LOCAL)]
  for number, u in enumerate(ordered): u.num = number
  return Program(program.name, ordered, program.globals, tuple(grid + [threads, 1, 1]), program.contract)


def _fits(grid: list[int], local: list[int]) -> bool:
  """Whether a launch of `grid` work-items in groups of `local` stays within MAX_GRID_BLOCKS."""
  return all(-(-size // group) <= limit for size, group, limit in zip(grid, local, MAX_GRID_BLOCKS))


def _grid_dims(loops: list[UOp]) -> list[list[UOp]]:
  """The mapped loops (innermost first) as up to three grid dimensions, each a run of loops folded into one
  index: the innermost loop alone in dimension 0, the next alone in dimension 1, the rest folded into
  dimension 2; a dimension whose work-groups would pass MAX_GRID_BLOCKS joins the one below it (dimension
  0's limit is 2^31 - 1 groups, so that ends)."""
  dims = [run for run in (loops[:1], loops[1:2], loops[2:]) if run]
  while True:
    extents = [prod(u.arg[1] for u in run) for run in dims]
    blocks = [-(-extent // group) for extent, group in zip(extents, work_group(extents))]
    over = next((d for d in range(len(dims) - 1, 0, -1) if blocks[d] > MAX_GRID_BLOCKS[d]), None)
    if over is None: return dims
    dims[over - 1:over + 1] = [dims[over - 1] + dims[over]]


def to_grid(program: Program) -> Program:
  """`program` (plain loops) with its mapped loops replaced by work-item indices and guarded."""
  uops = program.uops
  loops = _mapped_loops(uops)
  idx = loops[0].dtype if loops else dtypes.int32
  head: list[UOp] = []

  def new(op: UOps, dtype, srcs=(), arg=None) -> UOp:
    head.append(u := UOp(op, dtype, srcs, arg))
    return u

  dims = _grid_dims(loops[::-1])
  extents = [prod(u.arg[1] for u in run) for run in dims]
  local = work_group(extents) + [1] * (3 - len(extents))
  grid = [-(-e // g) * g for e, g in zip(extents, local)] + [1] * (3 - len(extents))
  direct, folded, indices = [], [], []
  for dim, run in enumerate(dims):
    if len(run) == 1:
      run[0].op, run[0].arg = UOps.SPECIAL, (run[0].arg[0], "global", dim)
      direct.append(run[0])
      indices.append(run[0])
      continue
    flat = new(UOps.SPECIAL, idx, (), (f"gidx_fold{dim}", "global", dim))
    stride = 1
    for loop in run:     # innermost first: it changes fastest
      step = new(UOps.ALU, idx, (flat, new(UOps.CONST, idx, (), stride)), BinaryOps.DIV) if stride > 1 else flat
      loop.op, loop.srcs, loop.arg = UOps.ALU, (step, new(UOps.CONST, idx, (), loop.arg[1])), BinaryOps.MOD
      stride *= loop.srcs[1].arg
    folded += run
    indices.append(flat)
  guard = None
  for index, extent, size in zip(indices, extents, grid):
    if size == extent: continue
    inside = new(UOps.ALU, dtypes.bool, (index, new(UOps.CONST, idx, (), extent)), BinaryOps.CMPLT)
    guard = inside if guard is None else new(UOps.ALU, dtypes.bool, (guard, inside), BinaryOps.AND)
  # the indices first (head is in creation order, each value after its sources), then the guard, then the rest
  moved = {id(u) for u in loops} | {id(u) for u in head}
  body = [u for u in uops if id(u) not in moved and not (u.op is UOps.ENDRANGE and id(u.srcs[0]) in moved)]
  tops = [u for u in body if u.op in (UOps.DEFINE_GLOBAL, UOps.DEFINE_LOCAL)]
  ordered = tops + direct + head + folded
  if guard is not None: ordered.append(UOp(UOps.IF, None, (guard,)))
  ordered += [u for u in body if u.op not in (UOps.DEFINE_GLOBAL, UOps.DEFINE_LOCAL)]
  if guard is not None: ordered.append(UOp(UOps.ENDIF, None))
  for number, u in enumerate(ordered): u.num = number
  return Program(program.name, ordered, program.globals, tuple(grid + local), program.contract)
