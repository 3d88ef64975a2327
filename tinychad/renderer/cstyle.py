"""Linear IR to C source.

in: a Program (codegen/linearize.py)
out: C99 source of one function `void <name>(T0* restrict data0, const T1* restrict data1, ...,
     long long start, long long end)`; [start, end) is the range of the program's parallel loop.
Every IR value becomes one typed local variable, so each float16 op rounds to half once, as numpy
does, and the C mirrors the IR line by line (LINES: one method per kind of UOp). An ALU op is spelled
by its template in the op table (ops.OP_INFO); SCALAR_RULES and VECTOR_RULES, (applies, render) pairs
tried in order before it, are what a template can't say. Integer division and remainder are guarded so a zero
divisor gives 0 (numpy's answer) instead of a crash.
SIMD values (vec > 1) use GCC vector extensions (clang has them too): `+ - * /`, negation, bitwise
ops, compares (lane masks, stored as bool bytes), selects and max (bit blends through a mask), casts
(__builtin_convertvector) and float32 exp2/log2 (vector polynomials, renderer/cmath.py) are whole
vector operations. Anything else is the scalar expression per lane, written as the vector's initializer:
gcc's SLP vectorizer makes one instruction of the lanes where the target has one (sqrtf: vsqrtps), where
a loop over the lanes stays scalar (gcc's loop vectorizer is off, runtime/cc.py); libm calls stay one per
lane (measured, a 16-lane loop of exp2 ran 4x slower than the vector function). Vector loads and stores
go through a typedef aligned to the element, since a lane group may start anywhere. Scalar float32 exp2
and log2 call the scalar polynomials (no libm call in a kernel's hot loop); float64 and float16 keep libm.
A streaming store (the IR's STORE "stream") is one AVX instruction in inline assembly, as gcc has no
portable builtin for it, behind a helper named for the vector type; such stores are weakly ordered,
so the function ends with a store fence (tc_stream_fence) and every write is visible when it returns.
"""
from __future__ import annotations
import math
import re
import numpy as np
from tinychad.dtype import NATIVE_VECTOR_DTYPES, DType, dtypes
from tinychad.ops import OP_INFO, COMPARISONS, Op, UnaryOps, BinaryOps, TernaryOps
from tinychad.codegen.uops import Program, UOp, UOps
from tinychad.renderer.cmath import POLY_MATH, SCALAR_MAX, VECTOR_MATH, blend

# the first line of a library whose code needs -fwrapv (Program.wraps): the host compiler (runtime/cc.py)
# reads it, so that only kernels with signed integer arithmetic pay for wrapping
WRAPS_MARKER = "// tinychad: signed integer arithmetic wraps"


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


def spell(op: Op, dtype: DType, *srcs: str) -> str:
  """The op table's C expression of `op` with a `dtype` result over the rendered sources."""
  template = OP_INFO[op].c[dtype.category]
  if template is None: raise NotImplementedError(f"C renderer has no rule for {op} on {dtype.name}")
  # float32 and float16 use the float versions of libm functions; float16 converts implicitly
  return template.format(*srcs, f="" if dtype == dtypes.float64 else "f", dtype=dtype.c_name)


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
    """The pointer a LOAD or a vector STORE reads or writes. An index `i + constant` becomes the
    pointer `buf + i + constant`: pointer steps, where the int sum could wrap (-fwrapv), so gcc
    would sign-extend each sum again; a 6x64 matmul tile's 4 row loads cost 8 extra instructions."""
    buf, idx = u.srcs[0], u.srcs[1]
    if _plus_constant(idx): return f"{self.ref(buf)}+{self.ref(idx.srcs[0])}+{self.ref(idx.srcs[1])}"
    return f"{self.ref(buf)}+{self.ref(idx)}"

  def ref(self, u: UOp) -> str:
    if u.op is UOps.CONST:
      text = render_const(u.arg, u.dtype)
      if u.vec > 1: return f"(({self.type_name(u.dtype, u.vec)}){{}} + {text})"
      # parenthesise negative literals so `a - -1` never prints as `a--1`
      return f"({text})" if text.startswith("-") else text
    return self.names[id(u)]

  def alu(self, u: UOp, s: list[str]) -> str:
    """The scalar C expression of ALU op `u` over the rendered sources `s`: the first rule of
    SCALAR_RULES that applies, else the op table's spelling."""
    for applies, render in SCALAR_RULES:
      if applies(u): return render(self, u, s)
    return spell(u.arg, u.dtype, *s)

  def helper_call(self, name: str, definition: str, args: list[str]) -> str:
    """A call of a helper function, whose definition the kernel's source then carries."""
    self.helpers[name] = definition
    return f"{name}({', '.join(args)})"

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
       operands[0] in NATIVE_VECTOR_DTYPES and operands[0].itemsize == itemsize:
      a, b = (self.splat(self.ref(x), x, cond.vec) for x in cond.srcs)
      return f"({spell(cond.arg, cond.dtype, a, b)})"
    return f"-__builtin_convertvector({ref}, {mtype})"

  def vector_alu(self, u: UOp, name: str) -> list[str]:
    """A SIMD ALU op: the first rule of VECTOR_RULES that applies (a native vector operator where C has
    one), else the scalar expression per lane as the vector's initializer (module docstring)."""
    vtype, s = self.type_name(u.dtype, u.vec), [self.ref(x) for x in u.srcs]
    for applies, render in VECTOR_RULES:
      if applies(u): return render(self, u, s, name, vtype)
    cast = "(_Bool)" if u.dtype == dtypes.bool else ""
    def lane(i: int) -> str:
      return f"{cast}({self.alu(u, [f'{x}[{i}]' if src.vec > 1 else x for x, src in zip(s, u.srcs)])})"
    return [f"{vtype} {name} = {{{', '.join(lane(i) for i in range(u.vec))}}};"]

  def splats(self, u: UOp, s: list[str]) -> list[str]:
    """Every source as a vector (scalars broadcast)."""
    return [self.splat(x, src, u.vec) for x, src in zip(s, u.srcs)]

  def mask_type(self, u: UOp) -> str:
    """The integer vector type as wide per lane as u's: what a lane compare gives."""
    return self.type_name(_MASK_INT[u.dtype.itemsize], u.vec)

  def line(self, u: UOp) -> str | list[str]:
    """The C line(s) of one UOp, by its kind (LINES)."""
    if u.op not in LINES: raise NotImplementedError(f"C renderer has no rule for {u.op}")
    return LINES[u.op](self, u)

  def open_loop(self, u: UOp) -> str | list[str]:
    name, extent, parallel, unroll = u.arg
    self.names[id(u)] = name
    lo, hi = ("start", "end") if parallel else (self.ref(u.srcs[0]), self.ref(u.srcs[1])) if u.srcs else ("0", str(extent))
    loop = f"for ({u.dtype.c_name} {name} = {lo}; {name} < {hi}; {name}++) {{"
    # gcc and clang both read this pragma; the unrolled copies share the loop's accumulators
    return [f"#pragma GCC unroll {unroll}", loop] if unroll > 1 else loop

  def define_local(self, u: UOp) -> str:
    self.names[id(u)] = f"local{u.num}"
    return f"{u.dtype.c_name} local{u.num}[{u.arg}] __attribute__((aligned(64)));"

  def load(self, u: UOp) -> str:
    self.names[id(u)] = f"val{u.num}"
    vtype = self.type_name(u.dtype, u.vec)
    if u.vec > 1: read = f"*(const {vtype}u*)({self.address(u)})"
    elif _plus_constant(u.srcs[1]): read = f"*({self.address(u)})"
    else: read = f"{self.ref(u.srcs[0])}[{self.ref(u.srcs[1])}]"
    if len(u.srcs) == 3: read = f"{self.ref(u.srcs[2])} ? {read} : {'0' if u.vec == 1 else f'({vtype}){{}}'}"
    return f"{vtype} val{u.num} = {read};"

  def define_acc(self, u: UOp) -> str:
    self.names[id(u)] = f"acc{u.num}"
    init = render_const(u.arg, u.dtype)
    if u.vec > 1: init = f"({self.type_name(u.dtype, u.vec)}){{}} + {init}"
    return f"{self.type_name(u.dtype, u.vec)} acc{u.num} = {init};"

  def store(self, u: UOp) -> str:
    if u.arg == "stream": return f"{self.stream_helper(u.srcs[2])}({self.address(u)}, {self.ref(u.srcs[2])});"
    buf, idx, value = (self.ref(x) for x in u.srcs)
    if u.srcs[2].vec > 1: return f"*({self.type_name(u.srcs[2].dtype, u.srcs[2].vec)}u*)({self.address(u)}) = {value};"
    return f"{buf}[{idx}] = {value};"

  def vectorize(self, u: UOp) -> str:
    self.names[id(u)] = f"vec{u.num}"
    vtype = self.type_name(u.dtype, u.vec)
    return f"{vtype} vec{u.num} = ({vtype}){{{', '.join(self.ref(x) for x in u.srcs)}}};"

  def gep(self, u: UOp) -> str:
    self.names[id(u)] = f"gep{u.num}"
    return f"{u.dtype.c_name} gep{u.num} = {self.ref(u.srcs[0])}[{u.arg}];"

  def shuffle(self, u: UOp) -> str:
    self.names[id(u)] = f"shuf{u.num}"
    self.helpers["TC_SHUFFLE"] = SHUFFLE_MACRO
    a, b, lanes = self.ref(u.srcs[0]), self.ref(u.srcs[1]), ", ".join(str(i) for i in u.arg)
    return f"{self.type_name(u.dtype, u.vec)} shuf{u.num} = TC_SHUFFLE({self.mask_type(u)}, {a}, {b}, {lanes});"

  def alu_line(self, u: UOp) -> str | list[str]:
    name = self.names[id(u)] = f"alu{u.num}"
    if u.vec > 1: return self.vector_alu(u, name)
    if u.arg is UnaryOps.BITCAST:
      # memcpy is the defined way to reinterpret bits in C; compilers turn it into a move
      return [f"{u.dtype.c_name} {name};", f"__builtin_memcpy(&{name}, &{self.ref(u.srcs[0])}, sizeof({name}));"]
    return f"{u.dtype.c_name} {name} = {self.alu(u, [self.ref(x) for x in u.srcs])};"

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



# lanes picked from two vectors: clang's builtin takes the lane numbers, gcc's a vector of them (gcc has the
# clang spelling only from 12 on); either way the compiler picks the machine's shuffle instructions
SHUFFLE_MACRO = """#ifdef __clang__
#define TC_SHUFFLE(mask, a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define TC_SHUFFLE(mask, a, b, ...) __builtin_shuffle(a, b, (mask){__VA_ARGS__})
#endif"""


LINES = {UOps.RANGE: CRenderer.open_loop, UOps.ENDRANGE: lambda r, u: "}", UOps.DEFINE_LOCAL: CRenderer.define_local,
         UOps.LOAD: CRenderer.load, UOps.DEFINE_ACC: CRenderer.define_acc, UOps.STORE: CRenderer.store,
         UOps.ASSIGN: lambda r, u: f"{r.ref(u.srcs[0])} = {r.ref(u.srcs[1])};", UOps.VECTORIZE: CRenderer.vectorize,
         UOps.GEP: CRenderer.gep, UOps.SHUFFLE: CRenderer.shuffle, UOps.ALU: CRenderer.alu_line}


# ---- ALU rules: what the op table can't spell, as (applies(uop), render) pairs tried in order ----

def _guarded_divmod(r: CRenderer, u: UOp, s: list[str]) -> str:
  """x/0 and x%0 are 0 like numpy; MIN/-1 overflows the division, but -x wraps (we compile with -fwrapv)."""
  if u.arg is BinaryOps.DIV:
    neg = f"{s[1]}==-1 ? -{s[0]} : " if not u.dtype.is_unsigned else ""
    return f"({s[1]}==0 ? 0 : {neg}{s[0]}/{s[1]})"
  bad = f"{s[1]}==0" + (f" || {s[1]}==-1" if not u.dtype.is_unsigned else "")
  return f"({bad} ? 0 : {s[0]}%{s[1]})"


SCALAR_RULES = (
  # float32 exp2 and log2: polynomials (cmath.py), no libm call in a kernel's hot loop
  (lambda u: (u.arg, u.dtype) in POLY_MATH, lambda r, u, s: r.helper_call(*POLY_MATH[(u.arg, u.dtype)], s)),
  # a float max as a SIMD select in lane 0, not a branch on the data
  (lambda u: u.arg is BinaryOps.MAX and u.vec == 1 and u.dtype in SCALAR_MAX,
   lambda r, u, s: r.helper_call(*SCALAR_MAX[u.dtype], s)),
  (lambda u: u.arg in (BinaryOps.DIV, BinaryOps.MOD) and not u.dtype.is_float and not _is_safe_divisor(u.srcs[1]),
   _guarded_divmod),
)


def _plus_constant(index: UOp) -> bool: return index.op is UOps.ALU and index.arg is BinaryOps.ADD and index.srcs[1].op is UOps.CONST


def _uniform(u: UOp) -> bool: return all(x.dtype == u.dtype for x in u.srcs)


def _native(u: UOp) -> bool:
  """C's vector operators act on u's lanes with the scalar op's meaning: a native dtype, all sources of it."""
  return u.dtype in NATIVE_VECTOR_DTYPES and _uniform(u)


def _vector_math(r: CRenderer, u: UOp, s: list[str], name: str, vtype: str) -> list[str]:
  prefix, define = VECTOR_MATH[(u.arg, u.dtype)]
  helper = f"{prefix}_{vtype}"
  r.helpers[helper] = define(helper, vtype, r.mask_type(u))
  return [f"{vtype} {name} = {helper}({s[0]});"]


def _vector_max(r: CRenderer, u: UOp, s: list[str], name: str, vtype: str) -> list[str]:
  # NaN wins, as in numpy.maximum: keep a where a > b or a is NaN
  mtype = r.mask_type(u)
  a, b = r.splats(u, s)
  keep = f"({a} > {b}) | ({a} != {a})" if u.dtype.is_float else f"{a} > {b}"
  return [f"{mtype} {name}m = {keep};", f"{vtype} {name} = {blend(name + 'm', a, b, mtype, vtype)};"]


def _bool_to_number(r: CRenderer, u: UOp, s: list[str], name: str, vtype: str) -> list[str]:
  # a bool (a compare) to 1/0 through a lane mask: the mask ANDs the bits of 1 in each lane
  mtype = r.mask_type(u)
  mask = r.lane_mask(u.srcs[0], s[0], u.dtype.itemsize, mtype)
  return [f"{vtype} {name} = ({vtype})({mask} & ({mtype})(({vtype}){{}} + 1));"]


def _vector_compare(r: CRenderer, u: UOp, s: list[str], name: str, vtype: str) -> list[str]:
  # a vector compare gives lanes of -1/0 as wide as its operands; bool lanes are bytes of 1/0
  return [f"{vtype} {name} = __builtin_convertvector(-({spell(u.arg, u.dtype, *r.splats(u, s))}), {vtype});"]


def _lane_select(r: CRenderer, u: UOp, s: list[str], name: str, vtype: str) -> list[str]:
  # blend through a mask of all-ones lanes: C has no ?: on vectors, and a lane loop of byte-wide
  # conditions over float lanes is a pattern gcc won't vectorize
  mtype = r.mask_type(u)
  picks = [f"({mtype}){r.splat(x, src, u.vec)}" for x, src in zip(s[1:], u.srcs[1:])]
  return [f"{mtype} {name}m = {r.lane_mask(u.srcs[0], s[0], u.dtype.itemsize, mtype)};",
          f"{vtype} {name} = ({vtype})(({picks[0]} & {name}m) | ({picks[1]} & ~{name}m));"]


def _vector_select(r: CRenderer, u: UOp, s: list[str], name: str, vtype: str) -> list[str]:
  # one condition picks a whole vector (a gather's one-hot row): no per-lane loop for gcc to untangle
  picks = [r.splat(x, src, u.vec) for x, src in zip(s[1:], u.srcs[1:])]
  return [f"{vtype} {name} = {s[0]} ? {picks[0]} : {picks[1]};"]


_BITWISE = (BinaryOps.AND, BinaryOps.OR, BinaryOps.XOR)
VECTOR_RULES = (
  # one C vector operator on these lanes (the op table's vector_dtypes)
  (lambda u: u.dtype in OP_INFO[u.arg].vector_dtypes and _uniform(u),
   lambda r, u, s, name, vtype: [f"{vtype} {name} = {spell(u.arg, u.dtype, *s)};"]),
  (lambda u: (u.arg, u.dtype) in VECTOR_MATH and u.srcs[0].dtype == u.dtype, _vector_math),
  (lambda u: u.arg is BinaryOps.MAX and _native(u), _vector_max),
  (lambda u: u.arg is UnaryOps.RECIP and _native(u) and u.dtype.is_float,
   lambda r, u, s, name, vtype: [f"{vtype} {name} = 1 / {s[0]};"]),
  # integer and bool lanes (bool lanes are bytes of 0/1, and a scalar bool is splatted as a byte)
  (lambda u: u.arg in _BITWISE and _uniform(u) and not u.dtype.is_float,
   lambda r, u, s, name, vtype: [f"{vtype} {name} = {spell(u.arg, u.dtype, *r.splats(u, s))};"]),
  (lambda u: u.arg is UnaryOps.CAST and u.srcs[0].vec > 1 and u.srcs[0].dtype == dtypes.bool and u.dtype in NATIVE_VECTOR_DTYPES,
   _bool_to_number),
  (lambda u: u.arg is UnaryOps.CAST and u.srcs[0].vec > 1 and _converts_exactly(u.srcs[0].dtype, u.dtype),
   lambda r, u, s, name, vtype: [f"{vtype} {name} = __builtin_convertvector({s[0]}, {vtype});"]),
  (lambda u: u.arg in COMPARISONS and u.srcs[0].dtype in NATIVE_VECTOR_DTYPES and u.srcs[0].dtype == u.srcs[1].dtype,
   _vector_compare),
  (lambda u: u.arg is TernaryOps.WHERE and u.srcs[0].vec > 1 and u.dtype in NATIVE_VECTOR_DTYPES, _lane_select),
  (lambda u: u.arg is TernaryOps.WHERE and u.srcs[0].vec == 1, _vector_select),
)


# What the kernels use of <math.h>, declared instead of included: the two constants, and each function ops.OP_INFO
# spells for C (float32 and float64) that the file calls. Parsing the header is about a fifth of a small kernel's
# compile time (~20 of ~110 ms with gcc 12), and C lets a program declare a library function itself; gcc and clang
# still know these names as builtins (sqrtf is one instruction). A function the op table gains but this table lacks
# fails to compile (runtime/cc.py makes an implicit declaration an error) instead of being called as returning int.
MATH_CONSTANTS = '#define INFINITY __builtin_inff()\n#define NAN __builtin_nanf("")'
LIBM_PROTOTYPES = {name: f"{c_type} {name}({', '.join([c_type] * arity)});"
                   for base, arity in (("sqrt", 1), ("trunc", 1), ("exp2", 1), ("log2", 1), ("sin", 1), ("fmod", 2))
                   for name, c_type in ((base + "f", "float"), (base, "double"))}
# a call of one of them: its name as a whole word (tc_exp2f, the polynomial, is not a call of exp2f)
_LIBM_CALL = re.compile(r"\b(" + "|".join(LIBM_PROTOTYPES) + r")\(")


# AVX's streaming stores by element type: the vector must be aligned to its whole size
_STREAM_INSTRUCTIONS = {dtypes.float32: "vmovntps", dtypes.float64: "vmovntpd", dtypes.int32: "vmovntdq", dtypes.int64: "vmovntdq"}
# streaming stores are weakly ordered: a kernel that made them drains them before it returns
STREAM_FENCE = """static inline void tc_stream_fence(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_sfence();
#endif
}"""


# the integer type whose lanes are as wide as a value's: the mask a vector compare makes
_MASK_INT = {4: dtypes.int32, 8: dtypes.int64}


def _converts_exactly(src: DType, dst: DType) -> bool:
  """A vector conversion gives what the scalar C cast gives on every lane: bool lanes (0/1) and the
  native dtypes convert as C does (float to int32/int64 with the same x86 truncating instructions),
  but not to bool, where C tests != 0 and a conversion would truncate."""
  return src in NATIVE_VECTOR_DTYPES | {dtypes.bool} and dst in NATIVE_VECTOR_DTYPES


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
  # kernels computing signed integers that must wrap on overflow: the host compiler then adds -fwrapv
  marker = [WRAPS_MARKER] if any(p.wraps for p in programs) else []
  body = [*typedefs.values(), *helpers.values(), *functions]
  called = sorted({match.group(1) for text in body for match in _LIBM_CALL.finditer(text)})
  return "\n".join([*marker, MATH_CONSTANTS, *(LIBM_PROTOTYPES[name] for name in called), *body, ""])
