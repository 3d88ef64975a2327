"""Lowering a flash-attention kernel: scores, softmax and the weighted sum of values in one loop nest.

in: an ATTENTION kernel node (engine/schedule.py makes one per LoadOps.ATTENTION base); its arg, an
    ops.AttentionArg, says which of the four kernels it is and how its buffers are laid out
out: a Program in uops.py's IR. The forward pass, per tile of query rows of one head (split across threads):
    m = -inf, l = 0, acc[E] = 0                                   (per row of the tile)
    for each block of keys the tile can see (causal and window tiles skip the blocks none of its rows sees):
      s = (q . k_j) * scale * log2(e) (+ mask), one key per SIMD lane, a few vectors of keys per block;
          -inf where the key is hidden (mask, causal, window, padding)
      m' = max(m, max(s)); c = exp2(m - m'); p = exp2(s - m')
      l = l * c + p (per lane); acc = acc * c + sum over the block's keys of p_j * v_j; m = m'
    o = acc / sum(l) (0 for a row that sees no key, as PyTorch); lse2 = m + log2(sum(l))
  So no score matrix exists anywhere: a block's scores, max and sum live in registers. The keys are read
  transposed (kT: (D, S)), so a block's scores are D vector multiply-adds, no horizontal sums; each key vector
  loaded serves every row of the tile, and each row of v every row of the tile.
  The gradients recompute the scores block by block from lse2 (p = exp2(s - lse2)), never store them:
    dq (per tile of query rows):  ds = p * (do . v_j - delta); dq += ds * k_j; dq *= scale
    dkv (per tile of key rows, over the query heads that share it): dv += p * do_i; dk += ds * q_i; dk *= scale
    dmask (per query row, only for a float mask that needs a gradient): the scores' gradient ds itself.
"""
from __future__ import annotations
import math
from typing import Any
from tinychad.dtype import DType, dtypes
from tinychad.ops import RESULT_DTYPE, AttentionArg, BinaryOps, KernelNode, TernaryOps, UnaryOps
from tinychad.codegen.uops import Program, UOp, UOps

# how many times the compiler repeats the body of a dot product's or a weighted sum's loop
UNROLL = 4
# rows (queries; keys for dkv) per step of the parallel loop: each key (query) vector loaded serves them all. Their
# accumulators stay in the 32 AVX-512 registers: 4 rows x 4 vectors of the output; dkv has two outputs per row
TILE_ROWS = {"forward": 4, "dq": 4, "dmask": 1, "dkv": 4}


def _width(n: int, lanes: int) -> int:
  """The widest SIMD vector, at most `lanes`, that tiles a row of n elements."""
  while n % lanes: lanes //= 2
  return lanes


class _Kernel:
  """UOps in program order, and the few idioms the four kernels share."""
  def __init__(self, arg: AttentionArg, dtype: DType):
    self.a, self.dtype, self.lanes = arg, dtype, arg.lanes
    self.uops: list[UOp] = []
    self.loops = 0
    # the largest element number any buffer is read or written at: a mask and dmask's output are score-sized
    L_p, S_p, width = _pad(arg.length, arg.block), _pad(arg.source, arg.block), max(arg.dim, arg.vdim) + 1
    largest = arg.batch * (arg.heads * L_p * width + arg.kv_heads * S_p * 2 * width)
    if arg.mask or arg.mode == "dmask": largest = max(largest, arg.batch * arg.heads * L_p * S_p)
    self.idx = dtypes.int32 if largest < 2 ** 31 else dtypes.int64

  def emit(self, op: UOps, dtype: DType | None, srcs: tuple[UOp, ...] = (), arg: Any = None, vec: int = 1) -> UOp:
    uop = UOp(op, dtype, srcs, arg, vec, len(self.uops))
    self.uops.append(uop)
    return uop

  def const(self, value: Any, dtype: DType | None = None, vec: int = 1) -> UOp:
    dtype = dtype or self.idx
    return self.emit(UOps.CONST, dtype, (), dtype.np(value).item(), vec)

  def alu(self, op: Any, *srcs: UOp, dtype: DType | None = None) -> UOp:
    """op over the sources, as wide as the widest; of their dtype (a WHERE's values'), bool for a comparison."""
    if dtype is None:
      rule = RESULT_DTYPE.get(op)
      dtype = srcs[0].dtype if rule is None else rule(srcs, None)
    return self.emit(UOps.ALU, dtype, srcs, op, max(s.vec for s in srcs))

  # index arithmetic (ints are constants)
  def _i(self, x: UOp | int) -> UOp: return self.const(x) if isinstance(x, int) else x
  def add(self, a: UOp | int, b: UOp | int) -> UOp:
    if isinstance(b, int) and b == 0: return self._i(a)
    return self.alu(BinaryOps.ADD, self._i(a), self._i(b))
  def mul(self, a: UOp, b: int) -> UOp: return a if b == 1 else self.alu(BinaryOps.MUL, a, self.const(b))
  def div(self, a: UOp, b: int) -> UOp: return a if b == 1 else self.alu(BinaryOps.DIV, a, self.const(b))
  def mod(self, a: UOp, b: int) -> UOp: return self.const(0) if b == 1 else self.alu(BinaryOps.MOD, a, self.const(b))
  def less(self, a: UOp | int, b: UOp | int) -> UOp: return self.alu(BinaryOps.CMPLT, self._i(a), self._i(b))
  def minimum(self, a: UOp, b: UOp | int) -> UOp:
    return self.alu(TernaryOps.WHERE, self.less(a, b), a, self._i(b))
  def maximum(self, a: UOp, b: UOp | int) -> UOp: return self.alu(BinaryOps.MAX, a, self._i(b))

  def load(self, buf: UOp, index: UOp, vec: int = 1) -> UOp: return self.emit(UOps.LOAD, buf.dtype, (buf, index), vec=vec)
  def fconst(self, value: float) -> UOp: return self.const(value, self.dtype)

  def lane(self, x: UOp, i: int) -> UOp: return x if x.vec == 1 else self.emit(UOps.GEP, x.dtype, (x,), i)

  def across(self, op: BinaryOps, x: UOp) -> UOp:
    """op over x's lanes (a tree, so the steps don't wait on each other)."""
    return _tree(self, op, [self.lane(x, i) for i in range(x.vec)])

  def loop(self, name: str, extent: int, lo: UOp | None = None, hi: UOp | None = None, parallel: bool = False,
           unroll: int = 1) -> UOp:
    """A loop over [0, extent), or over [lo, hi) (both within it) when they are given."""
    srcs = () if lo is None else (lo, hi)
    return self.emit(UOps.RANGE, self.idx, srcs, (name, extent, parallel, min(unroll, extent)))

  def end(self, loop: UOp) -> None: self.emit(UOps.ENDRANGE, None, (loop,))
  def acc(self, value: float, vec: int) -> UOp: return self.emit(UOps.DEFINE_ACC, self.dtype, (), value, vec)
  def assign(self, acc: UOp, value: UOp) -> None: self.emit(UOps.ASSIGN, None, (acc, value), vec=acc.vec)

  def dots(self, rows: list[UOp], row_buf: UOp, cols: UOp, cols_at: list[UOp], depth: int, stride: int) -> list[list[UOp]]:
    """out[r][v] = sum over d < depth of row_buf[rows[r] + d] * cols[cols_at[v] + d * stride + lane]: the scores of
    a tile of rows against a block of vectors (accumulators, read after the loop), each column vector loaded once
    for all the rows."""
    out = [[self.acc(0.0, self.lanes) for _ in cols_at] for _ in rows]
    d = self.loop(self.name("d"), depth, unroll=UNROLL)
    col = [self.load(cols, self.add(at, self.mul(d, stride)), self.lanes) for at in cols_at]
    for r, row in enumerate(rows):
      x = self.load(row_buf, self.add(row, d))
      for v, c in enumerate(col): self.assign(out[r][v], self.alu(BinaryOps.ADD, out[r][v], self.alu(BinaryOps.MUL, c, x)))
    self.end(d)
    return out

  def weighted(self, accs: list[list[UOp]], weights: list[list[UOp]], rows: UOp, rows_at: UOp, width: int) -> None:
    """accs[r][c] += sum over the block's lanes n of weights[r][n // lanes][n % lanes] * rows[rows_at + n * width + c * w]:
    each tile row's weighted sum of a block of `width`-wide rows (as len(accs[r]) vectors of w lanes). Each block row
    is loaded once for the whole tile; the weights go through a scratch array, as a weight read from memory is a
    broadcast load that the multiply-add can take as its operand."""
    w, per_row = width // len(accs[0]), len(weights[0]) * self.lanes
    for r, row in enumerate(weights):
      for v, x in enumerate(row): self.emit(UOps.STORE, None, (self.scratch, self.const(r * per_row + v * self.lanes), x))
    n = self.loop(self.name("n"), per_row, unroll=UNROLL)
    block_row = [self.load(rows, self.add(self.add(rows_at, self.mul(n, width)), c * w), w) for c in range(len(accs[0]))]
    for r in range(len(accs)):
      weight = self.load(self.scratch, self.add(n, r * per_row))
      for acc, y in zip(accs[r], block_row):
        self.assign(acc, self.alu(BinaryOps.ADD, acc, self.alu(BinaryOps.MUL, y, weight)))
    self.end(n)

  def name(self, prefix: str) -> str:
    self.loops += 1
    return f"{prefix}{self.loops}"

  def lane_ids(self, first: UOp) -> UOp:
    """first + 0, 1, ..., lanes-1 as an index vector."""
    if self.lanes == 1: return first
    ids = self.emit(UOps.VECTORIZE, self.idx, tuple(self.const(i) for i in range(self.lanes)), vec=self.lanes)
    return self.alu(BinaryOps.ADD, ids, first)


def _pad(n: int, lanes: int) -> int: return -(-n // lanes) * lanes


def _tree(k: _Kernel, op: BinaryOps, values: list[UOp | None]) -> UOp:
  values = [v for v in values if v is not None]
  while len(values) > 1:
    values = [k.alu(op, values[i], values[i + 1]) if i + 1 < len(values) else values[i] for i in range(0, len(values), 2)]
  return values[0]


def _scores(k: _Kernel, s: UOp, row: UOp, lane0: UOp, mask: UOp | None, mask_at: UOp | None) -> UOp:
  """Base-2 scores `s` (one per lane) with the mask applied: hidden keys get -inf. `row` is the query
  (or, in dkv, the key) of this row, lane0 the first key (query) of the lane block."""
  a, lanes = k.a, k.lanes
  hidden_by: list[UOp] = []
  ragged = (a.length if a.mode == "dkv" else a.source) % a.block != 0
  if a.causal or a.window or ragged:
    ids = k.lane_ids(lane0)
    queries, keys = (ids, row) if a.mode == "dkv" else (row, ids)
    if a.causal or a.window: hidden_by.append(k.less(queries, keys))                          # j <= i
    if a.window: hidden_by.append(k.less(k.add(keys, a.window - 1), queries))                 # i - window < j
    if ragged: hidden_by.append(k.less((a.length if a.mode == "dkv" else a.source) - 1, ids))   # padding
  if mask is not None:
    lane_stride = a.mask_strides[3]
    value = k.load(mask, k.add(mask_at, lane0) if lane_stride else mask_at, lanes if lane_stride else 1)
    if a.mask == "bool": s = k.alu(TernaryOps.WHERE, value, s, k.fconst(-math.inf))
    else: s = k.alu(BinaryOps.ADD, s, k.alu(BinaryOps.MUL, value, k.fconst(1 / math.log(2))))
  if not hidden_by: return s
  return k.alu(TernaryOps.WHERE, _tree(k, BinaryOps.OR, hidden_by), k.fconst(-math.inf), s)


def _key_blocks(k: _Kernel, first: UOp, last: UOp, blocks: int) -> UOp:
  """The loop over the key blocks that query rows first..last see (all of them without causal or window)."""
  a, size = k.a, k.a.block
  if not (a.causal or a.window) or a.mode == "dmask": return k.loop("kblock", blocks)
  hi = k.minimum(k.add(last, 1), a.source)
  lo = k.maximum(k.add(first, 1 - a.window), 0) if a.window else k.const(0)
  return k.loop("kblock", blocks, k.div(lo, size), k.div(k.add(hi, size - 1), size))


def _query_blocks(k: _Kernel, first: UOp, last: UOp, blocks: int) -> UOp:
  """The loop over the query blocks that see key rows first..last."""
  a, size = k.a, k.a.block
  if not (a.causal or a.window): return k.loop("qblock", blocks)
  hi = k.minimum(k.add(last, a.window), a.length) if a.window else k.const(a.length)
  return k.loop("qblock", blocks, k.div(first, size), k.div(k.add(hi, size - 1), size))


def lower_attention(node: KernelNode, name: str) -> Program:
  a: AttentionArg = node.arg
  k = _Kernel(a, node.dtype)
  out = k.emit(UOps.DEFINE_GLOBAL, node.dtype, (), (0, True))
  names = {"forward": ("q", "kT", "v"), "dq": ("q", "kT", "k", "vT", "do", "lse2", "delta"),
           "dkv": ("k", "v", "qT", "q", "doT", "do", "lse2", "delta")}[a.mode if a.mode != "dmask" else "dq"]
  if a.mask: names += ("mask",)
  bufs = {n: k.emit(UOps.DEFINE_GLOBAL, dtypes.bool if n == "mask" and a.mask == "bool" else node.dtype, (), (i + 1, False))
          for i, n in enumerate(names)}
  tile = 1 if k.lanes == 1 else TILE_ROWS[a.mode]
  k.scratch = k.emit(UOps.DEFINE_LOCAL, node.dtype, (), tile * a.block)
  if a.mode == "dkv": steps = _lower_dkv(k, out, bufs, tile)
  else: steps = _lower_query_rows(k, out, bufs, tile)
  return Program(name, k.uops, [out] + list(bufs.values()), parallel=steps, contract=True)


def _tile(k: _Kernel, step: UOp, length: int, tile: int) -> tuple[UOp, UOp, list[UOp]]:
  """(row, its (batch, head) number, the tile's rows) of a parallel step over tiles of `tile` rows of `length`: a
  tile never spans two heads, and the rows past the last (a ragged last tile) repeat it, computing and storing
  the same values again, so no row needs padding."""
  per_head = -(-length // tile)
  head, first = k.div(step, per_head), k.mul(k.mod(step, per_head), tile)
  rows = [k.minimum(k.add(first, t), length - 1) if length % tile else k.add(first, t) for t in range(tile)]
  return first, head, rows


def _lower_query_rows(k: _Kernel, out: UOp, bufs: dict[str, UOp], tile: int) -> int:
  """The forward, dq and dmask kernels: a tile of query rows of one head per step of the parallel loop."""
  a, lanes, size = k.a, k.lanes, k.a.block
  L, S, D, E, H = a.length, a.source, a.dim, a.vdim, a.heads
  S_p, L_p, group = _pad(S, size), _pad(L, size), H // a.kv_heads
  steps = a.batch * H * -(-L // tile)
  step = k.loop("gidx0", steps, parallel=True)
  first, bh, queries = _tile(k, step, L, tile)
  rows = [k.add(k.mul(bh, L), i) for i in queries]                 # (batch, head, query) numbers
  h, b = k.mod(bh, H), k.div(bh, H)
  kv = k.add(k.mul(b, a.kv_heads), k.div(h, group))
  mb, mh, mr, _ = a.mask_strides
  masks_at = [k.add(k.add(k.mul(b, mb), k.mul(h, mh)), k.mul(i, mr)) for i in queries] if a.mask else [None] * tile
  width = _width(E if a.mode == "forward" else D, lanes)
  accs = [[k.acc(0.0, width) for _ in range((E if a.mode == "forward" else D) // width)] for _ in rows] \
    if a.mode != "dmask" else []
  if a.mode == "forward": m, l = [k.acc(-math.inf, 1) for _ in rows], [k.acc(0.0, lanes) for _ in rows]
  else:
    stats = [k.add(k.mul(bh, L_p), i) for i in queries]
    lse2, delta = [k.load(bufs["lse2"], at) for at in stats], [k.load(bufs["delta"], at) for at in stats]
  block = _key_blocks(k, first, queries[-1], S_p // size)
  starts = [k.add(k.mul(block, size), v * lanes) for v in range(size // lanes)]   # each vector's first key
  kT_at = k.mul(kv, D * S_p)
  dots = k.dots([k.mul(r, D) for r in rows], bufs["q"], bufs["kT"], [k.add(kT_at, j0) for j0 in starts], D, S_p)
  scores = [[_scores(k, k.alu(BinaryOps.MUL, s, k.fconst(a.scale / math.log(2))), i, j0, bufs.get("mask"), at)
             for s, j0 in zip(row, starts)] for row, i, at in zip(dots, queries, masks_at)]
  if a.mode == "forward":
    weights = []
    for t in range(tile):
      m_new = k.alu(BinaryOps.MAX, m[t], k.across(BinaryOps.MAX, _tree(k, BinaryOps.MAX, scores[t])))
      # a row that has seen no key yet keeps m = -inf: shift by 0 there, so exp2 gives 0, not exp2(-inf + inf)
      shift = k.alu(TernaryOps.WHERE, k.alu(BinaryOps.CMPEQ, m_new, k.fconst(-math.inf)), k.fconst(0.0), m_new)
      correction = k.alu(UnaryOps.EXP2, k.alu(BinaryOps.SUB, m[t], shift))
      weights.append([k.alu(UnaryOps.EXP2, k.alu(BinaryOps.SUB, s, shift)) for s in scores[t]])
      for acc in accs[t]: k.assign(acc, k.alu(BinaryOps.MUL, acc, correction))
      k.assign(l[t], _tree(k, BinaryOps.ADD, [k.alu(BinaryOps.MUL, l[t], correction)] + weights[t]))
      k.assign(m[t], m_new)
    k.weighted(accs, weights, bufs["v"], k.add(k.mul(kv, S_p * E), k.mul(starts[0], E)), E)
    k.end(block)
    for t, row in enumerate(rows):
      total = k.across(BinaryOps.ADD, l[t])
      empty = k.alu(BinaryOps.CMPEQ, total, k.fconst(0.0))
      inverse = k.alu(TernaryOps.WHERE, empty, k.fconst(0.0), k.alu(UnaryOps.RECIP, total))
      for c, acc in enumerate(accs[t]):
        k.emit(UOps.STORE, None, (out, k.add(k.mul(row, E), c * width), k.alu(BinaryOps.MUL, acc, inverse)))
      lse = k.alu(TernaryOps.WHERE, empty, k.fconst(math.inf), k.alu(BinaryOps.ADD, m[t], k.alu(UnaryOps.LOG2, total)))
      k.emit(UOps.STORE, None, (out, k.add(row, a.batch * H * L * E), lse))
  else:
    vT_at = [k.add(k.mul(kv, E * S_p), j0) for j0 in starts]
    dps = k.dots([k.mul(r, E) for r in rows], bufs["do"], bufs["vT"], vT_at, E, S_p)
    ds = [[k.alu(BinaryOps.MUL, k.alu(UnaryOps.EXP2, k.alu(BinaryOps.SUB, s, lse2[t])), k.alu(BinaryOps.SUB, dp, delta[t]))
           for s, dp in zip(scores[t], dps[t])] for t in range(tile)]
    if a.mode == "dmask":
      for t, row in enumerate(rows):
        for j0, x in zip(starts, ds[t]): k.emit(UOps.STORE, None, (out, k.add(k.mul(row, S_p), j0), x))
      k.end(block)
    else:
      k.weighted(accs, ds, bufs["k"], k.add(k.mul(kv, S_p * D), k.mul(starts[0], D)), D)
      k.end(block)
      for t, row in enumerate(rows):
        for c, acc in enumerate(accs[t]):
          k.emit(UOps.STORE, None, (out, k.add(k.mul(row, D), c * width), k.alu(BinaryOps.MUL, acc, k.fconst(a.scale))))
  k.end(step)
  return steps


def _lower_dkv(k: _Kernel, out: UOp, bufs: dict[str, UOp], tile: int) -> int:
  """The key and value gradients: a tile of key rows of one kv head per step of the parallel loop, summed over the
  query heads that share it, the query blocks that see it running along the lanes."""
  a, lanes, size = k.a, k.lanes, k.a.block
  L, S, D, E, H, Hk = a.length, a.source, a.dim, a.vdim, a.heads, a.kv_heads
  L_p, group = _pad(L, size), H // Hk
  steps = a.batch * Hk * -(-S // tile)
  step = k.loop("gidx0", steps, parallel=True)
  first, bk, keys = _tile(k, step, S, tile)
  rows = [k.add(k.mul(bk, S), j) for j in keys]
  kv_head, b = k.mod(bk, Hk), k.div(bk, Hk)
  wd, we = _width(D, lanes), _width(E, lanes)
  dk = [[k.acc(0.0, wd) for _ in range(D // wd)] for _ in rows]
  dv = [[k.acc(0.0, we) for _ in range(E // we)] for _ in rows]
  g = k.loop("group", group) if group > 1 else k.const(0)
  h = k.add(k.mul(kv_head, group), g)
  bh = k.add(k.mul(b, H), h)
  mb, mh, mr, _ = a.mask_strides
  masks_at = [k.add(k.add(k.mul(b, mb), k.mul(h, mh)), k.mul(j, mr)) for j in keys] if a.mask else [None] * tile
  block = _query_blocks(k, first, keys[-1], L_p // size)
  starts = [k.add(k.mul(block, size), v * lanes) for v in range(size // lanes)]
  dots = k.dots([k.mul(r, D) for r in rows], bufs["k"], bufs["qT"], [k.add(k.mul(bh, D * L_p), i0) for i0 in starts], D, L_p)
  dps = k.dots([k.mul(r, E) for r in rows], bufs["v"], bufs["doT"], [k.add(k.mul(bh, E * L_p), i0) for i0 in starts], E, L_p)
  stats = [k.add(k.mul(bh, L_p), i0) for i0 in starts]
  lse2, delta = [k.load(bufs["lse2"], at, lanes) for at in stats], [k.load(bufs["delta"], at, lanes) for at in stats]
  p, ds = [], []
  for t in range(tile):
    s = [_scores(k, k.alu(BinaryOps.MUL, x, k.fconst(a.scale / math.log(2))), keys[t], i0, bufs.get("mask"), masks_at[t])
         for x, i0 in zip(dots[t], starts)]
    p.append([k.alu(UnaryOps.EXP2, k.alu(BinaryOps.SUB, x, y)) for x, y in zip(s, lse2)])
    ds.append([k.alu(BinaryOps.MUL, x, k.alu(BinaryOps.SUB, dp, y)) for x, dp, y in zip(p[t], dps[t], delta)])
  k.weighted(dv, p, bufs["do"], k.add(k.mul(bh, L_p * E), k.mul(starts[0], E)), E)
  k.weighted(dk, ds, bufs["q"], k.add(k.mul(bh, L_p * D), k.mul(starts[0], D)), D)
  k.end(block)
  if group > 1: k.end(g)
  total_rows = a.batch * Hk * S
  for t, row in enumerate(rows):
    for accs, width, at, scale in ((dk[t], D, 0, a.scale), (dv[t], E, total_rows * D, 1.0)):
      w = accs[0].vec
      for c, acc in enumerate(accs):
        value = k.alu(BinaryOps.MUL, acc, k.fconst(scale)) if scale != 1.0 else acc
        k.emit(UOps.STORE, None, (out, k.add(k.add(k.mul(row, width), at), c * w), value))
  k.end(step)
  return steps
