"""The code generator's pieces on their own: symbolic simplification, IR, rendering, names.

in: hand-made symbolic expressions and kernels built from LazyBuffers
out: pass when simplifications give the expected forms (and stay numerically right), the IR
     prints one instruction per line, kernels get the scheduler's names and errors name the kernel.
"""
import itertools
import numpy as np
import pytest
from tinychad import Tensor
from tinychad.codegen import linearize, UOps
from tinychad.codegen.symbolic import Var, Num, Node, constant_difference, plus_constant
from tinychad.dtype import dtypes
from tinychad.engine.schedule import EXPANSIONS, create_schedule
from tinychad.host import simd_bytes
from tinychad.lazy import LazyBuffer
from tinychad.ops import OP_INFO, BinaryOps, ReduceOps, TernaryOps, UnaryOps, BufferOps, KernelNode
from tinychad.renderer.cstyle import render_c, render_const
from tinychad.renderer.llvmir import render_llvm
from tinychad.runtime.cc import CompileError, compile_c
from tinychad.view import ShapeTracker

i, j, k = Var("i", 0, 9), Var("j", 0, 3), Var("k", 0, 5)

# expression -> the rendering it must simplify to
SIMPLIFY = [
  (i * 1, "i"), (i + 0, "i"), (i * 0, "0"), (Num(3) * 4 + 2, "14"),
  ((i * 4 + j) // 4, "i"), ((i * 4 + j) % 4, "j"), ((j * 6 + k) // 6, "j"), ((j * 6 + k) % 6, "k"),
  (j // 4, "0"), (j % 4, "j"), ((i * 8 + j * 2) // 2, "((i*4)+j)"), ((i * 12 + j * 3) % 3, "0"),
  ((i * 7 // 2) // 5, "((i*7)/10)"), ((i % 6) % 3, "(i%3)"), (i * 2 + i * 3, "(i*5)"), (i - i, "0"),
  ((i * 4 + j + 4) // 4, "(i+1)"), (j < 4, "1"), (j < 0, "0"), (j >= 0, "1"), (i + 3 < 5, "(i<2)"),
  (i * 3 < 7, "(i<3)"), (i * -1 < -2, "(i>=3)"), ((i < 5) & (j >= 1) & (i < 5), "((i<5)&&(j>=1))"),
  ((i < 5) & False, "0"), ((i < 5) & True, "(i<5)"),
]


@pytest.mark.parametrize("expr,want", SIMPLIFY, ids=[w for _, w in SIMPLIFY])
def test_simplify(expr, want):
  assert expr.render() == want


def _eval(node: Node, env: dict) -> int:
  # C semantics equal Python's on the non-negative values these tests use
  return int(eval(node.render().replace("&&", " and ").replace("/", "//"), {}, env))


def test_simplified_forms_keep_their_values():
  exprs = [((i * 4 + j) // 4), ((i * 4 + j) % 4), ((i * 6 + k + 7) // 3), ((i * 6 + k + 7) % 3),
           ((i * 4 + j) // 2 % 5), (i * 2 + 3 >= 9)]
  raw = [lambda a, b, c: (a * 4 + b) // 4, lambda a, b, c: (a * 4 + b) % 4, lambda a, b, c: (a * 6 + c + 7) // 3,
         lambda a, b, c: (a * 6 + c + 7) % 3, lambda a, b, c: (a * 4 + b) // 2 % 5, lambda a, b, c: int(a * 2 + 3 >= 9)]
  for e, f in zip(exprs, raw):
    for a, b, c in itertools.product(range(10), range(4), range(6)):
      assert _eval(e, {"i": a, "j": b, "k": c}) == f(a, b, c), e


def test_bounds():
  e = i * 4 + j
  assert (e.lo, e.hi) == (0, 39)
  assert ((e // 4).lo, (e // 4).hi) == (0, 9)


@pytest.mark.parametrize("node", [i * 4 + j * 2 + 5, i * 4 + j, i * 3, i, Num(7), i * 2 - 3, (i * 4 + j) // 3 + k])
@pytest.mark.parametrize("k_", [0, 1, -5, 16])
def test_a_constant_added_or_told_apart_as_sums_would(node, k_):
  """An unrolled lane's index is lane 0's plus a constant: plus_constant builds what `+` builds, and
  constant_difference finds the constant without building the subtraction."""
  assert plus_constant(node, k_).key == (node + k_).key and plus_constant(node, k_).render() == (node + k_).render()
  assert constant_difference(node + k_, node) == k_ and constant_difference(plus_constant(node, k_), node) == k_
  assert constant_difference(node + i * 2, node) is None


def _items(lb):
  return [it for it in create_schedule([lb]) if it.is_kernel]


def test_kernel_names_and_flat_loops(monkeypatch):
  monkeypatch.setenv("NOOPT", "1")    # plain loops: no SIMD lanes
  x = LazyBuffer.from_numpy(np.zeros((64, 64), np.float32), "NUMPY")
  (item,) = _items(x.e(BinaryOps.ADD, x))
  prog = linearize(item.ast, item.name)
  assert item.name == "E_64_64" and prog.name == "E_64_64"
  # contiguous 2-d elementwise merges into one loop of 4096, which threads may split
  assert [u.arg for u in prog.uops if u.op is UOps.RANGE] == [("gidx0", 4096, True, 1)]
  assert prog.parallel == 4096
  (item,) = _items(x.r(ReduceOps.SUM, (1,)))
  assert item.name == "r_64_64"
  assert [u.arg for u in linearize(item.ast, item.name).uops if u.op is UOps.RANGE] == [("gidx0", 64, True, 1), ("ridx0", 64, False, 1)]


def test_ir_pretty_and_sources():
  x = LazyBuffer.from_numpy(np.zeros((4, 5), np.float32), "NUMPY")
  (item,) = _items(x.pad(((1, 0), (0, 0))).r(ReduceOps.MAX, (0,)))
  prog = linearize(item.ast, item.name)
  text = prog.pretty()
  assert text.splitlines()[0] == f"kernel {item.name}"
  assert len(text.splitlines()) == len(prog.uops) + 1
  for word in ("DEFINE_GLOBAL", "RANGE", "DEFINE_ACC", "LOAD", "ASSIGN", "STORE", "ENDRANGE"): assert word in text
  c = render_c(prog)
  assert f"void {item.name}(float* restrict data0, const float* restrict data1, long long start, long long end)" in c
  assert "? *(data1+" in c and "-INFINITY" in c
  assert f'define void @"{item.name}"' in render_llvm(prog)


def test_only_kernels_with_signed_integer_arithmetic_wrap():
  """-fwrapv (numpy's wrapping overflow) only for a kernel whose signed integers may overflow: index arithmetic
  never does, and gcc steps its pointers better without the flag."""
  from tinychad.runtime.cc import WRAP_FLAG, WRAPS_MARKER, compile_flags
  st = ShapeTracker.from_shape((64,))
  def kernel(op, dtype):
    load = KernelNode(BufferOps.LOAD, (), (1, st), dtype)
    return KernelNode(BufferOps.STORE, (KernelNode(op, (load, load), None, dtype),), (0, st), dtype)
  for op, dtype, wraps in ((BinaryOps.ADD, dtypes.float32, False), (BinaryOps.MAX, dtypes.int32, False),
                           (BinaryOps.ADD, dtypes.uint8, False), (BinaryOps.ADD, dtypes.int32, True),
                           (BinaryOps.MUL, dtypes.int64, True)):
    prog = linearize(kernel(op, dtype), "E_64")
    source = render_c(prog)
    assert prog.wraps == wraps and (WRAPS_MARKER in source) == wraps, (op, dtype)
    assert (WRAP_FLAG in compile_flags(source=source)) == wraps, (op, dtype)
  x = np.array([2**31 - 1, -2**31], np.int32)
  np.testing.assert_array_equal((Tensor(x) + Tensor(x)).numpy(), x + x)   # wraps on the CPU device, as numpy does


def test_large_kernels_use_64bit_indices():
  big = (70000, 40000)     # 2.8e9 elements: too many for int indices
  st = ShapeTracker.from_shape(big)
  load = KernelNode(BufferOps.LOAD, (), (1, st), dtypes.float32)
  ast = KernelNode(BufferOps.STORE, (KernelNode(UnaryOps.NEG, (load,), None, dtypes.float32),), (0, st), dtypes.float32)
  prog = linearize(ast, "E_big")
  assert {u.dtype for u in prog.uops if u.op is UOps.RANGE} == {dtypes.int64}
  assert "long long gidx0" in render_c(prog)
  small = ShapeTracker.from_shape((10,))
  ast = KernelNode(BufferOps.STORE, (KernelNode(BufferOps.LOAD, (), (1, small), dtypes.float32),), (0, small), dtypes.float32)
  assert "int gidx0" in render_c(linearize(ast, "E_10"))


def test_c_constants():
  assert render_const(float("inf"), dtypes.float32) == "((float)INFINITY)"
  assert render_const(-(2 ** 63), dtypes.int64) == "(-9223372036854775807LL-1)"
  assert render_const(0.1, dtypes.float32) == "0.1f"
  assert render_const(True, dtypes.bool) == "1"
  assert render_const(0.5, dtypes.float16) == "((_Float16)0.5f)"


def test_op_table_covers_every_alu_and_reduce_op():
  # an op added to the enums without its table entry would fail in a renderer or the numpy device
  ops = [*UnaryOps, *BinaryOps, *TernaryOps, *ReduceOps]
  assert set(OP_INFO) == set(ops)
  for op in ops:
    info = OP_INFO[op]
    if op in EXPANSIONS:   # a composite (erf): the scheduler expands it, so no device spells it
      assert info.numpy is None and info.c == (None, None, None) and info.llvm == (None, None, None), op
      continue
    assert info.numpy is not None or op in (UnaryOps.CAST, UnaryOps.BITCAST), op
    assert (info.identity is not None) == isinstance(op, ReduceOps), op
    if isinstance(op, ReduceOps) or op is UnaryOps.BITCAST: continue
    # every ALU op but BITCAST (a memcpy line) has a C spelling for floats (the libm ones only there)
    assert info.c[2] is not None, op


def test_compile_error_names_the_kernel():
  with pytest.raises(CompileError, match="kernel broken_kernel"):
    compile_c("void broken_kernel(float* d) { d[0] = ; }", "broken_kernel")


def test_debug_prints_tree_ir_and_source(monkeypatch, capsys):
  monkeypatch.setenv("DEBUG", "4")
  x = LazyBuffer.from_numpy(np.arange(6, dtype=np.float32) + 0.25, "CPU")
  Tensor(x.e(UnaryOps.SQRT).e(BinaryOps.ADD, LazyBuffer.full(1.0, (6,), dtypes.float32, "CPU"))).numpy()
  out = capsys.readouterr().out
  assert "STORE float32" in out and "kernel E_6" in out and "sqrtf(" in out


def _ulps(actual: np.ndarray, exact: np.ndarray) -> float:
  """Largest distance of float32 results from float64 exact values, in float32 units in the last place
  (the smallest denormal step below the normal range)."""
  step = np.maximum(np.spacing(np.abs(exact).astype(np.float32)), np.float32(2.0 ** -149)).astype(np.float64)
  return float(np.max(np.abs(actual.astype(np.float64) - exact) / step))


_RNG = np.random.default_rng(7)
# (op, numpy function, inputs: the whole float32 range incl. denormals, specials, max ulps allowed)
POLY_CASES = [
  (UnaryOps.EXP2, np.exp2, np.concatenate([_RNG.uniform(-160, 130, 200_000), _RNG.uniform(-1, 1, 50_000),
                                          np.arange(-150, 129), np.arange(-150, 129) + 0.5]), 2),
  (UnaryOps.LOG2, np.log2, np.concatenate([np.exp2(_RNG.uniform(-149, 128, 200_000)), _RNG.uniform(0.5, 2, 50_000),
                                          np.exp2(np.arange(-149.0, 128.0))]), 3),
]
POLY_SPECIALS = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1.0, -1.0, 128.0, -150.0, 1e-45, 3.4e38, 2.0 ** -126], np.float32)


@pytest.mark.parametrize("noopt", [False, True], ids=["simd", "scalar"])
@pytest.mark.parametrize("device", ["CPU", "LLVM"])
@pytest.mark.parametrize("op, np_fn, inputs, max_ulps", POLY_CASES, ids=["exp2", "log2"])
def test_float32_exp2_log2_polynomials(op, np_fn, inputs, max_ulps, device, noopt, set_noopt):
  if noopt: set_noopt("1")
  x = inputs.astype(np.float32)
  x = x[:len(x) // 16 * 16]                  # a whole number of SIMD lanes
  out = Tensor(LazyBuffer.from_numpy(x, device).e(op)).numpy()
  with np.errstate(all="ignore"): exact = np_fn(x.astype(np.float64))
  finite = np.abs(exact) < float(np.finfo(np.float32).max)
  assert _ulps(out[finite], exact[finite]) <= max_ulps
  assert np.all(np.isinf(out[~finite]) & (np.sign(out[~finite]) == np.sign(exact[~finite])))
  with np.errstate(all="ignore"): want = np_fn(POLY_SPECIALS)
  got = Tensor(LazyBuffer.from_numpy(POLY_SPECIALS, device).e(op)).numpy()
  np.testing.assert_allclose(got, want, rtol=3e-7, atol=0)     # NaN where numpy has NaN, inf and 0 exactly


def test_float32_exp2_is_vectorizable_float64_keeps_libm(monkeypatch):
  monkeypatch.delenv("NOOPT", raising=False)    # the point is the vectorized kernel
  x = LazyBuffer.from_numpy(np.zeros(64, np.float32), "NUMPY")
  (item,) = _items(x.e(UnaryOps.EXP2).e(UnaryOps.LOG2))
  source = render_c(linearize(item.ast, item.name))
  # SIMD values go through the vector polynomials, no libm function
  vector = f"float32x{simd_bytes() // 4}"
  assert f"tc_exp2f_{vector}(" in source and f"tc_log2f_{vector}(" in source
  assert "exp2f(" not in source.replace("tc_exp2f", "")
  (item,) = _items(LazyBuffer.from_numpy(np.zeros(64, np.float64), "NUMPY").e(UnaryOps.EXP2))
  source = render_c(linearize(item.ast, item.name))
  assert "exp2(" in source and "tc_exp2f" not in source


def test_the_libm_functions_the_op_table_spells_are_declared():
  """The C kernels declare the libm functions they call instead of including <math.h> (renderer/cstyle.py): each
  function the op table spells must have a prototype, and a kernel declares only the ones it calls."""
  import re
  from tinychad.ops import OP_INFO
  from tinychad.renderer.cstyle import LIBM_PROTOTYPES
  spelled = {name + suffix for info in OP_INFO.values() for text in (info.c or ()) if text
             for name in re.findall(r"(\w+)\{f\}\(", text) for suffix in ("f", "")}
  assert spelled and spelled <= set(LIBM_PROTOTYPES), spelled - set(LIBM_PROTOTYPES)
  (item,) = _items(LazyBuffer.from_numpy(np.ones(64, np.float64), "NUMPY").e(UnaryOps.SQRT))
  source = render_c(linearize(item.ast, item.name))
  assert LIBM_PROTOTYPES["sqrt"] in source and LIBM_PROTOTYPES["sinf"] not in source and "<math.h>" not in source


def test_vector_sqrt_is_one_instruction_per_vector(monkeypatch):
  """A SIMD op without a vector operator in C (sqrt) is written as the vector's initializer, one expression per
  lane, which the compiler turns into one vector instruction; on x86 the built code holds no scalar sqrt (a loop
  over the lanes stayed scalar with gcc: AdamW's update kernel ran 3x as long). Its results are numpy's."""
  import platform
  import subprocess
  from tinychad.runtime.cc import compile_flags, find_c_compiler
  monkeypatch.delenv("NOOPT", raising=False)
  x = np.random.default_rng(0).random(4096).astype(np.float32)
  (item,) = _items(LazyBuffer.from_numpy(x, "NUMPY").e(UnaryOps.SQRT))
  source = render_c(linearize(item.ast, item.name))
  assert f"float32x{simd_bytes() // 4}" in source and "for (int l" not in source
  np.testing.assert_array_equal(Tensor(LazyBuffer.from_numpy(x, "CPU").e(UnaryOps.SQRT)).numpy(), np.sqrt(x))
  cc = find_c_compiler()
  if platform.machine() in ("x86_64", "AMD64") and simd_bytes() >= 16 and cc is not None:
    flags = [f for f in compile_flags(False, source, cc) if f not in ("-shared", "-fPIC") and not f.startswith("-Wl")]
    asm = subprocess.run([cc, *flags, "-S", "-x", "c", "-", "-o", "-"], input=source.encode(), capture_output=True,
                         check=True).stdout.decode()
    assert "sqrtps" in asm and "sqrtss" not in asm and "sqrtf" not in asm


@pytest.mark.parametrize("op", [UnaryOps.EXP2, UnaryOps.LOG2])
def test_vector_math_matches_scalar_math_bit_for_bit(op, monkeypatch):
  """The vector polynomials (4096 elements: SIMD lanes) give exactly the scalar ones' bits (4095: an
  odd size, so no vector axis), special values and denormals included."""
  monkeypatch.delenv("NOOPT", raising=False)
  rng = np.random.default_rng(0)
  special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 1e-40, 1.17e-38, -1.0, 127.9, 128.0, -149.5,
                      -150.5, 1.0, 2.0, 0.5, 1.4142135, 3e38], np.float32)
  values = np.concatenate([special, rng.normal(0, 30, 2000).astype(np.float32),
                           np.exp(rng.uniform(-100, 88, 4096 - 2018)).astype(np.float32)])

  def run(array):
    return Tensor(LazyBuffer.from_numpy(array, "CPU").e(op)).numpy()
  vector, scalar = run(values), run(values[:4095])
  (item,) = _items(LazyBuffer.from_numpy(values, "NUMPY").e(op))
  assert f"float32x{simd_bytes() // 4}" in render_c(linearize(item.ast, "k"))
  np.testing.assert_array_equal(vector[:4095].view(np.int32), scalar.view(np.int32))


def test_no_fused_multiply_add_where_floats_are_compared(monkeypatch):
  """A max's gradient counts the inputs equal to the max: when the input is recomputed there (a cheap
  x*a+b), an FMA would round it differently from the kernel that took the max, no input would
  match, and the count would be 0 (0/0 = NaN, seen in a batchnorm -> max-pool training step)."""
  monkeypatch.delenv("NOOPT", raising=False)
  rng = np.random.default_rng(0)
  x, a, b = (LazyBuffer.from_numpy(rng.standard_normal((64, 256)).astype(np.float32), "NUMPY") for _ in range(3))
  y = x.e(BinaryOps.MUL, a).e(BinaryOps.ADD, b)
  top = y.r(ReduceOps.MAX, (1,))
  hits = y.e(BinaryOps.CMPEQ, top.expand(y.shape)).cast(dtypes.float32).r(ReduceOps.SUM, (1,))
  (item,) = [it for it in _items(hits) if it.ast.srcs[0].op is ReduceOps.SUM or any(n.op is BinaryOps.CMPEQ for n in it.ast.walk())]
  assert not linearize(item.ast, item.name).contract
  # a plain float sum (a matmul) still may contract
  (matmul,) = _items(x.reshape((64, 256, 1)).e(BinaryOps.MUL, a.reshape((1, 64, 256)).permute((1, 2, 0))).r(ReduceOps.SUM, (1,)))
  assert linearize(matmul.ast, matmul.name).contract


# row reduces whose second pass needs a costly value of the reduce loop: softmax (rows SIMD lanes divide,
# odd rows that get scalar loops, a row over two axes that don't merge, float64), a sigmoid's share
# (exp and a reciprocal) and an exp read twice by the store. Each row is longer than the lanes of one
# step of the reduce loop: a row they cover whole needs no scratch row (its pass has no loop)
ROW_PASSES = {
  "softmax": ((64, 256), np.float32, lambda x: x.softmax(1)),
  "odd-rows": ((3, 19, 37), np.float32, lambda x: x.softmax(-1)),
  "two-axes": ((32, 16, 50), np.float32, lambda x: _normalized(x[:, :, :48].exp(), (1, 2))),
  "float64": ((16, 128), np.float64, lambda x: x.softmax(1)),
  "sigmoid-share": ((32, 96), np.float32, lambda x: _normalized(x.sigmoid(), (1,))),
  "exp-read-twice": ((32, 256), np.float32, lambda x: x.exp() * x.exp() / x.exp().sum(1, keepdim=True)),
}


def _normalized(x, axes):
  return x / x.sum(axes, keepdim=True)


def _exp_count(program) -> int:
  return sum(u.op is UOps.ALU and u.arg is UnaryOps.EXP2 for u in program.uops)


@pytest.mark.parametrize("case", ROW_PASSES, ids=list(ROW_PASSES))
@pytest.mark.parametrize("noopt", ["0", "1"])
def test_row_pass_reads_back_what_its_reduce_computed(case, noopt, set_noopt):
  """The row pass of a row reduce kernel loads the costly values (an exp) that its reduce loop wrote to
  a scratch row, instead of computing them again: half the exps, the same results as the NUMPY device
  and as a kernel lowered without the scratch row. NOOPT=1 computes them twice."""
  from dataclasses import replace
  from tinychad.codegen.opt import choose_opts
  from tinychad.codegen.linearize import opt_inputs
  set_noopt(noopt)
  shape, dtype, build = ROW_PASSES[case]
  x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
  want = build(Tensor(x, device="NUMPY")).numpy()
  tol = 1e-5 if dtype == np.float32 else 1e-12
  for device in ("CPU", "LLVM"):
    np.testing.assert_allclose(build(Tensor(x, device=device)).numpy(), want, rtol=tol, atol=tol, err_msg=device)
  item = build(Tensor(x, device="CPU")).schedule()[-1]
  assert item.ast.srcs[0].op is not ReduceOps.SUM       # the row kernel: the sum and the row's store
  opts = choose_opts(*opt_inputs(item.ast))
  cached, plain = linearize(item.ast, item.name, opts), linearize(item.ast, item.name, replace(opts, cache_rows=False))
  scratch = [u for u in cached.uops if u.op is UOps.DEFINE_LOCAL]
  if noopt == "1":
    assert not opts.cache_rows and not scratch
    return
  assert len(scratch) == 1 and _exp_count(plain) == 2 * _exp_count(cached) > 0
  # one whole row: every reduce position (no tile of several rows here)
  assert scratch[0].arg == np.prod([size for size, is_reduce in opt_inputs(item.ast)[0] if is_reduce])


@pytest.mark.parametrize("op", [BinaryOps.ADD, BinaryOps.MAX])
def test_reduce_lanes_of_several_outputs_fold_together(op):
  """reduce.py's _fold_together: k vectors of v partial results, each folded to its output, merged pairwise by
  shuffles (a vector without a partner merged with itself), for every k up to 9 and v = 4, 8, 16; checked by
  evaluating the UOps, and counted: one lane read per output, and fewer ops than folding each alone (k v lane reads
  and k (v - 1) scalar ops)."""
  from tinychad.codegen.emit import Emitter
  from tinychad.codegen.reduce import _fold_together
  combine = {BinaryOps.ADD: np.add, BinaryOps.MAX: np.maximum}[op]
  rng = np.random.default_rng(0)
  for vec in (4, 8, 16):
    for k in range(2, 10):
      out, rows = Emitter(dtypes.int32), rng.standard_normal((k, vec)).astype(np.float32)
      leaves = [out.emit(UOps.VECTORIZE, dtypes.float32, tuple(out.emit(UOps.CONST, dtypes.float32, (), float(x)) for x in row),
                         vec=vec) for row in rows]
      first = len(out.uops)
      results = _fold_together(out, leaves, op)
      values = {}
      for u in out.uops:
        srcs = [values[id(s)] for s in u.srcs]
        if u.op is UOps.CONST: values[id(u)] = np.float32(u.arg)
        elif u.op is UOps.VECTORIZE: values[id(u)] = np.array(srcs, np.float32)
        elif u.op is UOps.SHUFFLE: values[id(u)] = np.concatenate(srcs)[list(u.arg)]
        elif u.op is UOps.GEP: values[id(u)] = srcs[0][u.arg]
        else: values[id(u)] = combine(*srcs)
      np.testing.assert_allclose([values[id(r)] for r in results], combine.reduce(rows, axis=1), rtol=1e-5, atol=1e-5)
      emitted = out.uops[first:]
      assert sum(u.op is UOps.GEP for u in emitted) == k
      assert len(emitted) < k * vec + k * (vec - 1), (vec, k, len(emitted))


def test_row_that_one_step_covers_needs_no_scratch_row(set_noopt):
  """A row of four SIMD vectors (64 floats with AVX-512, 32 with AVX2): the reduce has no loop, and its pass
  reuses the exps still in registers."""
  set_noopt("0")
  item = Tensor(np.ones((32, 4 * simd_bytes() // 4), np.float32)).softmax(1).schedule()[-1]
  program = linearize(item.ast, item.name)
  assert not any(u.op is UOps.DEFINE_LOCAL for u in program.uops) and _exp_count(program) == 4


# kernels whose output would be written with streaming stores if it were big: elementwise (float32,
# float64, int32, int64), a softmax's row pass, a matmul's register tile. Kept small for speed: the
# test lowers them as if the threshold were 0
STREAMED = {
  "elementwise": ((64, 256), np.float32, lambda x: (x * 2 + 1).exp().relu()),
  "float64": ((32, 128), np.float64, lambda x: x.exp() - x),
  "int32": ((64, 256), np.int32, lambda x: x * 3 + 1),
  "int64": ((32, 128), np.int64, lambda x: x * x),
  "softmax": ((64, 512), np.float32, lambda x: x.softmax(1)),
  "matmul": ((96, 64), np.float32, lambda x: x.T @ x),
}


@pytest.mark.parametrize("case", STREAMED, ids=list(STREAMED))
@pytest.mark.parametrize("threads", ["1", "2"])
def test_big_outputs_are_written_with_streaming_stores(case, threads, monkeypatch, set_noopt):
  """With the size threshold at 0, every whole SIMD vector a kernel stores goes past the cache (an AVX
  streaming store in C, a !nontemporal store in LLVM IR), each call ends with a store fence, and the
  results are the NUMPY device's, on one thread and on two."""
  import importlib
  linearize_module = importlib.import_module("tinychad.codegen.linearize")    # the package's `linearize` is the function
  set_noopt("0")
  monkeypatch.setenv("THREADS", threads)
  monkeypatch.setenv("CACHE", "0")     # a kernel record written with plain stores would be loaded instead
  monkeypatch.setattr(linearize_module, "stream_min_bytes", lambda: 0)
  shape, dtype, build = STREAMED[case]
  rng = np.random.default_rng(0)
  x = rng.integers(-50, 50, shape).astype(dtype) if np.dtype(dtype).kind == "i" else rng.standard_normal(shape).astype(dtype)
  want = build(Tensor(x, device="NUMPY")).numpy()
  for device in ("CPU", "LLVM"):
    got = build(Tensor(x, device=device)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=device)
  item = build(Tensor(x, device="CPU")).schedule()[-1]
  program = linearize(item.ast, item.name)
  stores = [u for u in program.uops if u.op is UOps.STORE and u.srcs[0].op is UOps.DEFINE_GLOBAL]
  if simd_bytes() < 32:
    assert not any(u.arg == "stream" for u in stores)
    return
  assert stores and all(u.arg == "stream" and u.srcs[2].vec * u.srcs[2].dtype.itemsize == simd_bytes() for u in stores)
  assert "vmovnt" in render_c(program) and render_c(program).rstrip().endswith("tc_stream_fence();\n}")
  llvm_ir = render_llvm(program)
  assert "!nontemporal" in llvm_ir and "call void @\"llvm.x86.sse.sfence\"()" in llvm_ir


def test_small_outputs_and_noopt_keep_plain_stores(set_noopt):
  """An output smaller than the last-level cache may be read from it by the next kernel: plain stores.
  So does NOOPT=1, whatever the size."""
  from tinychad.codegen import opt
  set_noopt("0")
  small = LazyBuffer.from_numpy(np.ones((64, 256), np.float32), "NUMPY").e(UnaryOps.EXP2)
  assert opt.stream_min_bytes() >= opt.STREAM_MIN_BYTES
  assert all(u.arg is None for u in linearize(_items(small)[0].ast, "k").uops if u.op is UOps.STORE)
  set_noopt("1")
  big = LazyBuffer.from_numpy(np.ones(opt.stream_min_bytes() // 4 + 16, np.float32), "NUMPY").e(UnaryOps.EXP2)
  assert all(u.arg is None for u in linearize(_items(big)[0].ast, "k").uops if u.op is UOps.STORE)
