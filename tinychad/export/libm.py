"""The math an exported kernel calls, for machines with no libm (WebAssembly: no libc at all).

in: nothing  ->  out: FREESTANDING_MATH, C that export/c.py puts under #ifdef TINYCHAD_FREESTANDING in every
exported .c, in place of <math.h>.
The kernels call only sqrt, trunc (single instructions, through clang's builtins), exp2, log2, sin and
fmod in float32 and float64 (float32 exp2/log2 are already polynomials from renderer/cmath.py). Here each
is computed in float64, with numpy's answers for NaN, infinities, 0 and negatives: exp2 as 2^k * e^(f ln 2)
with a degree-13 Taylor polynomial (|f| <= 1/2), log2 from the mantissa in [sqrt(1/2), sqrt(2)) through
the atanh series, sin by reduction modulo pi/2 with a three-part pi/2 (exact for |x| < 2^20 * pi/2) and
Taylor polynomials for sin and cos; each is within a few float64 ulps there, so float32 results round
correctly almost always. fmod is x - trunc(x/y)*y, corrected into [0, |y|) with x's sign: exact for
float32 operands whose quotient is below 2^29. Names are macros onto tcm_ functions so that clang
doesn't take them for the library's and call a libm that isn't there.
"""

from tinychad.renderer.cstyle import MATH_CONSTANTS

# the constants as the host's kernels spell them without <math.h>, then the functions
FREESTANDING_MATH = "\n" + MATH_CONSTANTS + r"""
#define sqrtf(x) __builtin_sqrtf(x)
#define sqrt(x) __builtin_sqrt(x)
#define truncf(x) __builtin_truncf(x)
#define trunc(x) __builtin_trunc(x)
#define exp2(x) tcm_exp2(x)
#define exp2f(x) ((float)tcm_exp2((double)(x)))
#define log2(x) tcm_log2(x)
#define log2f(x) ((float)tcm_log2((double)(x)))
#define sin(x) tcm_sin(x)
#define sinf(x) ((float)tcm_sin((double)(x)))
#define fmod(x, y) tcm_fmod(x, y)
#define fmodf(x, y) ((float)tcm_fmod((double)(x), (double)(y)))
static inline double tcm_exp2(double x) {
  if (x != x) return x;
  if (x >= 1024.0) return __builtin_inf();
  if (x < -1080.0) return 0.0;
  double k = __builtin_floor(x + 0.5), t = (x - k) * 0.6931471805599453;
  double p = 1 + t*(1 + t*(1/2. + t*(1/6. + t*(1/24. + t*(1/120. + t*(1/720. + t*(1/5040. + t*(1/40320.
             + t*(1/362880. + t*(1/3628800. + t*(1/39916800. + t*(1/479001600. + t/6227020800.))))))))))));
  long long ki = (long long)k, k1 = ki / 2, k2 = ki - k1;   /* 2^k in two normal halves: denormals round once */
  unsigned long long b1 = (unsigned long long)(k1 + 1023) << 52, b2 = (unsigned long long)(k2 + 1023) << 52;
  double s1, s2;
  __builtin_memcpy(&s1, &b1, 8);
  __builtin_memcpy(&s2, &b2, 8);
  return p * s1 * s2;
}
static inline double tcm_log2(double x) {
  if (x != x) return x;
  if (x < 0) return __builtin_nan("");
  if (x == 0) return -__builtin_inf();
  if (x == __builtin_inf()) return x;
  unsigned long long b;
  __builtin_memcpy(&b, &x, 8);
  int e = (int)((b >> 52) & 0x7ff);
  if (e == 0) { x *= 0x1p54; __builtin_memcpy(&b, &x, 8); e = (int)((b >> 52) & 0x7ff) - 54; }
  e -= 1023;
  b = (b & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL;
  double m;
  __builtin_memcpy(&m, &b, 8);
  if (m > 1.4142135623730951) { m *= 0.5; e += 1; }
  double s = (m - 1) / (m + 1), z = s * s;
  double l = 2*s*(1 + z*(1/3. + z*(1/5. + z*(1/7. + z*(1/9. + z*(1/11. + z*(1/13. + z*(1/15. + z*(1/17. + z/19.)))))))));
  return e + l * 1.4426950408889634;
}
static inline double tcm_sin(double x) {
  if (x != x || x == __builtin_inf() || x == -__builtin_inf()) return __builtin_nan("");
  double k = __builtin_floor(x * 0.6366197723675814 + 0.5);
  double r = ((x - k * 1.57079632673412561417e+00) - k * 6.07710050630396597660e-11) - k * 2.02226624879595063154e-21;
  double z = r * r;
  double s = r + r*z*(-1/6. + z*(1/120. + z*(-1/5040. + z*(1/362880. + z*(-1/39916800. + z*(1/6227020800.
             + z*(-1/1307674368000.)))))));
  double c = 1 + z*(-0.5 + z*(1/24. + z*(-1/720. + z*(1/40320. + z*(-1/3628800. + z*(1/479001600.
             + z*(-1/87178291200.)))))));
  switch ((long long)k & 3) { case 0: return s; case 1: return c; case 2: return -s; default: return -c; }
}
static inline double tcm_fmod(double x, double y) {
  if (x != x || y != y || y == 0 || x == __builtin_inf() || x == -__builtin_inf()) return __builtin_nan("");
  if (y == __builtin_inf() || y == -__builtin_inf()) return x;
  double a = y < 0 ? -y : y, r = x - __builtin_trunc(x / y) * y;
  if (x >= 0) { if (r < 0) r += a; if (r >= a) r -= a; }
  else { if (r > 0) r -= a; if (r <= -a) r += a; }
  return r;
}
"""
