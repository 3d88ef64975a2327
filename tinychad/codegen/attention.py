"""Lowering a flash-attention kernel: scores, softmax and the weighted sum of values in one loop nest.

in: an ATTENTION kernel node (engine/schedule.py makes one per LoadOps.ATTENTION base); its arg, an
    ops.AttentionArg, says which of the four kernels it is and how its buffers are laid out
out: a Program in uops.py's IR. The forward pass, per query row (split across threads):
    m = -inf, l = 0, acc[E] = 0
    for each block of `lanes` keys the row can see (causal and window rows skip the blocks they can't):
      s = (q . k_j) * scale * log2(e) (+ mask), one key per SIMD lane; -inf where the key is hidden
      m' = max(m, max(s)); c = exp2(m - m'); p = exp2(s - m')
      l = l * c + p (per lane); acc = acc * c + sum over lanes of p * v_j; m = m'
    o = acc / sum(l) (0 for a row that sees no key, as PyTorch); lse2 = m + log2(sum(l))
  So no score matrix exists anywhere: a row block's scores, max and sum live in registers. The keys
  are read transposed (kT: (D, S)), so a block's scores are D vector multiply-adds, no horizontal sums.
  The gradients recompute the scores block by block from lse2 (p = exp2(s - lse2)), never store them:
    dq (per query row):  ds = p * (do . v_j - delta); dq += ds * k_j; dq *= scale
    dkv (per key row, over the query heads that share it): dv += p * do_i; dk += ds * q_i; dk *= scale
    dmask (per query row, only for a float mask that needs a gradient): the scores' gradient ds itself.
A long dot product or lane sum is split into a few partial sums, so that the multiply-adds don't wait
on each other's latency.
"""
from __future__ import annotations
import math
from typing import Any
from tinychad.dtype import DType, dtypes
from tinychad.ops import COMPARISONS, AttentionArg, BinaryOps, KernelNode, TernaryOps, UnaryOps
from tinychad.codegen.uops import Program, UOp, UOps

# independent multiply-add chains a dot product or lane sum is split into (FMA latency x issue width)
PARTIAL_SUMS = 8


def _width(n: int, lanes: int) -> int:
  """The widest SIMD vector, at most `lanes`, that tiles a row of n elements."""
  while n % lanes: lanes //= 2
  return lanes


class _Kernel:
  """UOps in program order, and the few idioms the four kernels share."""
  def __init__(self, arg: AttentionArg, dtype: DType):
    self.a, self.dtype, self.lanes = arg, dtype, arg.lanes
    self.uops: list[UOp] = []
    sizes = [arg.batch * max(arg.heads, 1) * _pad(max(arg.length, arg.source), arg.lanes) * max(arg.dim, arg.vdim, 1) * 2]
    self.idx = dtypes.int32 if max(sizes) < 2 ** 31 else dtypes.int64

  def emit(self, op: UOps, dtype: DType | None, srcs: tuple[UOp, ...] = (), arg: Any = None, vec: int = 1) -> UOp:
    uop = UOp(op, dtype, srcs, arg, vec, len(self.uops))
    self.uops.append(uop)
    return uop

  def const(self, value: Any, dtype: DType | None = None, vec: int = 1) -> UOp:
    dtype = dtype or self.idx
    return self.emit(UOps.CONST, dtype, (), dtype.np(value).item(), vec)

  def alu(self, op: Any, *srcs: UOp, dtype: DType | None = None) -> UOp:
    """op over the sources, as wide as the widest; of their dtype (a WHERE's values'), bool for a comparison."""
    if dtype is None: dtype = dtypes.bool if op in COMPARISONS else srcs[1].dtype if op is TernaryOps.WHERE else srcs[0].dtype
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

  def loop(self, name: str, extent: int, lo: UOp | None = None, hi: UOp | None = None, parallel: bool = False) -> UOp:
    """A loop over [0, extent), or over [lo, hi) (both within it) when they are given."""
    srcs = () if lo is None else (lo, hi)
    return self.emit(UOps.RANGE, self.idx, srcs, (name, extent, parallel, 1))

  def end(self, loop: UOp) -> None: self.emit(UOps.ENDRANGE, None, (loop,))
  def acc(self, value: float, vec: int) -> UOp: return self.emit(UOps.DEFINE_ACC, self.dtype, (), value, vec)
  def assign(self, acc: UOp, value: UOp) -> None: self.emit(UOps.ASSIGN, None, (acc, value), vec=acc.vec)

  def dot(self, row: UOp, row_at: UOp, cols: UOp, cols_at: UOp, depth: int, stride: int) -> UOp:
    """sum over d < depth of row[row_at + d] * cols[cols_at + d * stride + lane]: one value per lane."""
    partial: list[UOp | None] = [None] * min(depth, PARTIAL_SUMS)
    for d in range(depth):
      term = self.alu(BinaryOps.MUL, self.load(cols, self.add(cols_at, d * stride), self.lanes), self.load(row, self.add(row_at, d)))
      at = d % len(partial)
      partial[at] = term if partial[at] is None else self.alu(BinaryOps.ADD, partial[at], term)
    return _tree(self, BinaryOps.ADD, partial)

  def weighted_rows(self, accs: list[UOp], weights: UOp, rows: UOp, rows_at: UOp, width: int) -> list[UOp]:
    """accs[c] + sum over lanes l of weights[l] * rows[rows_at + l * width + c * w]: the weighted sum of a
    block of `lanes` rows, each `width` wide, as len(accs) vectors of w = width // len(accs) lanes."""
    w = width // len(accs)
    splits = max(1, min(weights.vec, PARTIAL_SUMS // len(accs)))
    parts: list[list[UOp]] = [[acc] for acc in accs]
    for lane in range(weights.vec):
      weight = self.lane(weights, lane)
      for c, part in enumerate(parts):
        term = self.alu(BinaryOps.MUL, self.load(rows, self.add(rows_at, lane * width + c * w), w), weight)
        at = lane % splits + 1
        if at < len(part): part[at] = self.alu(BinaryOps.ADD, part[at], term)
        else: part.append(term)
    return [_tree(self, BinaryOps.ADD, part) for part in parts]

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
  ragged = (a.length if a.mode == "dkv" else a.source) % lanes != 0
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


def _key_blocks(k: _Kernel, query: UOp, blocks: int) -> UOp:
  """The loop over the key blocks query row `query` sees (all of them without causal or window)."""
  a, lanes = k.a, k.lanes
  if not (a.causal or a.window) or a.mode == "dmask": return k.loop("kblock", blocks)
  hi = k.minimum(k.add(query, 1), a.source)
  lo = k.maximum(k.add(query, 1 - a.window), 0) if a.window else k.const(0)
  return k.loop("kblock", blocks, k.div(lo, lanes), k.div(k.add(hi, lanes - 1), lanes))


def _query_blocks(k: _Kernel, key: UOp, blocks: int) -> UOp:
  """The loop over the query blocks that see key `key`."""
  a, lanes = k.a, k.lanes
  if not (a.causal or a.window): return k.loop("qblock", blocks)
  hi = k.minimum(k.add(key, a.window), a.length) if a.window else k.const(a.length)
  return k.loop("qblock", blocks, k.div(key, lanes), k.div(k.add(hi, lanes - 1), lanes))


def lower_attention(node: KernelNode, name: str) -> Program:
  a: AttentionArg = node.arg
  k = _Kernel(a, node.dtype)
  out = k.emit(UOps.DEFINE_GLOBAL, node.dtype, (), (0, True))
  names = {"forward": ("q", "kT", "v"), "dq": ("q", "kT", "k", "vT", "do", "lse2", "delta"),
           "dkv": ("k", "v", "qT", "q", "doT", "do", "lse2", "delta")}[a.mode if a.mode != "dmask" else "dq"]
  if a.mask: names += ("mask",)
  bufs = {n: k.emit(UOps.DEFINE_GLOBAL, dtypes.bool if n == "mask" and a.mask == "bool" else node.dtype, (), (i + 1, False))
          for i, n in enumerate(names)}
  if a.mode == "dkv": rows = _lower_dkv(k, out, bufs)
  else: rows = _lower_query_rows(k, out, bufs)
  return Program(name, k.uops, [out] + list(bufs.values()), parallel=rows, contract=True)


def _lower_query_rows(k: _Kernel, out: UOp, bufs: dict[str, UOp]) -> int:
  """The forward, dq and dmask kernels: one query row per iteration of the parallel loop."""
  a, lanes = k.a, k.lanes
  L, S, D, E, H = a.length, a.source, a.dim, a.vdim, a.heads
  S_p, L_p, rows, group = _pad(S, lanes), _pad(L, lanes), a.batch * H * L, H // a.kv_heads
  r = k.loop("gidx0", rows, parallel=True)
  i, bh = k.mod(r, L), k.div(r, L)
  h, b = k.mod(bh, H), k.div(bh, H)
  kv = k.add(k.mul(b, a.kv_heads), k.div(h, group))
  mb, mh, mr, _ = a.mask_strides
  mask_at = k.add(k.add(k.mul(b, mb), k.mul(h, mh)), k.mul(i, mr)) if a.mask else None
  log2e = 1 / math.log(2)
  q_at, kT_at = k.mul(r, D), k.mul(kv, D * S_p)
  if a.mode == "forward":
    accs = [k.acc(0.0, _width(E, lanes)) for _ in range(E // _width(E, lanes))]
    m, l = k.acc(-math.inf, 1), k.acc(0.0, lanes)
  elif a.mode == "dq":
    accs = [k.acc(0.0, _width(D, lanes)) for _ in range(D // _width(D, lanes))]
  if a.mode != "forward":
    lse2, delta = k.load(bufs["lse2"], k.add(k.mul(bh, L_p), i)), k.load(bufs["delta"], k.add(k.mul(bh, L_p), i))
  block = _key_blocks(k, i, S_p // lanes)
  j0 = k.mul(block, lanes)
  s = k.alu(BinaryOps.MUL, k.dot(bufs["q"], q_at, bufs["kT"], k.add(kT_at, j0), D, S_p), k.fconst(a.scale * log2e))
  s = _scores(k, s, i, j0, bufs.get("mask"), mask_at)
  if a.mode == "forward":
    m_new = k.alu(BinaryOps.MAX, m, k.across(BinaryOps.MAX, s))
    # a row that has seen no key yet keeps m = -inf: shift by 0 there, so exp2 gives 0, not exp2(-inf + inf)
    shift = k.alu(TernaryOps.WHERE, k.alu(BinaryOps.CMPEQ, m_new, k.fconst(-math.inf)), k.fconst(0.0), m_new)
    correction = k.alu(UnaryOps.EXP2, k.alu(BinaryOps.SUB, m, shift))
    p = k.alu(UnaryOps.EXP2, k.alu(BinaryOps.SUB, s, shift))
    v_at = k.add(k.mul(kv, S_p * E), k.mul(j0, E))
    new_accs = k.weighted_rows([k.alu(BinaryOps.MUL, acc, correction) for acc in accs], p, bufs["v"], v_at, E)
    new_l = k.alu(BinaryOps.ADD, k.alu(BinaryOps.MUL, l, correction), p)
    for acc, value in zip(accs, new_accs): k.assign(acc, value)
    k.assign(l, new_l)
    k.assign(m, m_new)
    k.end(block)
    total = k.across(BinaryOps.ADD, l)
    empty = k.alu(BinaryOps.CMPEQ, total, k.fconst(0.0))
    inverse = k.alu(TernaryOps.WHERE, empty, k.fconst(0.0), k.alu(UnaryOps.RECIP, total))
    width = accs[0].vec
    for c, acc in enumerate(accs):
      k.emit(UOps.STORE, None, (out, k.add(k.mul(r, E), c * width), k.alu(BinaryOps.MUL, acc, inverse)))
    lse = k.alu(TernaryOps.WHERE, empty, k.fconst(math.inf), k.alu(BinaryOps.ADD, m, k.alu(UnaryOps.LOG2, total)))
    k.emit(UOps.STORE, None, (out, k.add(r, rows * E), lse))
  else:
    p = k.alu(UnaryOps.EXP2, k.alu(BinaryOps.SUB, s, lse2))
    dp = k.dot(bufs["do"], k.mul(r, E), bufs["vT"], k.add(k.mul(kv, E * S_p), j0), E, S_p)
    ds = k.alu(BinaryOps.MUL, p, k.alu(BinaryOps.SUB, dp, delta))
    if a.mode == "dmask":
      k.emit(UOps.STORE, None, (out, k.add(k.mul(r, S_p), j0), ds))
      k.end(block)
    else:
      new_accs = k.weighted_rows(accs, ds, bufs["k"], k.add(k.mul(kv, S_p * D), k.mul(j0, D)), D)
      for acc, value in zip(accs, new_accs): k.assign(acc, value)
      k.end(block)
      width = accs[0].vec
      for c, acc in enumerate(accs):
        k.emit(UOps.STORE, None, (out, k.add(k.mul(r, D), c * width), k.alu(BinaryOps.MUL, acc, k.fconst(a.scale))))
  k.end(r)
  return rows


def _lower_dkv(k: _Kernel, out: UOp, bufs: dict[str, UOp]) -> int:
  """The key and value gradients: one key row per iteration of the parallel loop, summed over the query
  heads that share its kv head, the query blocks that see it running along the lanes."""
  a, lanes = k.a, k.lanes
  L, S, D, E, H, Hk = a.length, a.source, a.dim, a.vdim, a.heads, a.kv_heads
  L_p, rows, group = _pad(L, lanes), a.batch * Hk * S, H // Hk
  r = k.loop("gidx0", rows, parallel=True)
  j, bk = k.mod(r, S), k.div(r, S)
  kv_head, b = k.mod(bk, Hk), k.div(bk, Hk)
  dk = [k.acc(0.0, _width(D, lanes)) for _ in range(D // _width(D, lanes))]
  dv = [k.acc(0.0, _width(E, lanes)) for _ in range(E // _width(E, lanes))]
  g = k.loop("group", group) if group > 1 else k.const(0)
  h = k.add(k.mul(kv_head, group), g)
  bh = k.add(k.mul(b, H), h)
  mb, mh, mr, _ = a.mask_strides
  mask_at = k.add(k.add(k.mul(b, mb), k.mul(h, mh)), k.mul(j, mr)) if a.mask else None
  block = _query_blocks(k, j, L_p // lanes)
  i0 = k.mul(block, lanes)
  s = k.dot(bufs["k"], k.mul(r, D), bufs["qT"], k.add(k.mul(bh, D * L_p), i0), D, L_p)
  s = _scores(k, k.alu(BinaryOps.MUL, s, k.fconst(a.scale / math.log(2))), j, i0, bufs.get("mask"), mask_at)
  stats_at = k.add(k.mul(bh, L_p), i0)
  p = k.alu(UnaryOps.EXP2, k.alu(BinaryOps.SUB, s, k.load(bufs["lse2"], stats_at, lanes)))
  dp = k.dot(bufs["v"], k.mul(r, E), bufs["doT"], k.add(k.mul(bh, E * L_p), i0), E, L_p)
  ds = k.alu(BinaryOps.MUL, p, k.alu(BinaryOps.SUB, dp, k.load(bufs["delta"], stats_at, lanes)))
  new_dv = k.weighted_rows(dv, p, bufs["do"], k.add(k.mul(bh, L_p * E), k.mul(i0, E)), E)
  new_dk = k.weighted_rows(dk, ds, bufs["q"], k.add(k.mul(bh, L_p * D), k.mul(i0, D)), D)
  for acc, value in zip(dv + dk, new_dv + new_dk): k.assign(acc, value)
  k.end(block)
  if group > 1: k.end(g)
  for accs, width, at, scale in ((dk, D, 0, a.scale), (dv, E, rows * D, 1.0)):
    w = accs[0].vec
    for c, acc in enumerate(accs):
      value = k.alu(BinaryOps.MUL, acc, k.fconst(scale)) if scale != 1.0 else acc
      k.emit(UOps.STORE, None, (out, k.add(k.add(k.mul(r, width), at), c * w), value))
  k.end(r)
  return rows
