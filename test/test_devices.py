"""The compiled devices against the numpy oracle.

in: small graphs built straight from LazyBuffers (no Tensor), random data of every dtype
out: pass when CPU (C) and LLVM give the values NUMPY gives, for every ALU op, cast, reduce,
     masked/padded and multi-view access, empty and size-1 dims, and random movement-op chains.
"""
import os
import subprocess
import sys
import textwrap
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from tinychad import Tensor
from tinychad.dtype import dtypes
from tinychad.lazy import LazyBuffer
from tinychad.ops import UnaryOps, BinaryOps, TernaryOps, ReduceOps

DEVICES = ["CPU", "LLVM"]
ALL = dtypes.all()
INTS = [d for d in ALL if d.is_int]
FLOATS = [d for d in ALL if d.is_float]
TOL = {dtypes.float16: 2e-3, dtypes.float32: 1e-5, dtypes.float64: 1e-12}
rng = np.random.default_rng(0)


def data(dtype, shape, lo=-100, hi=100, specials=True) -> np.ndarray:
  """Random values of dtype; floats get fractions and (optionally) nan/inf/0 sprinkled in."""
  if dtype == dtypes.bool: return rng.random(shape) < 0.5
  if dtype.is_int:
    info = np.iinfo(dtype.np)
    return rng.integers(max(lo, info.min), min(hi, info.max), size=shape, endpoint=True).astype(dtype.np)
  x = rng.uniform(lo, hi, size=shape)
  if specials and x.size >= 8: x.flat[:4] = [np.nan, np.inf, -np.inf, 0.0]
  return x.astype(dtype.np)


def run(build, arrays, device) -> np.ndarray:
  return Tensor(build(*[LazyBuffer.from_numpy(a, device) for a in arrays])).numpy()


def check(build, *arrays) -> None:
  want = run(build, arrays, "NUMPY")
  for device in DEVICES:
    got = run(build, arrays, device)
    assert got.dtype == want.dtype and got.shape == want.shape, device
    if want.dtype.kind == "f":
      tol = TOL[dtypes.from_np(want.dtype)]
      np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True, err_msg=device)
    else:
      np.testing.assert_array_equal(got, want, err_msg=device)


# ---- elementwise ops ----

def _binary_ops(dtype):
  if dtype == dtypes.bool:
    return [BinaryOps.ADD, BinaryOps.MUL, BinaryOps.MAX, BinaryOps.CMPLT, BinaryOps.CMPEQ, BinaryOps.CMPNE,
            BinaryOps.AND, BinaryOps.OR, BinaryOps.XOR]
  ops = [op for op in BinaryOps]
  return ops if dtype.is_int else [op for op in ops if op not in (BinaryOps.AND, BinaryOps.OR, BinaryOps.XOR)]


@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_binary_ops(dtype):
  a, b = data(dtype, (7, 9)), data(dtype, (7, 9), lo=-5, hi=5)
  if dtype.is_int: b.flat[:3] = [0, -1 if not dtype.is_unsigned else 0, 1]   # zero and -1 divisors
  if dtype.is_int and not dtype.is_unsigned: a.flat[1] = np.iinfo(dtype.np).min  # MIN / -1
  for op in _binary_ops(dtype):
    check(lambda x, y: x.e(op, y), a, b)


@pytest.mark.parametrize("dtype", INTS, ids=lambda d: d.name)
def test_int_overflow_wraps(dtype):
  big = np.full((4, 4), np.iinfo(dtype.np).max, dtype=dtype.np)
  check(lambda x: x.e(BinaryOps.ADD, x).e(BinaryOps.MUL, x), big)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_unary_float_ops(dtype):
  x = data(dtype, (5, 13), lo=-4, hi=4)
  for op in UnaryOps:
    if op in (UnaryOps.CAST, UnaryOps.BITCAST): continue
    check(lambda a: a.e(op), x)


@pytest.mark.parametrize("dtype", [d for d in ALL if not d.is_float], ids=lambda d: d.name)
def test_unary_int_ops(dtype):
  x = data(dtype, (6, 5))
  check(lambda a: a.e(UnaryOps.NEG), x)
  check(lambda a: a.e(UnaryOps.TRUNC), x)


def test_where_all_dtypes():
  for dtype in ALL:
    cond, a, b = data(dtypes.bool, (4, 6)), data(dtype, (4, 6)), data(dtype, (4, 6))
    check(lambda c, x, y: c.e(TernaryOps.WHERE, x, y), cond, a, b)


@pytest.mark.parametrize("src", ALL, ids=lambda d: d.name)
def test_cast_all_pairs(src):
  # values every target can hold, so no cast is undefined behaviour in C
  x = data(src, (3, 7), lo=0, hi=100, specials=False)
  if src.is_float: x = (x + np.asarray(0.5, src.np)).astype(src.np)
  for dst in ALL:
    check(lambda a: a.cast(dst), x)


@pytest.mark.parametrize("pair", [(dtypes.float32, dtypes.int32), (dtypes.int32, dtypes.float32),
                                  (dtypes.float16, dtypes.int16), (dtypes.float64, dtypes.int64),
                                  (dtypes.int8, dtypes.uint8)], ids=lambda p: f"{p[0].name}-{p[1].name}")
def test_bitcast(pair):
  src, dst = pair
  x = data(src, (4, 5), lo=-50, hi=50, specials=False)
  check(lambda a: a.e(UnaryOps.BITCAST, arg=dst), x)


def test_consts_and_masked_consts():
  x = data(dtypes.float32, (3, 4))
  for dtype in ALL:
    check(lambda a: a.cast(dtype).e(BinaryOps.MUL, LazyBuffer.full(1, (3, 4), dtype, a.device)), x)
  # a padded constant: 1 inside the mask, 0 outside
  check(lambda a: a.e(BinaryOps.ADD, LazyBuffer.full(1.5, (1, 2), dtypes.float32, a.device).pad(((1, 1), (1, 1)))), x)
  check(lambda a: a.e(BinaryOps.ADD, LazyBuffer.full(float("nan"), (3, 4), dtypes.float32, a.device)), x)


# ---- reduces ----

@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.float64, dtypes.int32, dtypes.int8,
                                   dtypes.uint8, dtypes.bool, dtypes.int64], ids=lambda d: d.name)
def test_reduce_axes(dtype):
  x = data(dtype, (3, 4, 5), lo=-10, hi=10, specials=dtype == dtypes.float32)
  for op in ReduceOps:
    for axes in [(1,), (0, 2), (0, 1, 2)]:
      check(lambda a: a.r(op, axes), x)


def test_reduce_fused_with_elementwise():
  x, y = data(dtypes.float32, (8, 16), specials=False), data(dtypes.float32, (8, 1), specials=False)
  # elementwise before and after the reduce, in one kernel
  check(lambda a, b: a.e(UnaryOps.EXP2).r(ReduceOps.SUM, (1,)).e(BinaryOps.MUL, b), x / 50, y)
  check(lambda a, b: a.e(BinaryOps.SUB, b.expand((8, 16))).r(ReduceOps.MAX, (0,)), x, y)


def test_matmul_shaped_reduce():
  a, b = data(dtypes.float32, (5, 7), specials=False), data(dtypes.float32, (7, 3), specials=False)
  check(lambda x, y: x.reshape((5, 7, 1)).expand((5, 7, 3)).e(BinaryOps.MUL, y.reshape((1, 7, 3)).expand((5, 7, 3)))
        .r(ReduceOps.SUM, (1,)), a, b)


def test_empty_and_size1_dims():
  check(lambda a: a.e(BinaryOps.ADD, a), data(dtypes.float32, (0, 3)))
  check(lambda a: a.r(ReduceOps.SUM, (1,)), data(dtypes.float32, (3, 0)))
  check(lambda a: a.r(ReduceOps.MAX, (1,)), data(dtypes.float32, (3, 0)))
  check(lambda a: a.r(ReduceOps.MAX, (1,)), data(dtypes.int32, (3, 0)))
  check(lambda a: a.e(UnaryOps.NEG).r(ReduceOps.SUM, (0, 2)), data(dtypes.float32, (1, 5, 1)))
  check(lambda a: a.e(UnaryOps.SQRT), data(dtypes.float32, (1,), lo=0))
  check(lambda a: a.r(ReduceOps.SUM, (0,)), data(dtypes.float32, (1,), lo=0))


# ---- movement ops ----

def test_pad_shrink_flip_expand():
  x = data(dtypes.float32, (4, 5))
  check(lambda a: a.pad(((1, 2), (0, 3))).e(UnaryOps.NEG), x)
  check(lambda a: a.shrink(((1, 3), (2, 5))).flip((True, True)).e(UnaryOps.NEG), x)
  check(lambda a: a.pad(((2, 0), (1, 1))).shrink(((1, 5), (0, 6))).flip((False, True)).e(UnaryOps.NEG), x)
  check(lambda a: a.reshape((4, 1, 5)).expand((4, 3, 5)).e(UnaryOps.NEG), x)
  check(lambda a: a.pad(((1, 1), (1, 1))).r(ReduceOps.SUM, (0,)), x)


def test_multi_view_reshape_after_permute():
  x = data(dtypes.float32, (3, 4, 5))
  check(lambda a: a.permute((2, 0, 1)).reshape((10, 6)).e(UnaryOps.NEG), x)
  check(lambda a: a.permute((1, 0, 2)).reshape((4, 15)).flip((True, False)).e(UnaryOps.NEG), x)
  check(lambda a: a.pad(((0, 1), (1, 0), (0, 0))).permute((2, 1, 0)).reshape((25, 4)).r(ReduceOps.SUM, (1,)), x)
  check(lambda a: a.shrink(((0, 2), (1, 4), (0, 5))).permute((2, 0, 1)).reshape((5, 6)).r(ReduceOps.MAX, (0,)), x)


# ---- random movement chains (hypothesis) ----

@st.composite
def movement_chains(draw):
  shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
  ops, cur = [], shape
  for _ in range(draw(st.integers(1, 4))):
    kind = draw(st.sampled_from(["permute", "reshape", "pad", "shrink", "flip", "expand"]))
    if kind == "permute":
      arg = tuple(draw(st.permutations(range(len(cur)))))
      cur = tuple(cur[i] for i in arg)
    elif kind == "reshape":
      n = int(np.prod(cur))
      # split the flat size into a random factorization
      dims, rest = [], n
      for f in (2, 3):
        if rest % f == 0 and draw(st.booleans()): dims.append(f); rest //= f
      arg = tuple(dims + [rest]) if draw(st.booleans()) else tuple([rest] + dims)
      cur = arg
    elif kind == "pad":
      arg = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in cur)
      cur = tuple(s + b + a for s, (b, a) in zip(cur, arg))
    elif kind == "shrink":
      arg = []
      for s in cur:
        start = draw(st.integers(0, s - 1))
        arg.append((start, draw(st.integers(start + 1, s))))
      arg = tuple(arg)
      cur = tuple(e - b for b, e in arg)
    elif kind == "flip":
      arg = tuple(draw(st.booleans()) for _ in cur)
    else:
      arg = tuple(draw(st.integers(2, 3)) if s == 1 else s for s in cur)
      cur = arg
    ops.append((kind, arg))
  axes = tuple(i for i in range(len(cur)) if draw(st.booleans()))
  reduce = draw(st.sampled_from([None, ReduceOps.SUM, ReduceOps.MAX]))
  return shape, ops, axes, reduce


@settings(max_examples=25, deadline=None)
@given(movement_chains())
def test_random_movement_chains(case):
  shape, ops, axes, reduce = case
  x = data(dtypes.float32, shape, specials=False)

  def build(a):
    for kind, arg in ops: a = getattr(a, kind)(arg)
    out = a.e(BinaryOps.MUL, a).e(BinaryOps.ADD, a.e(UnaryOps.NEG))
    return out.r(reduce, axes) if reduce is not None and axes else out
  check(build, x)


def test_sum_over_a_flipped_row():
  """gcc 12's loop vectorizer summed x[2r] twice and never x[2r+1] here (found by the test above):
  kernels are built with -fno-tree-loop-vectorize."""
  x = np.arange(10, 70, 10, dtype=np.float32).reshape(3, 2)
  def build(a):
    a = a.flip((False, True))
    return a.e(BinaryOps.MUL, a).e(BinaryOps.ADD, a.e(UnaryOps.NEG)).r(ReduceOps.SUM, (0, 1))
  check(build, x)
  assert run(build, [x], "CPU").item() == 8890


# ---- address sanitizer ----

ASAN_SCRIPT = textwrap.dedent("""
  import ctypes, numpy as np
  import tinychad.device as device
  # exact-size allocations so any out-of-bounds byte lands in ASan's red zone
  device._aligned_empty = lambda size, dtype, alignment=64: np.empty(max(size, 1), dtype=dtype.np)
  from tinychad import Tensor
  from tinychad.lazy import LazyBuffer
  from tinychad.ops import BinaryOps, ReduceOps, UnaryOps
  def both(build, x):
    want = Tensor(build(LazyBuffer.from_numpy(x, "NUMPY"))).numpy()
    got = Tensor(build(LazyBuffer.from_numpy(x, "CPU"))).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5)
  x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
  both(lambda a: a.pad(((1, 2), (0, 1), (2, 0))).flip((True, False, True)).e(UnaryOps.NEG), x)
  both(lambda a: a.permute((2, 0, 1)).reshape((10, 6)).shrink(((1, 9), (0, 6))).r(ReduceOps.SUM, (1,)), x)
  both(lambda a: a.pad(((0, 1), (1, 0), (0, 0))).permute((2, 1, 0)).reshape((25, 4)).r(ReduceOps.MAX, (0,)), x)
  print("CLEAN")
  if CONTROL:
    # a kernel that reads one element past the end must be caught, or this test proves nothing
    from tinychad.runtime.cc import compile_c
    lib = compile_c("void oob(float* d, const float* s) { d[0] = s[16]; }", "oob")
    src, dst = np.zeros(16, np.float32), np.zeros(1, np.float32)
    lib.oob(ctypes.c_void_p(dst.ctypes.data), ctypes.c_void_p(src.ctypes.data))
""")


def _asan_run(control: bool, tmp_path):
  libasan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
  if not os.path.isabs(libasan): pytest.fail("gcc has no libasan.so; the ASan test needs it")
  env = dict(os.environ, LD_PRELOAD=libasan, ASAN_OPTIONS="detect_leaks=0", CC="gcc",
             CC_FLAGS_EXTRA="-fsanitize=address -fno-omit-frame-pointer", TINYCHAD_CACHE=str(tmp_path))
  return subprocess.run([sys.executable, "-c", f"CONTROL = {control}\n" + ASAN_SCRIPT], env=env,
                        capture_output=True, text=True, timeout=120)


def test_asan_kernels_stay_in_bounds(tmp_path):
  res = _asan_run(False, tmp_path)
  assert res.returncode == 0 and "CLEAN" in res.stdout, res.stderr[-3000:]
  res = _asan_run(True, tmp_path)
  assert res.returncode != 0 and "heap-buffer-overflow" in res.stderr, res.stderr[-3000:]
