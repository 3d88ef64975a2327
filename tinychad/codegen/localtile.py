"""Local-memory tiling for matmul-shaped GPU kernels (matmuls, convolutions): a work-group stages tiles of its
operands in work-group memory and every work-item computes its register tile from there.

in: a plain-loop Program from linearize.py (with gpu.py's register tile), before gpu.py maps its loops to
    work-items
out: the GPU Program as an implicit matrix product, or None where the kernel doesn't qualify. Its output
     loops split three ways: the innermost is the columns (grid dimension 0), the loops no column-reading
     load reads along are the rows (dimension 1, folded into one index where several: a convolution's
     batch, height and width), the rest (a batched matmul's batch) the group's batch (dimension 2, one
     work-item per group). Its reduce loops (a convolution's channels and kernel window) fold into one
     reduce cut into steps of TILE_K: in each step the group copies, for every load of the reduce body that
     reads along the rows (A) or the columns (B), the elements its work-items will read into a __local
     array (one strided loop over the group's flat index, so neighbouring work-items read neighbouring
     elements), waits at a barrier, runs TILE_K steps of the body reading those arrays, and waits again
     before the next copy. Loads that read along neither (the same element for the whole group) stay
     global reads.
What qualifies: perfectly nested reduce loops of at least TILE_K steps in all, right inside the output loops,
their body without loops, ifs or stores; at least one load of each kind, none reading along both, none along
one without the reduce, their arrays within LOCAL_TILE_MAX_BYTES; nothing loaded before the reduce. Elements
past an edge (a row, a column or a reduce step beyond the extent: sizes the tile doesn't divide, a load's own
gate) are copied as 0 and never used: the reduce body runs under an IF for a partial last step, and the
results are stored under an IF for the padding work-items, which must still reach every barrier.
"""
from __future__ import annotations
from tinychad.dtype import dtypes
from tinychad.helpers import prod
from tinychad.ops import BinaryOps
from tinychad.codegen.uops import Program, UOp, UOps

TILE_K = 16              # reduce steps staged per copy
TILE_COLUMNS = 16        # work-items of a group along the columns (dimension 0)
TILE_WORK_ITEMS = 128    # work-items of a group in all (gpu.py's MAX_WORK_GROUP)
LOCAL_TILE_MIN_OUTPUTS = 64   # fewer work-items than this: the copies cost more than the reuse gives
LOCAL_TILE_MAX_BYTES = 32 * 1024   # the work-group memory every OpenCL device has (CUDA: 48 KiB without opting in)


def _loops_read(uops: list[UOp]) -> dict[int, set[int]]:
  """id(u) -> the ids of the loops (RANGEs) u's value depends on."""
  read: dict[int, set[int]] = {}
  for u in uops:
    read[id(u)] = {id(u)} if u.op is UOps.RANGE else set()
    for s in u.srcs: read[id(u)] |= read.get(id(s), set())
  return read


def local_tile(program: Program, loops: list[UOp], max_blocks: tuple[int, int, int]) -> Program | None:
  """`program` tiled through work-group memory (see the module docstring), or None where it doesn't qualify
  or its work-groups would pass `max_blocks` (per grid dimension); `loops` are its perfectly nested output
  loops, outermost first (gpu.py's _mapped_loops)."""
  uops = program.uops
  reduces = [u for u in uops if u.op is UOps.RANGE and u not in loops]
  if len(loops) < 2 or not reduces or any(r.srcs for r in reduces): return None
  ends = {id(u.srcs[0]): i for i, u in enumerate(uops) if u.op is UOps.ENDRANGE}
  start, end = uops.index(reduces[0]), ends[id(reduces[0])]
  # perfectly nested: the reduce loops end one right after the other, innermost first
  if [ends[id(r)] for r in reduces] != list(range(end, end - len(reduces), -1)): return None
  body = [u for u in uops[start:end + 1] if u not in reduces and not (u.op is UOps.ENDRANGE and u.srcs[0] in reduces)]
  steps = prod(r.arg[1] for r in reduces)
  if steps < TILE_K or any(u.op is UOps.LOAD for u in uops[:start]) or \
     any(u.op in (UOps.RANGE, UOps.IF, UOps.STORE, UOps.DEFINE_ACC) for u in body): return None
  read = _loops_read(uops)
  col = loops[-1]
  loads = [u for u in body if u.op is UOps.LOAD]
  if any(u.srcs[0].op is not UOps.DEFINE_GLOBAL or u.dtype == dtypes.bool for u in loads): return None
  on = {id(u): set().union(*(read[id(s)] for s in u.srcs[1:])) for u in loads}
  # a loop a column-reading load also reads along is the same for the whole group: the batch
  batch_loops = [l for l in loops[:-1] if any(id(col) in on[id(u)] and id(l) in on[id(u)] for u in loads)]
  row_loops = [l for l in loops[:-1] if l not in batch_loops]
  row_ids, reduce_ids = {id(l) for l in row_loops}, {id(r) for r in reduces}
  staged = []       # (load, "A" (reads along the rows) or "B" (along the columns))
  for u in loads:
    along_rows, along_col = bool(on[id(u)] & row_ids), id(col) in on[id(u)]
    if not (along_rows or along_col): continue
    if not on[id(u)] & reduce_ids or (u.vec > 1 and len(u.srcs) > 2): return None
    if not all(map(_index_only, u.srcs[1:])): return None
    staged.append((u, "A" if along_rows else "B"))
  if {kind for _, kind in staged} != {"A", "B"}: return None
  rows, cols, batch = prod(l.arg[1] for l in row_loops), col.arg[1], prod(l.arg[1] for l in batch_loops)
  if rows * cols < LOCAL_TILE_MIN_OUTPUTS: return None
  local_cols = min(TILE_COLUMNS, cols)
  local_rows = min(1 << ((TILE_WORK_ITEMS // local_cols).bit_length() - 1), rows)
  threads = local_cols * local_rows
  across = {"A": local_rows, "B": local_cols}
  if sum(across[kind] * TILE_K * u.vec * u.dtype.itemsize for u, kind in staged) > LOCAL_TILE_MAX_BYTES: return None
  if any(blocks > limit for blocks, limit in zip((-(-cols // local_cols), -(-rows // local_rows), batch), max_blocks)):
    return None

  idx = reduces[0].dtype
  extent = {id(loop): loop.arg[1] for loop in loops + reduces}    # read before the loops are rewritten
  out: list[UOp] = []

  def new(op: UOps, dtype, srcs=(), arg=None, vec: int = 1) -> UOp:
    out.append(u := UOp(op, dtype, srcs, arg, vec))
    return u

  def const(value: int) -> UOp: return new(UOps.CONST, idx, (), value)

  def alu(op: BinaryOps, a: UOp, b: UOp | int, dtype=None) -> UOp:
    return new(UOps.ALU, dtype or idx, (a, const(b) if isinstance(b, int) else b), op)

  def unfold(value: UOp, folded: list[UOp]) -> dict[int, UOp]:
    """id(loop) -> that loop's value where `value` counts through `folded` (outermost first) as one index."""
    values, stride = {}, 1
    for loop in reversed(folded):
      step = alu(BinaryOps.DIV, value, stride) if stride > 1 else value
      values[id(loop)] = alu(BinaryOps.MOD, step, extent[id(loop)]) if len(folded) > 1 else step
      stride *= extent[id(loop)]
    return values

  def become(loop: UOp, value: UOp) -> None:
    """Rewrite `loop` in place into a copy of `value`, so the loop's users read that value."""
    loop.op, loop.dtype, loop.srcs, loop.arg = value.op, value.dtype, value.srcs, value.arg
    out.append(loop)

  tops = [u for u in uops if u.op is UOps.DEFINE_GLOBAL]
  lid_col = new(UOps.SPECIAL, idx, (), ("lidx0", "local", 0))
  lid_row = new(UOps.SPECIAL, idx, (), ("lidx1", "local", 1))
  gid_col = new(UOps.SPECIAL, idx, (), ("gidx_col", "group", 0))
  gid_row = new(UOps.SPECIAL, idx, (), ("gidx_row", "group", 1))
  flat = alu(BinaryOps.ADD, alu(BinaryOps.MUL, lid_row, local_cols), lid_col)
  col_first, row_first = alu(BinaryOps.MUL, gid_col, local_cols), alu(BinaryOps.MUL, gid_row, local_rows)
  # the output loops become the work-item's row, column and batch (the loop UOps themselves, so their users follow)
  become(col, alu(BinaryOps.ADD, col_first, lid_col))
  row = alu(BinaryOps.ADD, row_first, lid_row)
  values = unfold(row, row_loops)
  for loop in row_loops: become(loop, values[id(loop)])
  if len(batch_loops) == 1:       # the loop itself becomes the group's index
    batch_loops[0].op, batch_loops[0].arg = UOps.SPECIAL, (batch_loops[0].arg[0], "group", 2)
    out.append(batch_loops[0])
  elif batch_loops:
    values = unfold(new(UOps.SPECIAL, idx, (), ("gidx_batch", "group", 2)), batch_loops)
    for loop in batch_loops: become(loop, values[id(loop)])
  out += [u for u in uops[:start] if u.op is not UOps.DEFINE_GLOBAL and u not in loops]
  step = new(UOps.RANGE, idx, (), (reduces[0].arg[0] + "_tile", -(-steps // TILE_K), False, 1))
  step_first = alu(BinaryOps.MUL, step, TILE_K)
  shared = {}
  for load, kind in staged:
    # [row or reduce step][reduce step or column][lane]: the group's elements for this step, row by row
    across, lanes = (local_rows, TILE_K) if kind == "A" else (TILE_K, local_cols), load.vec
    size = across[0] * across[1] * lanes
    array = UOp(UOps.DEFINE_SHARED, load.dtype, (), size)
    shared[id(load)] = (array, kind)
    copy = new(UOps.RANGE, idx, (), (f"copy{len(shared)}", -(-size // threads), False, 1))
    element = alu(BinaryOps.ADD, alu(BinaryOps.MUL, copy, threads), flat)
    inside = alu(BinaryOps.CMPLT, element, size, dtypes.bool) if size % threads else None
    if inside is not None: new(UOps.IF, None, (inside,))
    lane, pair = None, element
    if lanes > 1: lane, pair = alu(BinaryOps.MOD, element, lanes), alu(BinaryOps.DIV, element, lanes)
    first, second = alu(BinaryOps.DIV, pair, across[1]), alu(BinaryOps.MOD, pair, across[1])
    if kind == "A": out_index, out_extent, out_first, k = first, rows, row_first, second
    else: out_index, out_extent, out_first, k = second, cols, col_first, first
    at_out, at_step = alu(BinaryOps.ADD, out_first, out_index), alu(BinaryOps.ADD, step_first, k)
    valid = alu(BinaryOps.AND, alu(BinaryOps.CMPLT, at_out, out_extent, dtypes.bool),
                alu(BinaryOps.CMPLT, at_step, steps, dtypes.bool), dtypes.bool)
    values = unfold(at_step, reduces) | (unfold(at_out, row_loops) if kind == "A" else {id(col): at_out})
    values |= {id(loop): loop for loop in batch_loops}
    where, *gate = [_copy(s, values, new) for s in load.srcs[1:]]
    if gate: valid = alu(BinaryOps.AND, valid, gate[0], dtypes.bool)
    if lane is not None: where = alu(BinaryOps.ADD, where, lane)
    value = new(UOps.LOAD, load.dtype, (load.srcs[0], where, valid))
    new(UOps.STORE, None, (array, element, value))
    if inside is not None: new(UOps.ENDIF, None)
    new(UOps.ENDRANGE, None, (copy,))
  new(UOps.BARRIER, None)
  inner = new(UOps.RANGE, idx, (), (reduces[0].arg[0] + "_in", TILE_K, False, 1))
  at = alu(BinaryOps.ADD, step_first, inner)
  values = unfold(at, reduces)
  for loop in reduces: become(loop, values[id(loop)])
  if steps % TILE_K: new(UOps.IF, None, (alu(BinaryOps.CMPLT, at, steps, dtypes.bool),))
  for u in body:
    if id(u) in shared:
      array, kind = shared[id(u)]
      position = alu(BinaryOps.ADD, alu(BinaryOps.MUL, lid_row, TILE_K), inner) if kind == "A" else \
        alu(BinaryOps.ADD, alu(BinaryOps.MUL, inner, local_cols), lid_col)
      u.srcs = (array, alu(BinaryOps.MUL, position, u.vec) if u.vec > 1 else position)
    out.append(u)
  if steps % TILE_K: new(UOps.ENDIF, None)
  new(UOps.ENDRANGE, None, (inner,))
  new(UOps.BARRIER, None)
  new(UOps.ENDRANGE, None, (step,))
  epilogue = [u for u in uops[end + 1:] if not (u.op is UOps.ENDRANGE and u.srcs[0] in loops)]
  padded = -(-rows // local_rows) * local_rows != rows or -(-cols // local_cols) * local_cols != cols
  if padded:
    guard = alu(BinaryOps.AND, alu(BinaryOps.CMPLT, row, rows, dtypes.bool),
                alu(BinaryOps.CMPLT, col, cols, dtypes.bool), dtypes.bool)
    new(UOps.IF, None, (guard,))
  out += epilogue
  if padded: new(UOps.ENDIF, None)
  arrays = [array for array, _ in shared.values()]
  ordered = tops + arrays + _live(out)
  for number, u in enumerate(ordered): u.num = number
  # the launch in work-items (global sizes, then the group's), as gpu.py's
  launch = (-(-cols // local_cols) * local_cols, -(-rows // local_rows) * local_rows, batch, local_cols, local_rows, 1)
  return Program(program.name, ordered, program.globals, launch, program.contract)


def _index_only(u: UOp) -> bool:
  """Whether u is an index or a gate made of loop variables, constants and scalar arithmetic alone (what _copy
  can copy)."""
  return u.op is UOps.RANGE or (u.op in (UOps.ALU, UOps.CONST) and u.vec == 1 and all(map(_index_only, u.srcs)))


def _copy(u: UOp, values: dict[int, UOp], new) -> UOp:
  """A copy of u's expression (_index_only) with its loops replaced by their `values` (by id); made by `new`,
  so it is emitted where the copy needs it (an index computed inside the reduce body is recomputed there). The
  loops are found by id: they may already be rewritten into the work-item's own values."""
  if id(u) in values: return values[id(u)]
  return new(u.op, u.dtype, tuple(_copy(s, values, new) for s in u.srcs), u.arg)


def _live(uops: list[UOp]) -> list[UOp]:
  """uops without the index arithmetic nothing reads any more (the staged loads' old global indices)."""
  used: set[int] = set()
  for u in reversed(uops):
    if u.op in (UOps.ALU, UOps.CONST) and id(u) not in used: continue
    used.update(id(s) for s in u.srcs)
  return [u for u in uops if u.op not in (UOps.ALU, UOps.CONST) or id(u) in used]
