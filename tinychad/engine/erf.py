"""erf as primitive kernel nodes: the scheduler expands UnaryOps.ERF into these when it builds a kernel tree.

in: the kernel node of erf's input, and the view its constants are read through  ->  out: the node of erf(x).
The front end records erf as one op (a model's GELU is one node of its lazy graph, not the ~70 of its series:
recording and keying a decoding step's graph cost per node), and each device runs the same series: every
primitive below is one the renderers and the numpy reference already have, so erf is alike on every device.
float64 inputs: in float64, within 3e-13 (relative below |x| 1.5, absolute above). Others: in float32 (float16
and bfloat16 round the result), within 1 ulp as PyTorch's float32 erf (Sleef's u10): 0.857 ulp at most over
every float32.
"""
from __future__ import annotations
import functools
import math
import numpy as np
from tinychad.dtype import DType, dtypes
from tinychad.ops import BinaryOps, BufferOps, KernelNode, TernaryOps, UnaryOps
from tinychad.view import ShapeTracker


def chebyshev_fit(f, lo: float, hi: float, degree: int, nodes: int, mapped: bool = False) -> tuple[float, ...]:
  """A degree `degree` Chebyshev fit of f on `nodes` Chebyshev nodes of [lo, hi] (float64), as a power series in x,
  or with `mapped` in x's place on [-1, 1] (2 (x - lo) / (hi - lo) - 1)."""
  x = (np.cos(np.pi * (np.arange(nodes) + 0.5) / nodes) + 1) * (hi - lo) / 2 + lo
  series = np.polynomial.Chebyshev.fit(x, [f(v) for v in x], degree, domain=[lo, hi])
  coeffs = np.polynomial.chebyshev.cheb2poly(series.coef) if mapped else series.convert(kind=np.polynomial.Polynomial).coef
  return tuple(float(c) for c in coeffs)


# ---- float64: |x| < ERF_SPLIT: x * A(x^2); up to ERF_END: 1 - exp(-x^2) * B(|x|), where erfc(x) * exp(x^2) is
# smooth; beyond, 1 ----
ERF_SPLIT, ERF_END = 1.5, 6.0   # erfc(6) is 2e-17: erf is 1 in float64 beyond


@functools.cache
def erf64_fits() -> tuple[tuple[float, ...], tuple[float, ...]]:
  """Chebyshev fits of math.erf on 2000 Chebyshev nodes (float64): erf(x)/x as a degree 12 power series in
  u = 2 x^2 / ERF_SPLIT^2 - 1, and erfc(x) exp(x^2) on [ERF_SPLIT, ERF_END] as a degree 18 power series in v, its
  interval mapped onto [-1, 1]: both series' coefficients stay below 1 in size, so Horner's rule is stable (the
  second's errors equal Clenshaw's on its Chebyshev form, 1e-11 relative). Max errors 3e-13 and 1e-13 in erf."""
  small = chebyshev_fit(lambda t: math.erf(math.sqrt(t)) / math.sqrt(t), 1e-12, ERF_SPLIT ** 2 + 1e-12, 12, 2000, mapped=True)
  big = chebyshev_fit(lambda v: math.erfc(v) * math.exp(v * v), ERF_SPLIT, ERF_END, 18, 2000, mapped=True)
  return small, big


# ---- float32: three ranges of |x|, up to ERF32_SMALL, up to ERF32_MID, and beyond, where erfc is clipped at
# ERF32_END (erfc(4) = 1.5e-8 is below half an ulp of 1, so erf rounds to 1 from there). The middle series is in
# w = |x| - ERF32_MID_AT and adds ERF32_MID_BASE, the tail's is in v = ERF32_TAIL_AT - min(|x|, ERF32_END) and
# subtracts from 1: both subtractions are exact on their ranges (Sterbenz), and the exact constants are added
# last, so the series round as the small numbers they are ----
ERF32_SMALL, ERF32_MID, ERF32_END = 0.75, 1.5, 4.0
ERF32_MID_AT, ERF32_MID_BASE, ERF32_TAIL_AT = 1.125, 0.875, 2.5


@functools.cache
def erf32_fits() -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
  """Chebyshev fits of math.erf on 3000 Chebyshev nodes (float64), as power series in the variable each is evaluated
  in: erf(x)/x - 1 of degree 5 in t = x^2 on [0, ERF32_SMALL^2], erf(x) - ERF32_MID_BASE of degree 8 in w, erfc(x)
  of degree 12 in v. Their coefficients stay below 0.38 in size, so Horner's rule is stable. The ranges, centres and
  degrees were picked by the max error over every float32 of each range, with and without FMA contraction (<= 0.86
  ulp either way): splitting at 0.5 with w = |x| - 1 reached 0.999 ulp, and 1.06 with FMA."""
  small = chebyshev_fit(lambda t: math.erf(math.sqrt(t)) / math.sqrt(t) - 1, 0, ERF32_SMALL ** 2, 5, 3000)
  mid = chebyshev_fit(lambda w: math.erf(w + ERF32_MID_AT) - ERF32_MID_BASE, ERF32_SMALL - ERF32_MID_AT,
                      ERF32_MID - ERF32_MID_AT, 8, 3000)
  tail = chebyshev_fit(lambda v: math.erfc(ERF32_TAIL_AT - v), ERF32_TAIL_AT - ERF32_END, ERF32_TAIL_AT - ERF32_MID, 12, 3000)
  return small, mid, tail


class _Nodes:
  """Kernel nodes of one dtype, whose constants are read through one view (the erf node's own)."""
  def __init__(self, dtype: DType, const_view: ShapeTracker):
    self.dtype, self.const_view = dtype, const_view

  def c(self, value: float) -> KernelNode:
    return KernelNode(BufferOps.CONST, (), (self.dtype.np(value).item(), self.const_view), self.dtype)
  def add(self, a: KernelNode, b: KernelNode) -> KernelNode: return KernelNode(BinaryOps.ADD, (a, b), None, self.dtype)
  def sub(self, a: KernelNode, b: KernelNode) -> KernelNode: return KernelNode(BinaryOps.SUB, (a, b), None, self.dtype)
  def mul(self, a: KernelNode, b: KernelNode) -> KernelNode: return KernelNode(BinaryOps.MUL, (a, b), None, self.dtype)
  def max(self, a: KernelNode, b: KernelNode) -> KernelNode: return KernelNode(BinaryOps.MAX, (a, b), None, self.dtype)
  def neg(self, a: KernelNode) -> KernelNode: return KernelNode(UnaryOps.NEG, (a,), None, self.dtype)
  def exp(self, a: KernelNode) -> KernelNode:
    return KernelNode(UnaryOps.EXP2, (self.mul(a, self.c(1 / math.log(2))),), None, self.dtype)
  def less(self, a: KernelNode, b: KernelNode) -> KernelNode: return KernelNode(BinaryOps.CMPLT, (a, b), None, dtypes.bool)
  def where(self, cond: KernelNode, a: KernelNode, b: KernelNode) -> KernelNode:
    return KernelNode(TernaryOps.WHERE, (cond, a, b), None, self.dtype)

  def horner(self, coeffs: tuple[float, ...], v: KernelNode) -> KernelNode:
    """sum(coeffs[k] v^k) by Horner's rule, a chain in which each step reads the last once (Clenshaw's recurrence,
    each step reading the last two, is a DAG that costs more registers)."""
    acc = self.add(self.mul(self.c(coeffs[-1]), v), self.c(coeffs[-2]))
    for c in reversed(coeffs[:-2]): acc = self.add(self.mul(acc, v), self.c(c))
    return acc


# kernel nodes are interned, so an erf over the same node is the same tree: a decoding step schedules a GELU per
# layer at every new length (~1 ms each to build), over a handful of distinct inputs
@functools.lru_cache(maxsize=1024)
def erf_node(x: KernelNode, const_view: ShapeTracker) -> KernelNode:
  """erf(x) in primitive nodes, of x's dtype: float64 by its own series, any other float through float32."""
  if x.dtype == dtypes.float64: return _erf64(_Nodes(dtypes.float64, const_view), x)
  if x.dtype == dtypes.float32: return _erf32(_Nodes(dtypes.float32, const_view), x)
  wide = KernelNode(UnaryOps.CAST, (x,), dtypes.float32, dtypes.float32)
  return KernelNode(UnaryOps.CAST, (_erf32(_Nodes(dtypes.float32, const_view), wide),), x.dtype, x.dtype)


def _erf64(n: _Nodes, x: KernelNode) -> KernelNode:
  """Each branch reads its input clipped to its own range, so the branch not taken stays finite; NaN compares false,
  so it takes the small branch, which keeps it."""
  small_coeffs, big_coeffs = erf64_fits()
  square, top = n.mul(x, x), n.c(ERF_SPLIT ** 2)
  u = n.sub(n.mul(n.where(n.less(top, square), top, square), n.c(2 / ERF_SPLIT ** 2)), n.c(1))
  small = n.mul(x, n.horner(small_coeffs, u))
  ax = n.max(x, n.neg(x))
  low, high = n.c(ERF_SPLIT), n.c(ERF_END)
  big_x = n.where(n.less(ax, low), low, ax)
  big_x = n.where(n.less(high, big_x), high, big_x)
  v = n.mul(n.sub(n.mul(big_x, n.c(2)), n.c(ERF_SPLIT + ERF_END)), n.c(1 / (ERF_END - ERF_SPLIT)))
  big = n.sub(n.c(1), n.mul(n.exp(n.neg(n.mul(big_x, big_x))), n.horner(big_coeffs, v)))
  sign = n.where(n.less(x, n.c(0)), n.c(-1), n.c(1))
  return n.where(n.less(low, ax), n.mul(sign, big), small)


def _erf32(n: _Nodes, x: KernelNode) -> KernelNode:
  """x + x q(x^2) up to |x| 0.75 (x added last, so the result rounds once near x), then 0.875 + d(w) and
  1 - erfc(v), signed. A series reads its variable unclipped outside its range, where the select drops its value
  (inf or NaN there do no harm)."""
  small_coeffs, mid_coeffs, tail_coeffs = erf32_fits()
  small = n.add(x, n.mul(x, n.horner(small_coeffs, n.mul(x, x))))
  ax = n.max(x, n.neg(x))
  mid = n.add(n.c(ERF32_MID_BASE), n.horner(mid_coeffs, n.sub(ax, n.c(ERF32_MID_AT))))
  tail = n.sub(n.c(1), n.horner(tail_coeffs, n.add(n.max(n.neg(ax), n.c(-ERF32_END)), n.c(ERF32_TAIL_AT))))
  # each range holds its upper bound; NaN compares false, so it takes the small branch, which keeps it, as -0.0
  # stays -0.0 there
  big = n.where(n.less(n.c(ERF32_MID), ax), tail, mid)
  sign = n.where(n.less(x, n.c(0)), n.c(-1), n.c(1))
  return n.where(n.less(n.c(ERF32_SMALL), ax), n.mul(sign, big), small)
