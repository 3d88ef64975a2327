"""GPU programs to OpenCL C or CUDA C: one renderer, a small table per dialect.

in: GPU Programs (codegen/gpu.py) and the symbol each kernel gets
out: the source of one OpenCL program or one CUDA module (NVRTC) defining every kernel.
A Dialect says what differs: kernel and address-space qualifiers, the work-item index builtins, the
barrier, type names, how float16 is loaded, stored and rounded, how bits are reinterpreted, literal
suffixes and whether math functions take the C `f` suffix. Everything else (the op table's C templates,
guarded integer division, the one-typed-local-per-IR-value style) is shared.
float16 is a storage type: values are computed in float and rounded to half after every op (as numpy
rounds each op), since OpenCL devices without cl_khr_fp16 (PoCL on a CPU) can't do half arithmetic.
Bool buffers hold bytes (an OpenCL kernel can't take a bool pointer). IR vectors (a register tile's row,
a scatter-add's lanes) compute lane by lane, one scalar per lane; in OpenCL their loads and stores of a
global buffer are one vloadN / vstoreN (no alignment needed), in CUDA one access per lane.
"""
from __future__ import annotations
import math
from dataclasses import dataclass
import numpy as np
from tinychad.dtype import DType, dtypes
from tinychad.ops import OP_INFO, BinaryOps, UnaryOps
from tinychad.codegen.uops import Program, UOp, UOps

OPENCL_HALF_ROUND = """inline float tc_half(float x) {
  /* x rounded to the nearest float16 (ties to even), as a float: the device may have no half type */
  float a = fabs(x);
  if (!(a < 65520.0f)) return a != a ? x : copysign(INFINITY, x);
  if (a < 6.103515625e-05f) return rint(x * 16777216.0f) * 5.9604644775390625e-08f;
  uint b = as_uint(x);
  return as_float((b + 0xfffu + ((b >> 13) & 1u)) & ~0x1fffu);
}"""

# no headers: NVRTC ships none (cuda_fp16.h is the CUDA toolkit's), so half conversions are PTX instructions
CUDA_PRELUDE = """#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)
template <class T, class F> __device__ __forceinline__ T tc_bitcast(F x) { T r; memcpy(&r, &x, sizeof(r)); return r; }
__device__ __forceinline__ float tc_h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short tc_f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float tc_half(float x) { return tc_h2f(tc_f2h(x)); }"""


@dataclass(frozen=True)
class Dialect:
  name: str
  prelude: str
  kernel: str                   # what starts a kernel's definition
  global_space: str             # a buffer argument's qualifier
  shared_space: str             # a work-group array's qualifier
  restrict: str
  ids: dict[str, str]           # SPECIAL kind -> its expression, formatted with {dim} (0, 1, 2) and {xyz}
  barrier: str
  types: dict[DType, str]       # value types (float16 values are floats)
  buffer_types: dict[DType, str]
  load_half: str                # {buf}, {idx}
  store_half: str               # {buf}, {idx}, {value}
  bitcast: str                  # {type}, {src_type}, {value}
  math_suffix: bool             # float math as expf (CUDA) or by overloading (OpenCL)
  int64_suffix: str
  half_round: str = "tc_half"
  vector_memory: bool = False   # vloadN / vstoreN for a vector's consecutive elements (OpenCL: any alignment)


_COMMON_TYPES = {dtypes.bool: "bool", dtypes.int16: "short", dtypes.int32: "int", dtypes.float16: "float",
                 dtypes.float32: "float", dtypes.float64: "double"}
OPENCL = Dialect(
  "OPENCL", "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" + OPENCL_HALF_ROUND, "__kernel void", "__global ",
  "__local ", "restrict",
  {"global": "(int)get_global_id({dim})", "local": "(int)get_local_id({dim})", "group": "(int)get_group_id({dim})"},
  "barrier(CLK_LOCAL_MEM_FENCE);",
  {**_COMMON_TYPES, dtypes.uint8: "uchar", dtypes.int8: "char", dtypes.int64: "long"},
  {dtypes.bool: "uchar", dtypes.float16: "half"},
  "vload_half({idx}, {buf})", "vstore_half_rte({value}, {idx}, {buf});", "as_{type}({value})", False, "L",
  vector_memory=True)
CUDA = Dialect(
  "CUDA", CUDA_PRELUDE, 'extern "C" __global__ void', "", "__shared__ ", "__restrict__",
  {"global": "(int)(blockIdx.{xyz}*blockDim.{xyz}+threadIdx.{xyz})", "local": "(int)threadIdx.{xyz}",
   "group": "(int)blockIdx.{xyz}"},
  "__syncthreads();",
  {**_COMMON_TYPES, dtypes.uint8: "unsigned char", dtypes.int8: "signed char", dtypes.int64: "long long"},
  {dtypes.bool: "unsigned char", dtypes.float16: "unsigned short"},
  "tc_h2f({buf}[{idx}])", "{buf}[{idx}] = tc_f2h({value});", "tc_bitcast<{type}>({value})", True, "LL")
DIALECTS = {"OPENCL": OPENCL, "CUDA": CUDA}


class GPURenderer:
  def __init__(self, program: Program, symbol: str, dialect: Dialect):
    self.program, self.symbol, self.d = program, symbol, dialect
    self.names: dict[int, list[str]] = {}      # id(uop) -> one C expression per lane

  def type(self, dtype: DType) -> str: return self.d.types[dtype]

  def const(self, value, dtype: DType) -> str:
    if dtype == dtypes.bool: return "1" if value else "0"
    if dtype.is_int:
      value, bits = int(value), 8 * dtype.itemsize
      suffix = self.d.int64_suffix if dtype.itemsize == 8 else ""
      # the most negative value has no literal: -2147483648 is the negation of an out-of-range int
      if value == -(2 ** (bits - 1)) and not dtype.is_unsigned: return f"({value + 1}{suffix}-1)"
      return f"({value}{suffix})" if value < 0 else f"{value}{suffix}"
    value = float(value)
    ctype = self.type(dtype)
    if math.isnan(value): return f"(({ctype})NAN)"
    if math.isinf(value): return f"(({ctype}){'-' if value < 0 else ''}INFINITY)"
    if dtype == dtypes.float64: return f"({value!r})" if value < 0 else repr(value)
    text = str(np.float32(value)) + "f"        # a float16 value is exact in float32
    return f"({text})" if value < 0 else text

  def lane(self, u: UOp, i: int) -> str:
    if u.op is UOps.CONST: return self.const(u.arg, u.dtype)
    names = self.names[id(u)]
    return names[i] if len(names) > 1 else names[0]

  def declare(self, u: UOp, prefix: str, exprs: list[str]) -> list[str]:
    """One local per lane holding `exprs`, each rounded to half when u is float16."""
    names = [f"{prefix}{u.num}" + (f"_{i}" if u.vec > 1 else "") for i in range(u.vec)]
    self.names[id(u)] = names
    if u.dtype == dtypes.float16: exprs = [f"{self.d.half_round}({e})" for e in exprs]
    return [f"{self.type(u.dtype)} {n} = {e};" for n, e in zip(names, exprs)]

  def alu(self, u: UOp, s: list[str]) -> str:
    op, dtype = u.arg, u.dtype
    if op is UnaryOps.BITCAST:
      src = u.srcs[0].dtype
      if dtypes.float16 in (dtype, src):
        raise NotImplementedError(f"{self.d.name} renderer: BITCAST between {src.name} and {dtype.name} is not supported")
      return self.d.bitcast.format(type=self.type(dtype), src_type=self.type(src), value=s[0])
    if op in (BinaryOps.DIV, BinaryOps.MOD) and not dtype.is_float and not \
       (u.srcs[1].op is UOps.CONST and u.srcs[1].arg not in (0, -1)):
      # x/0 and x%0 are 0 like numpy; MIN/-1 would overflow the division, -x wraps instead
      if op is BinaryOps.DIV:
        neg = f"{s[1]}==-1 ? -{s[0]} : " if not dtype.is_unsigned else ""
        return f"({s[1]}==0 ? 0 : {neg}{s[0]}/{s[1]})"
      bad = f"{s[1]}==0" + (f" || {s[1]}==-1" if not dtype.is_unsigned else "")
      return f"({bad} ? 0 : {s[0]}%{s[1]})"
    template = OP_INFO[op].c[dtype.category]
    if template is None: raise NotImplementedError(f"{self.d.name} renderer has no rule for {op} on {dtype.name}")
    suffix = "f" if self.d.math_suffix and dtype != dtypes.float64 else ""
    return "(" + template.format(*s, f=suffix, dtype=self.type(dtype)) + ")"

  def address(self, u: UOp, i: int) -> str:
    idx = self.lane(u.srcs[1], 0)
    return idx if u.vec == 1 and (len(u.srcs) < 3 or u.srcs[2].vec == 1) else f"{idx}+{i}"

  def vector_access(self, u: UOp, value: UOp) -> bool:
    """A whole vector of consecutive elements of a global buffer, read or written with one vloadN/vstoreN."""
    buf = u.srcs[0]
    return self.d.vector_memory and value.vec in (2, 4, 8, 16) and buf.op is UOps.DEFINE_GLOBAL and \
      buf.dtype not in (dtypes.bool, dtypes.float16) and (len(u.srcs) == 3 and u.op is UOps.STORE or len(u.srcs) == 2)

  def load(self, u: UOp) -> list[str]:
    buf = u.srcs[0]
    if self.vector_access(u, u):
      self.names[id(u)] = [f"val{u.num}.s{i:x}" for i in range(u.vec)]
      at = f"{self.lane(buf, 0)}+{self.lane(u.srcs[1], 0)}"
      return [f"{self.type(u.dtype)}{u.vec} val{u.num} = vload{u.vec}(0, {at});"]
    exprs = []
    for i in range(u.vec):
      at = self.address(u, i)
      read = self.d.load_half.format(buf=self.lane(buf, 0), idx=at) \
        if buf.op is UOps.DEFINE_GLOBAL and buf.dtype == dtypes.float16 else f"{self.lane(buf, 0)}[{at}]"
      if u.dtype == dtypes.bool: read = f"({read}!=0)"
      if len(u.srcs) == 3: read = f"({self.lane(u.srcs[2], i)} ? {read} : 0)"
      exprs.append(read)
    names = [f"val{u.num}" + (f"_{i}" if u.vec > 1 else "") for i in range(u.vec)]
    self.names[id(u)] = names
    return [f"{self.type(u.dtype)} {n} = {e};" for n, e in zip(names, exprs)]

  def store(self, u: UOp) -> list[str]:
    buf, value = u.srcs[0], u.srcs[2]
    if self.vector_access(u, value):
      lanes = ", ".join(self.lane(value, i) for i in range(value.vec))
      at = f"{self.lane(buf, 0)}+{self.lane(u.srcs[1], 0)}"
      return [f"vstore{value.vec}(({self.type(value.dtype)}{value.vec})({lanes}), 0, {at});"]
    lines = []
    for i in range(value.vec):
      at, v = self.address(u, i), self.lane(value, i)
      if buf.op is UOps.DEFINE_GLOBAL and value.dtype == dtypes.float16:
        lines.append(self.d.store_half.format(buf=self.lane(buf, 0), idx=at, value=v))
      else: lines.append(f"{self.lane(buf, 0)}[{at}] = {v};")
    return lines

  def line(self, u: UOp) -> list[str]:
    op = u.op
    if op is UOps.SPECIAL:
      name, kind, dim = u.arg
      self.names[id(u)] = [name]
      return [f"{self.type(u.dtype)} {name} = {self.d.ids[kind].format(dim=dim, xyz='xyz'[dim])};"]
    if op is UOps.RANGE:
      name, extent = u.arg[0], u.arg[1]
      self.names[id(u)] = [name]
      # [lo, hi) when given (flash attention's blocks a causal tile sees), else [0, extent)
      lo, hi = (self.lane(u.srcs[0], 0), self.lane(u.srcs[1], 0)) if u.srcs else ("0", extent)
      return [f"for ({self.type(u.dtype)} {name} = {lo}; {name} < {hi}; {name}++) {{"]
    if op in (UOps.ENDRANGE, UOps.ENDIF): return ["}"]
    if op is UOps.IF: return [f"if ({self.lane(u.srcs[0], 0)}) {{"]
    if op is UOps.BARRIER: return [self.d.barrier]
    if op in (UOps.DEFINE_LOCAL, UOps.DEFINE_SHARED):
      self.names[id(u)] = [f"local{u.num}"]
      space = self.d.shared_space if op is UOps.DEFINE_SHARED else ""
      return [f"{space}{self.type(u.dtype)} local{u.num}[{max(u.arg, 1)}];"]
    if op is UOps.LOAD: return self.load(u)
    if op is UOps.STORE: return self.store(u)
    if op is UOps.DEFINE_ACC:
      names = [f"acc{u.num}" + (f"_{i}" if u.vec > 1 else "") for i in range(u.vec)]
      self.names[id(u)] = names
      return [f"{self.type(u.dtype)} {n} = {self.const(u.arg, u.dtype)};" for n in names]
    if op is UOps.ASSIGN:
      return [f"{self.lane(u.srcs[0], i)} = {self.lane(u.srcs[1], i)};" for i in range(u.srcs[0].vec)]
    if op is UOps.VECTORIZE:
      self.names[id(u)] = [self.lane(s, 0) for s in u.srcs]
      return []
    if op is UOps.GEP:
      self.names[id(u)] = [self.lane(u.srcs[0], u.arg)]
      return []
    if op is UOps.ALU:
      return self.declare(u, "alu", [self.alu(u, [self.lane(s, i) for s in u.srcs]) for i in range(u.vec)])
    raise NotImplementedError(f"{self.d.name} renderer has no rule for {op}")

  def render(self) -> str:
    params = []
    for g in self.program.globals:
      number, writable = g.arg
      self.names[id(g)] = [f"data{number}"]
      ctype = self.d.buffer_types.get(g.dtype, self.type(g.dtype))
      params.append(f"{self.d.global_space}{'' if writable else 'const '}{ctype}* {self.d.restrict} data{number}")
    body, depth = [], 1
    used = {id(s) for u in self.program.uops for s in u.srcs}
    for u in self.program.uops:
      if u.op in (UOps.DEFINE_GLOBAL, UOps.CONST): continue
      if u.op is UOps.DEFINE_LOCAL and id(u) not in used: continue     # NVRTC warns on an unused array
      if u.op in (UOps.ENDRANGE, UOps.ENDIF): depth -= 1
      body += ["  " * depth + ln for ln in self.line(u)]
      if u.op in (UOps.RANGE, UOps.IF): depth += 1
    return "\n".join([f"{self.d.kernel} {self.symbol}({', '.join(params)}) {{"] + body + ["}"])


def render_gpu_library(programs: list[Program], symbols: list[str], dialect: str = "OPENCL") -> str:
  """One OpenCL program / CUDA module defining each program's kernel under its symbol."""
  d = DIALECTS[dialect]
  return "\n".join([d.prelude, *(GPURenderer(p, s, d).render() for p, s in zip(programs, symbols)), ""])
