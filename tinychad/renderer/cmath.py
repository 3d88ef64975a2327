"""Math helpers the C renderer defines in a kernel's source, for scalars and for SIMD vectors.

in: an op and a dtype (and, for vectors, the C vector type names)  ->  out: the C definition of a
static inline function, and its name.
libm's exp2f/log2f are calls, which keep gcc from vectorizing anything around them, so float32
exp2 and log2 are polynomials here. The vector versions do exactly what the scalar ones do, lane by
lane and in the same order of operations (results are bit-identical): compares give lane masks of
all ones or zeros, and `blend` picks between two vectors through such a mask, since C has no `?:` on
vectors. gcc does not vectorize a 16-iteration loop of scalar calls over vector lanes on its own.
"""
from __future__ import annotations
from tinychad.dtype import dtypes
from tinychad.ops import UnaryOps


def blend(mask: str, if_true: str, if_false: str, itype: str, vtype: str) -> str:
  """C for `mask ? if_true : if_false` lane by lane: mask lanes are all ones or all zeros (itype)."""
  return f"({vtype})((({itype})({if_true}) & ({mask})) | (({itype})({if_false}) & ~({mask})))"


# float32 exp2/log2 without libm: straight-line code (selects, no branches or calls). Both are within 3 ulp of the exact result over the whole float32
# range, with numpy's answers for inf, -inf, NaN, 0, negatives, overflow and denormals.
POLY_MATH = {
  (UnaryOps.EXP2, dtypes.float32): ("tc_exp2f", """static inline float tc_exp2f(float x) {
  // at or below -150 (and NaN) the answer is 0 (or NaN), put in at the end: computing it with c = 0
  // keeps the multiply from underflowing, which costs a ~150-cycle microcode assist on x86 (a
  // causal mask's -inf is half of an attention matrix); above 128 the result is inf
  int tiny = !(x > -150.0f);
  float c = tiny ? 0.0f : x;
  c = c < 128.0f ? c : 128.0f;
  // 2^x = 2^k * 2^f with k = round(x) (adding 1.5*2^23 rounds to an integer) and f in [-0.5, 0.5]
  float k = (c + 12582912.0f) - 12582912.0f, f = c - k;
  // 2^f: least-squares fit of (2^f - 1)/f, relative error 3e-9 before rounding
  float p = 1.0f + f*(0x1.62e43p-1f + f*(0x1.ebfbdep-3f + f*(0x1.c6aef8p-5f + f*(0x1.3b2cb8p-7f + f*(0x1.5f3524p-10f + f*0x1.424b68p-13f)))));
  // 2^k in two normal halves, so k = 128 overflows to inf and k < -126 gives a denormal rounded once
  int ki = (int)k, k1 = ki >> 1, k2 = ki - k1;
  int bits1 = (k1 + 127) << 23, bits2 = (k2 + 127) << 23;
  float scale1, scale2;
  __builtin_memcpy(&scale1, &bits1, 4);
  __builtin_memcpy(&scale2, &bits2, 4);
  float r = p * scale1 * scale2;
  r = tiny ? 0.0f : r;
  return x != x ? x : r;
}"""),
  (UnaryOps.LOG2, dtypes.float32): ("tc_log2f", """static inline float tc_log2f(float x) {
  // denormals are scaled into the normal range first (the exponent field is then 23 too large)
  int denormal = x < 0x1p-126f;
  float xs = denormal ? x * 0x1p23f : x;
  int bits;
  __builtin_memcpy(&bits, &xs, 4);
  int e = ((bits >> 23) & 255) - (denormal ? 150 : 127);
  // mantissa m in [1, 2), moved to [sqrt(1/2), sqrt(2)) so that t below stays small
  int mbits = (bits & 0x7fffff) | 0x3f800000;
  float m;
  __builtin_memcpy(&m, &mbits, 4);
  int big = m > 1.41421356f;
  m = big ? m * 0.5f : m;
  e = e + big;
  // log2(m) = 2/ln2 * atanh(t), t = (m-1)/(m+1) (m-1 is exact): the odd series to t^11, |t| < 0.172
  float t = (m - 1.0f) / (m + 1.0f), t2 = t * t;
  float p = t*(0x1.715476p+1f + t2*(0x1.ec709ep-1f + t2*(0x1.2776c6p-1f + t2*(0x1.a61762p-2f + t2*(0x1.484b14p-2f + t2*0x1.0c9a84p-2f)))));
  float r = (float)e + p;
  r = x == __builtin_inff() ? x : r;
  r = x == 0.0f ? -__builtin_inff() : r;
  return x < 0.0f ? __builtin_nanf("") : x != x ? x : r;
}"""),
}


def _select_max(name: str, ctype: str, itype: str) -> str:
  return f"""static inline {ctype} {name}({ctype} a, {ctype} b) {{
  // max with NaN winning, as a SIMD compare-and-select in lane 0: written as a scalar ternary, gcc
  // compiles a max (a ReLU, a max-pool) into a branch on the data, which mispredicts half the time
  typedef {ctype} vf __attribute__((vector_size(16)));
  typedef {itype} vi __attribute__((vector_size(16)));
  vf va = {{a}}, vb = {{b}};
  vi keep_a = (va > vb) | (va != va);
  return ((vf)(((vi)va & keep_a) | ((vi)vb & ~keep_a)))[0];
}}"""


SCALAR_MAX = {dtypes.float32: ("tc_maxf", _select_max("tc_maxf", "float", "int")),
              dtypes.float64: ("tc_max", _select_max("tc_max", "double", "long long"))}


def _vector_exp2(name: str, vtype: str, itype: str) -> str:
  def pick(mask, a, b): return blend(mask, a, b, itype, vtype)
  return f"""static inline {vtype} {name}({vtype} x) {{
  // tc_exp2f on every lane: lanes at or below -150 (and NaN) compute with c = 0, then become 0 (or NaN)
  {itype} tiny = ~(x > -150.0f);
  {vtype} c = {pick("tiny", f"({vtype}){{}}", "x")};
  {itype} keep = c < 128.0f;
  c = {pick("keep", "c", f"({vtype}){{}} + 128.0f")};
  {vtype} k = (c + 12582912.0f) - 12582912.0f, f = c - k;
  {vtype} p = 1.0f + f*(0x1.62e43p-1f + f*(0x1.ebfbdep-3f + f*(0x1.c6aef8p-5f + f*(0x1.3b2cb8p-7f + f*(0x1.5f3524p-10f + f*0x1.424b68p-13f)))));
  {itype} ki = __builtin_convertvector(k, {itype}), k1 = ki >> 1, k2 = ki - k1;
  {vtype} r = p * ({vtype})((k1 + 127) << 23) * ({vtype})((k2 + 127) << 23);
  r = {pick("tiny", f"({vtype}){{}}", "r")};
  {itype} nan = x != x;
  return {pick("nan", "x", "r")};
}}"""


def _vector_log2(name: str, vtype: str, itype: str) -> str:
  def pick(mask, a, b): return blend(mask, a, b, itype, vtype)
  nan = f'({vtype}){{}} + __builtin_nanf("")'
  return f"""static inline {vtype} {name}({vtype} x) {{
  // tc_log2f on every lane (a true compare is -1, so `e - big` adds one where big)
  {itype} denormal = x < 0x1p-126f;
  {itype} bits = ({itype}){pick("denormal", "x * 0x1p23f", "x")};
  {itype} e = ((bits >> 23) & 255) - ((denormal & 150) | (~denormal & 127));
  {vtype} m = ({vtype})((bits & 0x7fffff) | 0x3f800000);
  {itype} big = m > 1.41421356f;
  m = {pick("big", "m * 0.5f", "m")};
  e = e - big;
  {vtype} t = (m - 1.0f) / (m + 1.0f), t2 = t * t;
  {vtype} p = t*(0x1.715476p+1f + t2*(0x1.ec709ep-1f + t2*(0x1.2776c6p-1f + t2*(0x1.a61762p-2f + t2*(0x1.484b14p-2f + t2*0x1.0c9a84p-2f)))));
  {vtype} r = __builtin_convertvector(e, {vtype}) + p;
  r = {pick("x == __builtin_inff()", "x", "r")};
  r = {pick("x == 0.0f", f"({vtype}){{}} - __builtin_inff()", "r")};
  r = {pick("x != x", "x", "r")};
  return {pick("x < 0.0f", nan, "r")};
}}"""


# (op, dtype) -> (name prefix, definition(name, vector type, int vector type with as many lanes))
VECTOR_MATH = {(UnaryOps.EXP2, dtypes.float32): ("tc_exp2f", _vector_exp2),
               (UnaryOps.LOG2, dtypes.float32): ("tc_log2f", _vector_log2)}
