"""Linear IR to LLVM IR text.

in: a Program (codegen/linearize.py)
out: an LLVM module (text) with one function `void @<name>(ptr noalias %data0, ..., i64 %start, i64 %end)`;
     [start, end) is the range of the program's parallel loop.
Loops are header/body/exit blocks with a phi for the counter; accumulators live in allocas that
the optimizer promotes to registers (a float SIMD accumulator in one vector alloca). bool is i8 in
memory and i1 in registers. Semantics match the C renderer: guarded integer division, NaN-propagating
max, per-op float16 rounding (LLVM's half). An ALU op is the IRBuilder method or intrinsic the op
table (ops.OP_INFO) names for its dtype, unless one of RULES, (applies, render) pairs tried in order,
says otherwise; EMIT says how each kind of UOp is emitted.
A SIMD value (vec > 1) is rendered as a list of scalars, one per lane: every op then has exactly its
scalar meaning, and LLVM's SLP vectorizer packs the lanes back into vector instructions. Programs
marked `contract` get the `contract` flag on fadd/fmul, so LLVM may form FMAs.
float32 exp2 and log2 are the C renderer's polynomials (POLY_MATH there) built from plain
instructions, on a whole vector at once for SIMD values, instead of libm calls that stay scalar.
"""
from __future__ import annotations
from llvmlite import ir
from tinychad.dtype import VECTOR_FLOATS, DType, dtypes
from tinychad.ops import OP_INFO, COMPARISONS, UnaryOps, BinaryOps
from tinychad.codegen.uops import Program, UOp, UOps

_FLOATS = {dtypes.float16: ir.HalfType(), dtypes.float32: ir.FloatType(), dtypes.float64: ir.DoubleType()}


def reg_type(dtype: DType) -> ir.Type:
  """The type of a value in a register."""
  if dtype == dtypes.bool: return ir.IntType(1)
  return _FLOATS[dtype] if dtype.is_float else ir.IntType(8 * dtype.itemsize)


def mem_type(dtype: DType) -> ir.Type:
  """The type of an element in memory (bool takes a byte)."""
  return ir.IntType(8) if dtype == dtypes.bool else reg_type(dtype)


def const(value, dtype: DType) -> ir.Constant:
  if dtype.is_float:
    # LLVM wants float constants that are exact in their type: round through numpy first
    return ir.Constant(reg_type(dtype), float(dtype.np(value)))
  return ir.Constant(reg_type(dtype), int(value))


def _simd(u: UOp) -> bool:
  """A float SIMD value: its ops with its dtype in the op table's vector_dtypes are LLVM vector
  instructions (the rest go lane by lane)."""
  return u.vec > 1 and u.dtype in VECTOR_FLOATS


def _splat(ty: ir.Type, value) -> ir.Constant:
  """`value` in a scalar type, or in every lane of a vector type."""
  if isinstance(ty, ir.VectorType): return ir.Constant(ty, [ir.Constant(ty.element, value)] * ty.count)
  return ir.Constant(ty, value)


def _int_like(ty: ir.Type) -> ir.Type:
  """i32 or a vector of i32 with as many lanes as the float32 type `ty`."""
  return ir.VectorType(ir.IntType(32), ty.count) if isinstance(ty, ir.VectorType) else ir.IntType(32)


def _horner(b: ir.IRBuilder, x: ir.Value, coeffs: tuple[str, ...]) -> ir.Value:
  """c0 + x*(c1 + x*(c2 + ...)) with the coefficients given as C hex floats."""
  acc = _splat(x.type, float.fromhex(coeffs[-1]))
  for c in reversed(coeffs[:-1]): acc = b.fadd(_splat(x.type, float.fromhex(c)), b.fmul(x, acc))
  return acc


# the coefficients of cstyle.POLY_MATH, whose source explains each step below
_EXP2_COEFFS = ("0x1p0", "0x1.62e43p-1", "0x1.ebfbdep-3", "0x1.c6aef8p-5", "0x1.3b2cb8p-7", "0x1.5f3524p-10", "0x1.424b68p-13")
_LOG2_COEFFS = ("0x1.715476p+1", "0x1.ec709ep-1", "0x1.2776c6p-1", "0x1.a61762p-2", "0x1.484b14p-2", "0x1.0c9a84p-2")


def exp2_f32(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
  """2^x for a float32 scalar or vector, without libm."""
  fty, ity = x.type, _int_like(x.type)
  tiny = b.fcmp_unordered("<=", x, _splat(fty, -150.0))
  c = b.select(tiny, _splat(fty, 0.0), x)
  c = b.select(b.fcmp_ordered("<", c, _splat(fty, 128.0)), c, _splat(fty, 128.0))
  k = b.fsub(b.fadd(c, _splat(fty, 12582912.0)), _splat(fty, 12582912.0))
  p = _horner(b, b.fsub(c, k), _EXP2_COEFFS)
  ki = b.fptosi(k, ity)
  k1 = b.ashr(ki, _splat(ity, 1))
  scales = [b.bitcast(b.shl(b.add(half, _splat(ity, 127)), _splat(ity, 23)), fty) for half in (k1, b.sub(ki, k1))]
  r = b.select(tiny, _splat(fty, 0.0), b.fmul(b.fmul(p, scales[0]), scales[1]))
  return b.select(b.fcmp_unordered("uno", x, x), x, r)


def log2_f32(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
  """log2(x) for a float32 scalar or vector, without libm."""
  fty, ity = x.type, _int_like(x.type)
  denormal = b.fcmp_ordered("<", x, _splat(fty, 2.0 ** -126))
  bits = b.bitcast(b.select(denormal, b.fmul(x, _splat(fty, 2.0 ** 23)), x), ity)
  e = b.sub(b.and_(b.ashr(bits, _splat(ity, 23)), _splat(ity, 255)), b.select(denormal, _splat(ity, 150), _splat(ity, 127)))
  m = b.bitcast(b.or_(b.and_(bits, _splat(ity, 0x7fffff)), _splat(ity, 0x3f800000)), fty)
  big = b.fcmp_ordered(">", m, _splat(fty, float.fromhex("0x1.6a09e6p+0")))
  m = b.select(big, b.fmul(m, _splat(fty, 0.5)), m)
  e = b.add(e, b.zext(big, ity))
  t = b.fdiv(b.fsub(m, _splat(fty, 1.0)), b.fadd(m, _splat(fty, 1.0)))
  r = b.fadd(b.sitofp(e, fty), b.fmul(t, _horner(b, b.fmul(t, t), _LOG2_COEFFS)))
  r = b.select(b.fcmp_ordered("==", x, _splat(fty, float("inf"))), x, r)
  r = b.select(b.fcmp_ordered("==", x, _splat(fty, 0.0)), _splat(fty, float("-inf")), r)
  r = b.select(b.fcmp_unordered("uno", x, x), x, r)
  return b.select(b.fcmp_ordered("<", x, _splat(fty, 0.0)), _splat(fty, float("nan")), r)


_POLY_MATH = {UnaryOps.EXP2: exp2_f32, UnaryOps.LOG2: log2_f32}


class LLVMRenderer:
  def __init__(self, program: Program):
    self.program = program
    self.module = ir.Module(name=program.name)
    fn_type = ir.FunctionType(ir.VoidType(), [ir.PointerType() for _ in program.globals] + [ir.IntType(64)] * 2)
    self.fn = ir.Function(self.module, fn_type, name=program.name)
    self.entry = self.fn.append_basic_block("entry")
    self.b = ir.IRBuilder(self.entry)
    self.values: dict[int, ir.Value] = {}
    self.vectors: dict[int, ir.Value] = {}     # SIMD values that exist as one LLVM vector (packed)
    self.loops: dict[int, tuple] = {}

  def ref(self, u: UOp) -> ir.Value | list[ir.Value]:
    """A scalar's value, or a SIMD value's list of lanes."""
    if u.op is UOps.CONST: return [const(u.arg, u.dtype)] * u.vec if u.vec > 1 else const(u.arg, u.dtype)
    if u.op is UOps.DEFINE_ACC and _simd(u):
      whole = self.accumulator_value(u)
      return [self.b.extract_element(whole, ir.Constant(ir.IntType(32), i)) for i in range(u.vec)]
    if u.op is UOps.DEFINE_ACC:
      lanes = [self.b.load(slot, typ=reg_type(u.dtype)) for slot in self.values[id(u)]]
      return lanes if u.vec > 1 else lanes[0]
    return self.values[id(u)]

  def lane(self, u: UOp, i: int) -> ir.Value:
    """Lane i of u; a scalar is the same in every lane."""
    value = self.ref(u)
    return value[i] if u.vec > 1 else value

  def intrinsic(self, name: str, dtype: DType, args: list[ir.Value]) -> ir.Value:
    fn = self.module.declare_intrinsic(name, [reg_type(dtype)])
    return self.b.call(fn, args)

  def cast(self, x: ir.Value, src: DType, dst: DType) -> ir.Value:
    b, to = self.b, reg_type(dst)
    if src == dst: return x
    if dst == dtypes.bool:
      if src.is_float: return b.fcmp_unordered("!=", x, const(0, src))   # NaN is true, like C
      return b.icmp_unsigned("!=", x, const(0, src))
    if src.is_float and dst.is_float:
      return b.fpext(x, to) if dst.itemsize > src.itemsize else b.fptrunc(x, to)
    if src.is_float: return self.float_to_int(x, dst)
    if dst.is_float: return b.uitofp(x, to) if src.is_unsigned else b.sitofp(x, to)
    if dst.itemsize < src.itemsize: return b.trunc(x, to)
    if dst.itemsize == src.itemsize and src != dtypes.bool: return x    # int8 <-> uint8: same bits
    return b.zext(x, to) if src.is_unsigned else b.sext(x, to)

  def float_to_int(self, x: ir.Value, dst: DType) -> ir.Value:
    """What numpy gets from C on x86: out-of-range values (NaN, inf, negatives to unsigned) are poison
    in LLVM's fptosi/fptoui, so convert as gcc does, with x86's 32- or 64-bit signed conversion
    (out of range gives its minimum), then keep the low bits."""
    wide = ir.IntType(64 if dst.itemsize == 8 else 32)
    converted = self.b.fptosi(x, wide)
    return converted if dst.itemsize * 8 == wide.width else self.b.trunc(converted, reg_type(dst))

  def int_divmod(self, op: BinaryOps, a: ir.Value, d: ir.Value, dtype: DType, divisor: UOp) -> ir.Value:
    """a / d or a % d with C semantics, giving 0 for d == 0 and wrapping MIN / -1 (numpy's answers)."""
    b, signed = self.b, not dtype.is_unsigned
    if divisor.op is UOps.CONST and divisor.arg not in (0, -1):
      if op is BinaryOps.DIV: return b.sdiv(a, d) if signed else b.udiv(a, d)
      return b.srem(a, d) if signed else b.urem(a, d)
    zero, one = const(0, dtype), const(1, dtype)
    bad = b.icmp_unsigned("==", d, zero)
    if signed: bad = b.or_(bad, b.icmp_signed("==", d, const(-1, dtype)))
    safe = b.select(bad, one, d)                 # never divide by 0 or -1: both can trap
    if op is BinaryOps.MOD:
      return b.select(bad, zero, b.srem(a, safe) if signed else b.urem(a, safe))
    q = b.sdiv(a, safe) if signed else b.udiv(a, safe)
    if signed: q = b.select(b.icmp_signed("==", d, const(-1, dtype)), b.neg(a), q)
    return b.select(b.icmp_unsigned("==", d, zero), zero, q)

  def alu(self, u: UOp, s: list[ir.Value]) -> ir.Value:
    """The scalar ALU op `u` over the source values `s`: the first rule of RULES that applies, else the
    op table's spelling for the result's dtype (an IRBuilder method or an intrinsic)."""
    for applies, render in RULES:
      if applies(u): return render(self, u, s)
    spelling = OP_INFO[u.arg].llvm[u.dtype.category]
    if spelling is None: raise NotImplementedError(f"LLVM renderer has no rule for {u.arg} on {u.dtype.name}")
    if spelling.startswith("llvm."): return self.intrinsic(spelling, u.dtype, s)
    return getattr(self.b, spelling)(*s)

  def compare(self, u: UOp, s: list[ir.Value]) -> ir.Value:
    relation, sdt = OP_INFO[u.arg].predicate, u.srcs[0].dtype
    if sdt.is_float:
      # != is unordered so NaN != NaN is true; < and == are ordered, like C
      fcmp = self.b.fcmp_unordered if relation == "!=" else self.b.fcmp_ordered
      return fcmp(relation, s[0], s[1])
    return (self.b.icmp_unsigned if sdt.is_unsigned else self.b.icmp_signed)(relation, s[0], s[1])

  def maximum(self, u: UOp, s: list[ir.Value]) -> ir.Value:
    b = self.b
    if u.dtype.is_float:
      # NaN wins, as in numpy.maximum: a if (a > b or a is NaN) else b
      take_a = b.or_(b.fcmp_ordered(">", s[0], s[1]), b.fcmp_unordered("uno", s[0], s[0]))
      return b.select(take_a, s[0], s[1])
    gt = b.icmp_unsigned(">", s[0], s[1]) if u.dtype.is_unsigned else b.icmp_signed(">", s[0], s[1])
    return b.select(gt, s[0], s[1])

  def load(self, u: UOp, offset: int) -> ir.Value:
    """Element index+offset of the buffer (the lanes of a vector load are consecutive)."""
    b = self.b
    buf, idx = self.ref(u.srcs[0]), self.ref(u.srcs[1])
    if offset: idx = b.add(idx, ir.Constant(idx.type, offset))
    gate = self.ref(u.srcs[2]) if len(u.srcs) == 3 else None
    # a gated load reads element 0 (always allocated) when invalid, then selects 0: no branch, no fault
    if gate is not None: idx = b.select(gate, idx, ir.Constant(idx.type, 0))
    ptr = b.gep(buf, [idx], inbounds=True, source_etype=mem_type(u.dtype))
    val = b.load(ptr, typ=mem_type(u.dtype))
    if u.dtype == dtypes.bool: val = b.icmp_unsigned("!=", val, ir.Constant(ir.IntType(8), 0))
    return val if gate is None else b.select(gate, val, const(0, u.dtype))

  def store(self, u: UOp) -> None:
    buf, idx = self.ref(u.srcs[0]), self.ref(u.srcs[1])
    dtype = u.srcs[2].dtype
    if u.arg == "stream":
      # one vector store flagged !nontemporal, aligned to its whole size (linearize.py proved it is)
      self.width = u.srcs[2].vec
      value = self.packed(u.srcs[2])
      ptr = self.b.gep(buf, [idx], inbounds=True, source_etype=mem_type(dtype))
      store = self.b.store(value, ptr, align=u.srcs[2].vec * dtype.itemsize)
      store.set_metadata("nontemporal", self.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
      return
    for i in range(u.srcs[2].vec):
      val = self.lane(u.srcs[2], i)
      if dtype == dtypes.bool: val = self.b.zext(val, ir.IntType(8))
      at = self.b.add(idx, ir.Constant(idx.type, i)) if i else idx
      self.b.store(val, self.b.gep(buf, [at], inbounds=True, source_etype=mem_type(dtype)))

  def open_loop(self, u: UOp) -> None:
    b, ity = self.b, reg_type(u.dtype)
    name, extent, parallel, _ = u.arg
    start, end = self.fn.args[-2:]
    lo, hi = (b.trunc(start, ity), b.trunc(end, ity)) if parallel and ity.width < 64 else (start, end) if parallel else \
      (self.ref(u.srcs[0]), self.ref(u.srcs[1])) if u.srcs else (ir.Constant(ity, 0), ir.Constant(ity, extent))
    pre = b.block
    header = self.fn.append_basic_block(f"{name}_head")
    body = self.fn.append_basic_block(f"{name}_body")
    exit_ = self.fn.append_basic_block(f"{name}_exit")
    b.branch(header)
    b.position_at_end(header)
    counter = b.phi(ity, name=name)
    counter.add_incoming(lo, pre)
    b.cbranch(b.icmp_signed("<", counter, hi), body, exit_)
    b.position_at_end(body)
    self.values[id(u)] = counter
    self.loops[id(u)] = (header, exit_, counter)

  def close_loop(self, loop: UOp) -> None:
    b = self.b
    header, exit_, counter = self.loops[id(loop)]
    counter.add_incoming(b.add(counter, ir.Constant(counter.type, 1)), b.block)
    b.branch(header)
    b.position_at_end(exit_)

  # -- float SIMD values (and an integer one a streaming store writes) as LLVM vectors: the lanes stay
  #    available as extracts, which fold away --
  def packed(self, u: UOp) -> ir.Value:
    """u as one LLVM vector of `vec` lanes (a scalar is splatted)."""
    if id(u) in self.vectors: return self.vectors[id(u)]
    if u.op is UOps.DEFINE_ACC and _simd(u): return self.accumulator_value(u)
    lanes = [self.lane(u, i) for i in range(self.width)]
    vec = ir.Constant(ir.VectorType(reg_type(u.dtype), self.width), ir.Undefined)
    for i, x in enumerate(lanes): vec = self.b.insert_element(vec, x, ir.Constant(ir.IntType(32), i))
    if u.vec > 1 and u.op is not UOps.DEFINE_ACC: self.vectors[id(u)] = vec
    return vec

  def vector_accumulator(self, u: UOp) -> None:
    """A float SIMD accumulator as one vector alloca, so its loop-carried value is one vector phi. One
    alloca per lane became 16 scalar phis per accumulator, which the SLP vectorizer gave up on for a
    6x64 tile's 24 accumulators: lanes shuffled through the stack, 8 GFLOP/s instead of ~280."""
    vtype = ir.VectorType(reg_type(u.dtype), u.vec)
    with self.b.goto_block(self.entry):
      self.b.position_at_start(self.entry)
      slot = self.b.alloca(vtype, name=f"acc{u.num}")
    self.values[id(u)] = slot
    self.b.store(ir.Constant(vtype, [const(u.arg, u.dtype)] * u.vec), slot)

  def accumulator_value(self, u: UOp) -> ir.Value:
    """The current value of a vector accumulator (read fresh: an ASSIGN may have changed it)."""
    return self.b.load(self.values[id(u)], typ=ir.VectorType(reg_type(u.dtype), u.vec))

  def unpack(self, u: UOp, vec: ir.Value) -> None:
    self.vectors[id(u)] = vec
    self.values[id(u)] = [self.b.extract_element(vec, ir.Constant(ir.IntType(32), i)) for i in range(u.vec)]

  def simd_load(self, u: UOp) -> None:
    buf, idx = self.ref(u.srcs[0]), self.ref(u.srcs[1])
    vtype = ir.VectorType(reg_type(u.dtype), u.vec)
    ptr = self.b.gep(buf, [idx], inbounds=True, source_etype=mem_type(u.dtype))
    self.unpack(u, self.b.load(ptr, typ=vtype, align=u.dtype.itemsize))

  @staticmethod
  def simd_op(u: UOp) -> bool:
    """Whether ALU op u (a float SIMD value) is emitted as vector instructions."""
    return u.dtype in OP_INFO[u.arg].vector_dtypes or (u.dtype == dtypes.float32 and u.arg in _POLY_MATH)

  def simd_alu(self, u: UOp) -> None:
    self.width = u.vec
    srcs = [self.packed(x) for x in u.srcs]
    if u.arg in _POLY_MATH: out = _POLY_MATH[u.arg](self.b, srcs[0])
    else: out = getattr(self.b, OP_INFO[u.arg].llvm[u.dtype.category])(*srcs)
    self.unpack(u, out)

  def vector(self, u: UOp, make) -> ir.Value | list[ir.Value]:
    """make(lane) for every lane of u: a list for a SIMD value, else the one scalar."""
    return [make(i) for i in range(u.vec)] if u.vec > 1 else make(0)

  def load_value(self, u: UOp) -> None:
    if _simd(u) and len(u.srcs) == 2: self.simd_load(u)
    else: self.values[id(u)] = self.vector(u, lambda i: self.load(u, i))

  def alu_value(self, u: UOp) -> None:
    if _simd(u) and self.simd_op(u) and all(x.dtype == u.dtype for x in u.srcs): self.simd_alu(u)
    else: self.values[id(u)] = self.vector(u, lambda i: self.alu(u, [self.lane(x, i) for x in u.srcs]))

  def shuffle(self, u: UOp) -> None:
    """Lanes picked from two vectors: one shufflevector where they are LLVM vectors, else the lane lists permuted."""
    if _simd(u):
      self.width = u.vec
      mask = ir.Constant(ir.VectorType(ir.IntType(32), u.vec), list(u.arg))
      self.unpack(u, self.b.shuffle_vector(self.packed(u.srcs[0]), self.packed(u.srcs[1]), mask))
    else:
      lanes = self.ref(u.srcs[0]) + self.ref(u.srcs[1])
      self.values[id(u)] = [lanes[i] for i in u.arg]

  def define_local(self, u: UOp) -> None:
    with self.b.goto_block(self.entry):
      self.b.position_at_start(self.entry)
      # in the entry block with a constant count: a fixed slot in the frame, like a C array
      self.values[id(u)] = self.b.alloca(mem_type(u.dtype), size=ir.Constant(ir.IntType(64), u.arg), name=f"local{u.num}")
      self.values[id(u)].align = 64

  def define_acc(self, u: UOp) -> None:
    if _simd(u): return self.vector_accumulator(u)
    # allocas go in the entry block so mem2reg/SROA can promote them
    with self.b.goto_block(self.entry):
      self.b.position_at_start(self.entry)
      slots = [self.b.alloca(reg_type(u.dtype), name=f"acc{u.num}_{i}") for i in range(u.vec)]
    self.values[id(u)] = slots
    for slot in slots: self.b.store(const(u.arg, u.dtype), slot)

  def assign(self, u: UOp) -> None:
    if _simd(u.srcs[0]):
      self.width = u.vec
      self.b.store(self.packed(u.srcs[1]), self.values[id(u.srcs[0])])
    else:
      for i, slot in enumerate(self.values[id(u.srcs[0])]): self.b.store(self.lane(u.srcs[1], i), slot)

  def render(self) -> str:
    for arg, g in zip(self.fn.args, self.program.globals):
      arg.add_attribute("noalias")
      self.values[id(g)] = arg
    for u in self.program.uops:
      if u.op in (UOps.DEFINE_GLOBAL, UOps.CONST): continue
      if u.op not in EMIT: raise NotImplementedError(f"LLVM renderer has no rule for {u.op}")
      EMIT[u.op](self, u)
    if any(u.op is UOps.STORE and u.arg == "stream" for u in self.program.uops):
      # streaming stores are weakly ordered: drain them before the call returns
      fence = self.module.globals.get("llvm.x86.sse.sfence") or ir.Function(self.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse.sfence")
      self.b.call(fence, [])
    self.b.ret_void()
    text = str(self.module)
    # llvmlite's builder can't flag one instruction; a float sum already split into partial sums may
    # fuse a*b+c into one FMA, as the C device allows with -ffp-contract=fast
    if self.program.contract:
      for op in ("fadd", "fmul"): text = text.replace(f" = {op} ", f" = {op} contract ")
    return text


# how each kind of UOp is emitted
EMIT = {UOps.RANGE: LLVMRenderer.open_loop, UOps.ENDRANGE: lambda r, u: r.close_loop(u.srcs[0]),
        UOps.LOAD: LLVMRenderer.load_value, UOps.ALU: LLVMRenderer.alu_value, UOps.STORE: LLVMRenderer.store,
        UOps.VECTORIZE: lambda r, u: r.values.__setitem__(id(u), [r.ref(x) for x in u.srcs]),
        UOps.GEP: lambda r, u: r.values.__setitem__(id(u), r.ref(u.srcs[0])[u.arg]), UOps.SHUFFLE: LLVMRenderer.shuffle,
        UOps.DEFINE_LOCAL: LLVMRenderer.define_local, UOps.DEFINE_ACC: LLVMRenderer.define_acc,
        UOps.ASSIGN: LLVMRenderer.assign}


def _int_recip(r: LLVMRenderer, u: UOp, s: list[ir.Value]) -> ir.Value:
  return r.int_divmod(BinaryOps.DIV, const(1, u.dtype), s[0], u.dtype, u.srcs[0])


# ALU rules: what the op table can't spell, as (applies(uop), render) pairs tried in order
RULES = (
  (lambda u: u.arg is UnaryOps.CAST, lambda r, u, s: r.cast(s[0], u.srcs[0].dtype, u.dtype)),
  (lambda u: u.arg is UnaryOps.BITCAST, lambda r, u, s: r.b.bitcast(s[0], reg_type(u.dtype))),
  (lambda u: u.arg in COMPARISONS, LLVMRenderer.compare),
  # float32 exp2 and log2: the C renderer's polynomials, not libm calls
  (lambda u: u.dtype == dtypes.float32 and u.arg in _POLY_MATH, lambda r, u, s: _POLY_MATH[u.arg](r.b, s[0])),
  (lambda u: u.arg is UnaryOps.RECIP and u.dtype.is_float, lambda r, u, s: r.b.fdiv(const(1, u.dtype), s[0])),
  (lambda u: u.arg is BinaryOps.MAX and u.dtype.category > 0, LLVMRenderer.maximum),
  # integer division, remainder and reciprocal: C's, with numpy's answers for 0 and MIN / -1
  (lambda u: u.arg in (BinaryOps.DIV, BinaryOps.MOD) and u.dtype.is_int,
   lambda r, u, s: r.int_divmod(u.arg, s[0], s[1], u.dtype, u.srcs[1])),
  (lambda u: u.arg is UnaryOps.RECIP and u.dtype.is_int, _int_recip),
  (lambda u: u.arg is UnaryOps.NEG and u.dtype == dtypes.bool, lambda r, u, s: r.b.xor(s[0], const(1, u.dtype))),
  (lambda u: u.arg is UnaryOps.TRUNC and not u.dtype.is_float, lambda r, u, s: s[0]),
)


def render_llvm(program: Program) -> str:
  """LLVM IR text of a module holding the program's one function."""
  return LLVMRenderer(program).render()
