"""Local-memory tiling for matmul-shaped GPU kernels: a work-group stages tiles of its operands in work-group
memory and every work-item computes its register tile from there.

in: a plain-loop Program from linearize.py (with gpu.py's register tile), before gpu.py maps its loops to
    work-items
out: the GPU Program with the two innermost output loops as a work-group grid (dimension 0 the inner one,
     1 the outer, a third output loop as dimension 2 with one work-item per group), and its reduce loop cut
     into steps of TILE_K: in each step the group copies, for every load of the reduce body, the elements its
     work-items will read into a __local array (one strided loop over the group's flat index, so neighbouring
     work-items read neighbouring elements), waits at a barrier, runs TILE_K steps of the body reading those
     arrays, and waits again before the next copy. None where the kernel doesn't qualify.
What qualifies (a matmul, a batched matmul, a 1x1 convolution's products): one reduce loop of at least
TILE_K steps right inside two or three perfectly nested output loops; a reduce body with no loops and
only ungated loads whose index is affine (+, * by constants) in the output loops and the reduce index, at
least one not reading along the inner output loop (A's rows) and one not along the outer (B's columns),
none along both; nothing loaded before the reduce loop. Elements past an edge (a row, a column or a reduce
step beyond the extent: sizes the tile doesn't divide) are copied as 0 and never used: the reduce body
runs under an IF for a partial last step, and the results are stored under an IF for the padding
work-items, which must still reach every barrier. Loads that read along neither output loop (the same
element for the whole group) stay global reads.
"""
from __future__ import annotations
from tinychad.dtype import dtypes
from tinychad.ops import BinaryOps
from tinychad.codegen.uops import Program, UOp, UOps

TILE_K = 16              # reduce steps staged per copy
TILE_COLUMNS = 16        # work-items of a group along the inner output loop (dimension 0)
TILE_WORK_ITEMS = 128    # work-items of a group in all (gpu.py's MAX_WORK_GROUP)
LOCAL_TILE_MIN_OUTPUTS = 64   # fewer work-items than this: the copies cost more than the reuse gives


def _affine(u: UOp, variables: set[int]) -> dict | None:
  """u's value as {id(variable) or None (the constant): coefficient}, or None where it isn't affine."""
  if u.op is UOps.CONST: return {None: u.arg} if isinstance(u.arg, int) else None
  if id(u) in variables: return {id(u): 1}
  if u.op is not UOps.ALU or u.arg not in (BinaryOps.ADD, BinaryOps.MUL): return None
  a, b = _affine(u.srcs[0], variables), _affine(u.srcs[1], variables)
  if a is None or b is None: return None
  if u.arg is BinaryOps.ADD: return {k: a.get(k, 0) + b.get(k, 0) for k in a.keys() | b.keys()}
  if set(a) <= {None}: a, b = b, a
  if not set(b) <= {None}: return None           # a product of two variables
  return {k: v * b.get(None, 0) for k, v in a.items()}


def local_tile(program: Program, loops: list[UOp]) -> Program | None:
  """`program` tiled through work-group memory (see the module docstring), or None where it doesn't qualify;
  `loops` are its perfectly nested output loops, outermost first (gpu.py's _mapped_loops)."""
  uops = program.uops
  reduces = [u for u in uops if u.op is UOps.RANGE and u not in loops]
  if not 2 <= len(loops) <= 3 or len(reduces) != 1 or reduces[0].arg[1] < TILE_K: return None
  outer, row, col = ([None] + loops)[-3:]
  reduce = reduces[0]
  start, end = uops.index(reduce), next(i for i, u in enumerate(uops) if u.op is UOps.ENDRANGE and u.srcs[0] is reduce)
  body = uops[start + 1:end]
  if any(u.op is UOps.LOAD for u in uops[:start]) or any(u.op in (UOps.RANGE, UOps.IF) for u in body): return None
  rows, cols, steps = row.arg[1], col.arg[1], reduce.arg[1]
  if rows * cols < LOCAL_TILE_MIN_OUTPUTS: return None
  variables = {id(u) for u in loops} | {id(reduce)}
  staged = []       # (load, affine index, "A" (no column term) or "B" (no row term))
  for u in body:
    if u.op is not UOps.LOAD: continue
    form = _affine(u.srcs[1], variables) if len(u.srcs) == 2 and u.srcs[0].op is UOps.DEFINE_GLOBAL else None
    if form is None or u.dtype == dtypes.bool: return None
    along_row, along_col = form.get(id(row), 0) != 0, form.get(id(col), 0) != 0
    if along_row and along_col: return None
    if along_row or along_col: staged.append((u, form, "A" if along_row else "B"))
  if not {kind for _, _, kind in staged} == {"A", "B"}: return None

  idx = reduce.dtype
  local_cols = min(TILE_COLUMNS, cols)
  local_rows = min(1 << ((TILE_WORK_ITEMS // local_cols).bit_length() - 1), rows)   # a power of two
  threads = local_cols * local_rows
  out: list[UOp] = []

  def new(op: UOps, dtype, srcs=(), arg=None, vec: int = 1) -> UOp:
    out.append(u := UOp(op, dtype, srcs, arg, vec))
    return u

  def const(value: int) -> UOp: return new(UOps.CONST, idx, (), value)

  def alu(op: BinaryOps, a: UOp, b: UOp | int, dtype=None) -> UOp:
    return new(UOps.ALU, dtype or idx, (a, const(b) if isinstance(b, int) else b), op)

  def affine_index(form: dict, values: dict) -> UOp:
    """The index `form` gives with its variables at `values` (id -> UOp)."""
    total = const(form.get(None, 0))
    for key, coefficient in form.items():
      if key is not None and coefficient:
        total = alu(BinaryOps.ADD, total, alu(BinaryOps.MUL, values[key], coefficient))
    return total

  tops = [u for u in uops if u.op is UOps.DEFINE_GLOBAL]
  lid_col = new(UOps.SPECIAL, idx, (), ("lidx0", "local", 0))
  lid_row = new(UOps.SPECIAL, idx, (), ("lidx1", "local", 1))
  gid_col = new(UOps.SPECIAL, idx, (), ("gidx_col", "group", 0))
  gid_row = new(UOps.SPECIAL, idx, (), ("gidx_row", "group", 1))
  flat = alu(BinaryOps.ADD, alu(BinaryOps.MUL, lid_row, local_cols), lid_col)
  col_first, row_first = alu(BinaryOps.MUL, gid_col, local_cols), alu(BinaryOps.MUL, gid_row, local_rows)
  # the output loops become the work-item's row and column (the loop UOps themselves, so their users follow)
  col.op, col.srcs, col.arg = UOps.ALU, (col_first, lid_col), BinaryOps.ADD
  row.op, row.srcs, row.arg = UOps.ALU, (row_first, lid_row), BinaryOps.ADD
  out += [row, col]
  batch = outer.arg[1] if outer is not None else 1
  if outer is not None: outer.op, outer.arg = UOps.SPECIAL, (outer.arg[0], "group", 2)
  prologue = [u for u in uops[:start] if u.op is not UOps.DEFINE_GLOBAL and u not in loops]
  out += ([outer] if outer is not None else []) + prologue
  step = new(UOps.RANGE, idx, (), (reduce.arg[0] + "_tile", -(-steps // TILE_K), False, 1))
  step_first = alu(BinaryOps.MUL, step, TILE_K)
  shared = {}
  for load, form, kind in staged:
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
    values = {id(row if kind == "A" else col): at_out, id(reduce): at_step}
    if outer is not None: values[id(outer)] = outer
    where = affine_index(form, values)
    if lane is not None: where = alu(BinaryOps.ADD, where, lane)
    value = new(UOps.LOAD, load.dtype, (load.srcs[0], where, valid))
    new(UOps.STORE, None, (array, element, value))
    if inside is not None: new(UOps.ENDIF, None)
    new(UOps.ENDRANGE, None, (copy,))
  new(UOps.BARRIER, None)
  inner = new(UOps.RANGE, idx, (), (reduce.arg[0] + "_in", TILE_K, False, 1))
  reduce.op, reduce.srcs, reduce.arg = UOps.ALU, (step_first, inner), BinaryOps.ADD
  out.append(reduce)
  if steps % TILE_K: new(UOps.IF, None, (alu(BinaryOps.CMPLT, reduce, steps, dtypes.bool),))
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


def _live(uops: list[UOp]) -> list[UOp]:
  """uops without the index arithmetic nothing reads any more (the staged loads' old global indices)."""
  used: set[int] = set()
  for u in reversed(uops):
    if u.op in (UOps.ALU, UOps.CONST) and id(u) not in used: continue
    used.update(id(s) for s in u.srcs)
  return [u for u in uops if u.op not in (UOps.ALU, UOps.CONST) or id(u) in used]
