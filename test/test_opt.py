"""The kernel optimizations: SIMD lanes, register tiles, several accumulators, threads.

in: matmul, convolution and reduce shapes (odd sizes the tiles don't divide included), run on the
    compiled devices with the optimizations on and off (NOOPT) and with THREADS=1 and 2
out: pass when every variant matches the NUMPY reference (float sums within tolerance, since partial
     sums reorder them; integers exactly), the matmul pattern gets a vector axis and a register tile,
     and the thread split covers the loop exactly once.
"""
import numpy as np
import pytest
from tinychad import Tensor
from tinychad.codegen import linearize
from tinychad.engine.schedule import create_schedule
from tinychad.runtime.threads import MIN_PARALLEL_WORK, chunks

DEVICES = ["CPU", "LLVM"]
# (threads, noopt): the optimized kernels on one and two threads, and plain loops
MODES = [("1", "0"), ("2", "0"), ("2", "1")]
rng = np.random.default_rng(0)


@pytest.fixture(params=MODES, ids=[f"threads{t}-noopt{n}" for t, n in MODES])
def mode(request, monkeypatch):
  threads, noopt = request.param
  monkeypatch.setenv("THREADS", threads)
  monkeypatch.setenv("NOOPT", noopt)
  return request.param


def _check(build, *arrays, tol=1e-4):
  want = build(*[Tensor(a, device="NUMPY") for a in arrays]).numpy()
  for device in DEVICES:
    got = build(*[Tensor(a, device=device) for a in arrays]).numpy()
    assert got.dtype == want.dtype and got.shape == want.shape, device
    if want.dtype.kind == "f": np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=device)
    else: np.testing.assert_array_equal(got, want, err_msg=device)


MATMULS = [(64, 64, 64), (33, 17, 65), (96, 128, 40), (5, 1, 7), (130, 48, 256)]


@pytest.mark.parametrize("n,k,m", MATMULS, ids=[f"{n}x{k}x{m}" for n, k, m in MATMULS])
def test_matmul(mode, n, k, m):
  a, b = rng.standard_normal((n, k), dtype=np.float32), rng.standard_normal((k, m), dtype=np.float32)
  _check(lambda x, y: x @ y, a, b)
  # the transposed weight of a linear layer: contiguous along k for both operands
  _check(lambda x, y: x @ y.T, a, np.ascontiguousarray(b.T))


@pytest.mark.parametrize("shape,stride,pad", [((2, 3, 12, 12), 1, 0), ((3, 2, 9, 11), 2, 1)])
def test_conv_forward_backward(mode, shape, stride, pad):
  x, w = rng.standard_normal(shape, dtype=np.float32), rng.standard_normal((8, shape[1], 3, 3), dtype=np.float32)

  def grads(xt, wt):
    wt.requires_grad = True
    out = xt.conv2d(wt, stride=stride, padding=pad).relu()
    out.sum().backward()
    return out.flatten().cat(wt.grad.flatten())
  _check(grads, x, w, tol=1e-3)


REDUCES = [((100003,), 0), ((64, 1000), 1), ((1000, 48), 0), ((7, 33, 16), 2), ((256, 256), (0, 1))]


@pytest.mark.parametrize("shape,axis", REDUCES, ids=[f"{s}-{a}" for s, a in REDUCES])
def test_reduces(mode, shape, axis):
  x = rng.standard_normal(shape, dtype=np.float32)
  _check(lambda t: t.sum(axis), x)
  _check(lambda t: t.max(axis), x)
  _check(lambda t: t.softmax(-1), x)
  # integer sums keep their exact value whatever the order
  _check(lambda t: t.sum(axis), rng.integers(-1000, 1000, size=shape, dtype=np.int32))


def test_max_keeps_nan(mode):
  x = rng.standard_normal((64, 256), dtype=np.float32)
  x[3, 100] = np.nan
  _check(lambda t: t.max(1), x)


def test_threads_give_identical_results(monkeypatch):
  # each output is computed by one thread in either case, so the results match bit for bit
  a, b = rng.standard_normal((256, 128), dtype=np.float32), rng.standard_normal((128, 512), dtype=np.float32)
  assert 256 * 512 * 128 >= MIN_PARALLEL_WORK
  for device in DEVICES:
    results = []
    for threads in ("1", "2"):
      monkeypatch.setenv("THREADS", threads)
      results.append(((Tensor(a, device=device) @ Tensor(b, device=device)).exp() + 1).numpy())
    np.testing.assert_array_equal(results[0], results[1], err_msg=device)


def test_matmul_gets_vector_and_tile(monkeypatch):
  monkeypatch.setenv("NOOPT", "0")
  a, b = Tensor.rand(64, 64, device="NUMPY"), Tensor.rand(64, 64, device="NUMPY")
  (item,) = [it for it in create_schedule([(a @ b).lazydata]) if it.is_kernel]
  program = linearize(item.ast, item.name)
  assert max(u.vec for u in program.uops) > 1
  assert program.contract and program.parallel > 1
  # several accumulators: a register tile, not one running sum
  assert sum(1 for u in program.uops if u.op.name == "DEFINE_ACC") >= 4
  monkeypatch.setenv("NOOPT", "1")
  program = linearize(item.ast, item.name)
  assert max(u.vec for u in program.uops) == 1 and not program.contract
  assert sum(1 for u in program.uops if u.op.name == "DEFINE_ACC") == 1


@pytest.mark.parametrize("extent,parts", [(10, 3), (2, 2), (7, 1), (100, 8)])
def test_chunks_cover_the_loop_once(extent, parts):
  ranges = chunks(extent, parts)
  assert len(ranges) == parts and ranges[0][0] == 0 and ranges[-1][1] == extent
  assert all(hi == lo for (_, hi), (lo, _) in zip(ranges, ranges[1:]))
  assert max(hi - lo for lo, hi in ranges) - min(hi - lo for lo, hi in ranges) <= 1
