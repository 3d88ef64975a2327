"""Linear IR to C source.

in: a Program (codegen/linearize.py)
out: C99 source of one function `void <name>(T0* restrict data0, const T1* restrict data1, ...,
     long long start, long long end)`; [start, end) is the range of the program's parallel loop.
Every IR value becomes one typed local variable, so each float16 op rounds to half once, as numpy
does, and the C mirrors the IR line by line. Integer division and remainder are guarded so a zero
divisor gives 0 (numpy's answer) instead of a crash.
SIMD values (vec > 1) use GCC vector extensions (clang has them too): `+ - * /`, negation, bitwise
ops, compares (lane masks, stored as bool bytes), selects and max (bit blends through a mask), casts
(__builtin_convertvector) and float32 exp2/log2 (vector polynomials, renderer/cmath.py) are whole
vector operations. Anything else is the scalar expression applied lane by lane in a fixed-count
loop, which gcc leaves scalar: measured, a 16-lane loop of exp2 ran 4x slower than the vector
function. Vector loads and stores go through a typedef aligned to the element, since a lane group
may start anywhere. Scalar float32 exp2 and log2 call the scalar polynomials (no libm call in a
kernel's hot loop); float64 and float16 keep libm.
A streaming store (the IR's STORE "stream") is one AVX instruction in inline assembly, as gcc has no
portable builtin for it, behind a helper named for the vector type; such stores are weakly ordered,
so the function ends with a store fence (tc_stream_fence) and every write is visible when it returns.
"""
from __future__ import annotations
import math
import numpy as np
from tinychad.dtype import DType, dtypes
from tinychad.ops import UnaryOps, BinaryOps, TernaryOps, COMPARISONS
from tinychad.codegen.uops import Program, UOp, UOps
from tinychad.renderer.cmath import POLY_MATH, SCALAR_MAX, VECTOR_MATH, blend


def render_const(value, dtype: DType) -> str:
  """A C literal of exactly `value` in `dtype`."""
  if dtype == dtypes.bool: return "1" if value else "0"
  if dtype.is_int:
    value = int(value)
    lo = -(2 ** (8 * dtype.itemsize - 1))
    suffix = "LL" if dtype.itemsize == 8 else ""
    # the most negative value has no literal: -2147483648 is the negation of an out-of-range int
    if value == lo and not dtype.is_unsigned: return f"({value + 1}{suffix}-1)"
    return f"{value}{suffix}"
  value = float(value)
  if math.isnan(value): return f"(({dtype.c_name})NAN)"
  if math.isinf(value): return f"(({dtype.c_name}){'-' if value < 0 else ''}INFINITY)"
  if dtype == dtypes.float64: return repr(value)
  text = str(dtype.np(value))
  if dtype == dtypes.float32: return text + "f"
  # float16 literal: a float literal converted to half; use hex when the decimal could round twice
  if np.float16(np.float32(text)) != np.float16(value): text = float.hex(float(np.float16(value)))
  return f"(({dtype.c_name}){text}f)"


def _math_fn(name: str, dtype: DType) -> str:
  # float32 and float16 use the float versions of libm functions; float16 converts implicitly
  return name if dtype == dtypes.float64 else name + "f"


def _is_safe_divisor(u: UOp) -> bool:
  return u.op is UOps.CONST and u.arg not in (0, -1)


class CRenderer:
  def __init__(self, program: Program, symbol: str | None = None):
    self.program = program
    self.symbol = symbol or program.name    # the function's name in C
    self.names: dict[int, str] = {}
    self.typedefs: dict[str, str] = {}
    self.helpers: dict[str, str] = {}     # POLY_MATH functions this kernel calls: name -> definition

  def address(self, u: UOp) -> str:
    """The pointer a vector LOAD or STORE reads or writes. An index `i + constant` becomes the
    pointer `buf + i + constant`: pointer steps, where the int sum could wrap (-fwrapv), so gcc
    would sign-extend each sum again; a 6x64 matmul tile's 4 row loads cost 8 extra instructions."""
    buf, idx = u.srcs[0], u.srcs[1]
    if idx.op is UOps.ALU and idx.arg is BinaryOps.ADD and idx.srcs[1].op is UOps.CONST:
      return f"{self.ref(buf)}+{self.ref(idx.srcs[0])}+{self.ref(idx.srcs[1])}"
    return f"{self.ref(buf)}+{self.ref(idx)}"

  def ref(self, u: UOp) -> str:
    if u.op is UOps.CONST:
      text = render_const(u.arg, u.dtype)
      if u.vec > 1: return f"(({self.type_name(u.dtype, u.vec)}){{}} + {text})"
      # parenthesise negative literals so `a - -1` never prints as `a--1`
      return f"({text})" if text.startswith("-") else text
    return self.names[id(u)]

  def alu(self, u: UOp, s: list[str]) -> str:
    """The scalar C expression of ALU op `u` over the rendered sources `s`."""
    op, dt = u.arg, u.dtype
    sdt = u.srcs[0].dtype
    if op is UnaryOps.NEG: return f"!{s[0]}" if dt == dtypes.bool else f"-{s[0]}"
    if (op, dt) in POLY_MATH:
      name, definition = POLY_MATH[(op, dt)]
      self.helpers[name] = definition
      return f"{name}({s[0]})"
    if op in (UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN, UnaryOps.SQRT):
      return f"{_math_fn(op.name.lower(), dt)}({s[0]})"
    if op is UnaryOps.RECIP:
      return f"1/{s[0]}" if dt.is_float else f"({s[0]}==0 ? 0 : 1/{s[0]})"
    if op is UnaryOps.TRUNC: return f"{_math_fn('trunc', dt)}({s[0]})" if dt.is_float else s[0]
    if op is UnaryOps.CAST: return f"({dt.c_name}){s[0]}"
    if op in _INFIX: return f"{s[0]}{_INFIX[op]}{s[1]}"
    if op is BinaryOps.DIV:
      if dt.is_float or _is_safe_divisor(u.srcs[1]): return f"{s[0]}/{s[1]}"
      # x/0 is 0 like numpy; MIN/-1 overflows the division, but -x wraps (we compile with -fwrapv)
      neg = f"{s[1]}==-1 ? -{s[0]} : " if not dt.is_unsigned else ""
      return f"({s[1]}==0 ? 0 : {neg}{s[0]}/{s[1]})"
    if op is BinaryOps.MOD:
      if dt.is_float: return f"{_math_fn('fmod', dt)}({s[0]}, {s[1]})"
      if _is_safe_divisor(u.srcs[1]): return f"{s[0]}%{s[1]}"
      bad = f"{s[1]}==0" + (f" || {s[1]}==-1" if not dt.is_unsigned else "")
      return f"({bad} ? 0 : {s[0]}%{s[1]})"
    if op is BinaryOps.MAX:
      if not sdt.is_float: return f"({s[0]}>{s[1]}) ? {s[0]} : {s[1]}"
      if u.vec == 1 and sdt in SCALAR_MAX:
        name, definition = SCALAR_MAX[sdt]
        self.helpers[name] = definition
        return f"{name}({s[0]}, {s[1]})"
      # NaN wins, as in numpy.maximum (in a lane loop gcc turns this select into a vector blend)
      return f"{s[0]}!={s[0]} ? {s[0]} : ({s[0]}>{s[1]} ? {s[0]} : {s[1]})"
    if op is TernaryOps.WHERE: return f"{s[0]} ? {s[1]} : {s[2]}"
    raise NotImplementedError(f"C renderer has no rule for {op}")

  def type_name(self, dtype: DType, vec: int) -> str:
    """The C type of a value: the scalar type, or a vector typedef (declared once per kernel)."""
    if vec == 1: return dtype.c_name
    name = f"{dtype.name}x{vec}"
    if name not in self.typedefs:
      # bool lanes are bytes holding 0 or 1 (_Bool can't be a vector element)
      elem = "unsigned char" if dtype == dtypes.bool else dtype.c_name
      size = vec * dtype.itemsize
      self.typedefs[name] = (f"typedef {elem} {name} __attribute__((vector_size({size})));\n"
                             f"typedef {elem} {name}u __attribute__((vector_size({size}), aligned({dtype.itemsize})));")
    return name

  def stream_helper(self, value: UOp) -> str:
    """The name of the helper that writes `value` (a whole aligned vector) past the cache. Built without
    the instruction set the vector needs (an exported program compiled without -march=native), it is a
    plain store."""
    vtype = self.type_name(value.dtype, value.vec)
    name = f"tc_stream_{vtype}"
    isa = "__AVX512F__" if value.vec * value.dtype.itemsize == 64 else "__AVX__"
    # the "v" operand is the vector register, "m" the destination; volatile, as the compiler sees no reader
    self.helpers[name] = "\n".join([
      f"static inline void {name}({value.dtype.c_name}* p, {vtype} v) {{", f"#ifdef {isa}",
      f'  __asm__ volatile("{_STREAM_INSTRUCTIONS[value.dtype]} %1, %0" : "=m"(*({vtype}*)p) : "v"(v));',
      "#else", f"  *({vtype}*)p = v;", "#endif", "}"])
    self.helpers["tc_stream_fence"] = STREAM_FENCE
    return name

  def splat(self, ref: str, src: UOp, vec: int) -> str:
    """A scalar operand broadcast to the vector type of the same dtype (vectors pass through)."""
    if src.vec > 1: return ref
    # bool lanes are bytes: C won't add a _Bool to a vector of them
    scalar = f"(unsigned char){ref}" if src.dtype == dtypes.bool else ref
    return f"(({self.type_name(src.dtype, vec)}){{}} + {scalar})"

  def lane_mask(self, cond: UOp, ref: str, itemsize: int, mtype: str) -> str:
    """A WHERE's condition as lanes of all ones or zeros `itemsize` bytes wide. A compare of operands
    that wide gives that mask itself; going through the bool bytes instead is a conversion gcc
    turns into a scalar loop per lane (a clip, two WHEREs, ran at 84 ns per 16 floats)."""
    operands = [x.dtype for x in cond.srcs]
    if cond.op is UOps.ALU and cond.arg in COMPARISONS and operands[0] == operands[1] and \
       operands[0] in _NATIVE_VECTOR_DTYPES and operands[0].itemsize == itemsize:
      a, b = (self.splat(self.ref(x), x, cond.vec) for x in cond.srcs)
      return f"({a}{_INFIX[cond.arg]}{b})"
    return f"-__builtin_convertvector({ref}, {mtype})"

  def vector_alu(self, u: UOp, name: str) -> list[str]:
    """A SIMD ALU op: a native vector operator where C has one, else the scalar expression per lane."""
    vtype, op = self.type_name(u.dtype, u.vec), u.arg
    s = [self.ref(x) for x in u.srcs]
    native = u.dtype in _NATIVE_VECTOR_DTYPES and all(x.dtype == u.dtype for x in u.srcs)
    if native and (op in _NATIVE_VECTOR_OPS or (op is BinaryOps.DIV and u.dtype.is_float)):
      if op is UnaryOps.NEG: return [f"{vtype} {name} = -{s[0]};"]
      return [f"{vtype} {name} = {s[0]}{_INFIX.get(op, '/')}{s[1]};"]
    operands = [x.dtype for x in u.srcs]
    if (op, u.dtype) in VECTOR_MATH and operands[0] == u.dtype:
      prefix, define = VECTOR_MATH[(op, u.dtype)]
      helper = f"{prefix}_{vtype}"
      self.helpers[helper] = define(helper, vtype, self.type_name(_MASK_INT[u.dtype.itemsize], u.vec))
      return [f"{vtype} {name} = {helper}({s[0]});"]
    if op is BinaryOps.MAX and native and u.dtype.itemsize in _MASK_INT:
      # NaN wins, as in numpy.maximum: keep a where a > b or a is NaN
      mtype = self.type_name(_MASK_INT[u.dtype.itemsize], u.vec)
      a, b = (self.splat(x, src, u.vec) for x, src in zip(s, u.srcs))
      keep = f"({a} > {b}) | ({a} != {a})" if u.dtype.is_float else f"{a} > {b}"
      return [f"{mtype} {name}m = {keep};", f"{vtype} {name} = {blend(name + 'm', a, b, mtype, vtype)};"]
    if op is UnaryOps.RECIP and native and u.dtype.is_float: return [f"{vtype} {name} = 1 / {s[0]};"]
    if op in (BinaryOps.AND, BinaryOps.OR, BinaryOps.XOR) and all(x == u.dtype for x in operands) and not u.dtype.is_float:
      a, b = (self.splat(x, src, u.vec) for x, src in zip(s, u.srcs))
      return [f"{vtype} {name} = {a}{_INFIX[op]}{b};"]
    if op is UnaryOps.CAST and u.srcs[0].vec > 1 and operands[0] == dtypes.bool and u.dtype in _NATIVE_VECTOR_DTYPES:
      # a bool (a compare) to 1/0 through a lane mask: the mask ANDs the bits of 1 in each lane
      mtype = self.type_name(_MASK_INT[u.dtype.itemsize], u.vec)
      mask = self.lane_mask(u.srcs[0], s[0], u.dtype.itemsize, mtype)
      return [f"{vtype} {name} = ({vtype})({mask} & ({mtype})(({vtype}){{}} + 1));"]
    if op is UnaryOps.CAST and u.srcs[0].vec > 1 and _converts_exactly(operands[0], u.dtype):
      return [f"{vtype} {name} = __builtin_convertvector({s[0]}, {vtype});"]
    if op in COMPARISONS and operands[0] in _NATIVE_VECTOR_DTYPES and operands[0] == operands[1]:
      # a vector compare gives lanes of -1/0 as wide as its operands; bool lanes are bytes of 1/0
      both = [self.splat(x, src, u.vec) for x, src in zip(s, u.srcs)]
      return [f"{vtype} {name} = __builtin_convertvector(-({both[0]}{_INFIX[op]}{both[1]}), {vtype});"]
    if op is TernaryOps.WHERE and u.srcs[0].vec > 1 and u.dtype in _NATIVE_VECTOR_DTYPES and u.dtype.itemsize in _MASK_INT:
      # blend through a mask of all-ones lanes: C has no ?: on vectors, and a lane loop of
      # byte-wide conditions over float lanes is a pattern gcc won't vectorize
      mtype = self.type_name(_MASK_INT[u.dtype.itemsize], u.vec)
      picks = [f"({mtype}){self.splat(x, src, u.vec)}" for x, src in zip(s[1:], u.srcs[1:])]
      return [f"{mtype} {name}m = {self.lane_mask(u.srcs[0], s[0], u.dtype.itemsize, mtype)};",
              f"{vtype} {name} = ({vtype})(({picks[0]} & {name}m) | ({picks[1]} & ~{name}m));"]
    if op is TernaryOps.WHERE and u.srcs[0].vec == 1:
      # one condition picks a whole vector (a gather's one-hot row): no per-lane loop for gcc to untangle
      picks = [self.splat(x, src, u.vec) for x, src in zip(s[1:], u.srcs[1:])]
      return [f"{vtype} {name} = {s[0]} ? {picks[0]} : {picks[1]};"]
    lane = [f"{x}[l]" if src.vec > 1 else x for x, src in zip(s, u.srcs)]
    cast = "(_Bool)" if u.dtype == dtypes.bool else ""
    return [f"{vtype} {name};", f"for (int l = 0; l < {u.vec}; l++) {name}[l] = {cast}({self.alu(u, lane)});"]

  def line(self, u: UOp) -> str | list[str]:
    n = u.num
    if u.op is UOps.RANGE:
      name, extent, parallel, unroll = u.arg
      self.names[id(u)] = name
      lo, hi = ("start", "end") if parallel else ("0", str(extent))
      loop = f"for ({u.dtype.c_name} {name} = {lo}; {name} < {hi}; {name}++) {{"
      # gcc and clang both read this pragma; the unrolled copies share the loop's accumulators
      return [f"#pragma GCC unroll {unroll}", loop] if unroll > 1 else loop
    if u.op is UOps.ENDRANGE: return "}"
    if u.op is UOps.DEFINE_LOCAL:
      self.names[id(u)] = f"local{n}"
      return f"{u.dtype.c_name} local{n}[{u.arg}] __attribute__((aligned(64)));"
    if u.op is UOps.LOAD:
      self.names[id(u)] = f"val{n}"
      vtype = self.type_name(u.dtype, u.vec)
      read = f"{self.ref(u.srcs[0])}[{self.ref(u.srcs[1])}]" if u.vec == 1 else f"*(const {vtype}u*)({self.address(u)})"
      if len(u.srcs) == 3: read = f"{self.ref(u.srcs[2])} ? {read} : {'0' if u.vec == 1 else f'({vtype}){{}}'}"
      return f"{vtype} val{n} = {read};"
    if u.op is UOps.DEFINE_ACC:
      self.names[id(u)] = f"acc{n}"
      init = render_const(u.arg, u.dtype)
      if u.vec > 1: init = f"({self.type_name(u.dtype, u.vec)}){{}} + {init}"
      return f"{self.type_name(u.dtype, u.vec)} acc{n} = {init};"
    if u.op is UOps.ASSIGN: return f"{self.ref(u.srcs[0])} = {self.ref(u.srcs[1])};"
    if u.op is UOps.STORE and u.arg == "stream":
      return f"{self.stream_helper(u.srcs[2])}({self.address(u)}, {self.ref(u.srcs[2])});"
    if u.op is UOps.STORE:
      buf, idx, value = (self.ref(x) for x in u.srcs)
      if u.srcs[2].vec > 1: return f"*({self.type_name(u.srcs[2].dtype, u.srcs[2].vec)}u*)({self.address(u)}) = {value};"
      return f"{buf}[{idx}] = {value};"
    if u.op is UOps.VECTORIZE:
      self.names[id(u)] = f"vec{n}"
      vtype = self.type_name(u.dtype, u.vec)
      return f"{vtype} vec{n} = ({vtype}){{{', '.join(self.ref(x) for x in u.srcs)}}};"
    if u.op is UOps.GEP:
      self.names[id(u)] = f"gep{n}"
      return f"{u.dtype.c_name} gep{n} = {self.ref(u.srcs[0])}[{u.arg}];"
    if u.op is UOps.ALU:
      self.names[id(u)] = f"alu{n}"
      if u.vec > 1: return self.vector_alu(u, f"alu{n}")
      if u.arg is UnaryOps.BITCAST:
        # memcpy is the defined way to reinterpret bits in C; compilers turn it into a move
        return [f"{u.dtype.c_name} alu{n};", f"__builtin_memcpy(&alu{n}, &{self.ref(u.srcs[0])}, sizeof(alu{n}));"]
      return f"{u.dtype.c_name} alu{n} = {self.alu(u, [self.ref(x) for x in u.srcs])};"
    raise NotImplementedError(f"C renderer has no rule for {u.op}")

  def render_function(self) -> str:
    """The kernel's function alone; rendering it fills in the typedefs and helpers it needs."""
    params = []
    for g in self.program.globals:
      number, writable = g.arg
      self.names[id(g)] = f"data{number}"
      params.append(f"{'' if writable else 'const '}{g.dtype.c_name}* restrict data{number}")
    body, depth = [], 1
    for u in self.program.uops:
      if u.op in (UOps.DEFINE_GLOBAL, UOps.CONST): continue
      if u.op is UOps.ENDRANGE: depth -= 1
      lines = self.line(u)
      body += ["  " * depth + ln for ln in ([lines] if isinstance(lines, str) else lines)]
      if u.op is UOps.RANGE: depth += 1
    if "tc_stream_fence" in self.helpers: body.append("  tc_stream_fence();")
    params += ["long long start", "long long end"]
    head = f"void {self.symbol}({', '.join(params)}) {{"
    return "\n".join([head] + body + ["}"])



_INFIX = {
  BinaryOps.ADD: "+", BinaryOps.SUB: "-", BinaryOps.MUL: "*", BinaryOps.CMPLT: "<", BinaryOps.CMPEQ: "==",
  BinaryOps.CMPNE: "!=", BinaryOps.AND: "&", BinaryOps.OR: "|", BinaryOps.XOR: "^",
}


# AVX's streaming stores by element type: the vector must be aligned to its whole size
_STREAM_INSTRUCTIONS = {dtypes.float32: "vmovntps", dtypes.float64: "vmovntpd", dtypes.int32: "vmovntdq", dtypes.int64: "vmovntdq"}
# streaming stores are weakly ordered: a kernel that made them drains them before it returns
STREAM_FENCE = """static inline void tc_stream_fence(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_sfence();
#endif
}"""


# vector types where C's operators act lane-wise with the scalar op's meaning (integers wrap: -fwrapv)
_NATIVE_VECTOR_DTYPES = {dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64}
# the integer type whose lanes are as wide as a value's: the mask a vector compare makes
_MASK_INT = {4: dtypes.int32, 8: dtypes.int64}
_NATIVE_VECTOR_OPS = {BinaryOps.ADD, BinaryOps.SUB, BinaryOps.MUL, UnaryOps.NEG}


def _converts_exactly(src: DType, dst: DType) -> bool:
  """A vector conversion gives what the scalar C cast gives on every lane: bool lanes (0/1) and the
  native dtypes convert as C does (float to int32/int64 with the same x86 truncating instructions),
  but not to bool, where C tests != 0 and a conversion would truncate."""
  return src in _NATIVE_VECTOR_DTYPES | {dtypes.bool} and dst in _NATIVE_VECTOR_DTYPES


def render_c(program: Program) -> str:
  """C source for the program's one function."""
  return render_c_library([program], [program.name])


def render_c_library(programs: list[Program], symbols: list[str]) -> str:
  """One C file defining every program's function, under the given names; the vector typedefs and
  math helpers they share are written once."""
  typedefs: dict[str, str] = {}
  helpers: dict[str, str] = {}
  functions = []
  for program, symbol in zip(programs, symbols):
    renderer = CRenderer(program, symbol)
    functions.append(renderer.render_function())
    typedefs.update(renderer.typedefs)
    helpers.update(renderer.helpers)
  return "\n".join(["#include <math.h>", *typedefs.values(), *helpers.values(), *functions, ""])
