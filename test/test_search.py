"""The BEAM search: its candidates, its answer, its disk cache and its correctness check.

in: small kernels (a matmul, a row sum, an elementwise chain with a transpose, a strided padded
    convolution) on the CPU device (LLVM for one search), with BEAM and the cache directory set per test
out: pass when every candidate and loop-order variant has upcasts that divide their dims, lowers,
     compiles and computes what the NUMPY reference device computes for that kernel; a BEAM=2
     matmul equals the one without BEAM; a second process reads the winner from the disk cache
     instead of searching (and CACHE=0 writes none); a candidate that computes something else is
     rejected even when it runs faster; without BEAM the search is never called; and a step with a scatter-add and a
     flash attention (kernels with lowerings of their own) runs under BEAM, those two built unsearched.
"""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
import numpy as np
import pytest
from tinychad import Tensor
from tinychad.codegen import opt
from tinychad.codegen.linearize import linearize, opt_inputs
from tinychad.device import Buffer, Device
from tinychad.engine import search
from tinychad.engine.realize import run_schedule
from tinychad.engine.schedule import create_schedule
from tinychad.helpers import prod
from tinychad.runtime.threads import run_parallel

rng = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _scratch_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("TINYCHAD_CACHE", str(tmp_path))
  monkeypatch.setenv("CACHE", "1")
  monkeypatch.delenv("NOOPT", raising=False)
  monkeypatch.delenv("BEAM", raising=False)
  # kernels loaded by earlier tests would be reused without lowering, so no search would run
  for device in ("CPU", "LLVM"): monkeypatch.setattr(Device[device], "programs", {})


def _floats(*shape) -> np.ndarray: return rng.uniform(-1, 1, shape).astype(np.float32)


# (what to build, its inputs, the prefix of the kernel under test)
KERNELS = {
  "matmul": (lambda a, b: a @ b, (_floats(24, 64), _floats(64, 32)), "r_"),
  "row_sum": (lambda x: x.sum(1), (_floats(8, 512),), "r_"),
  "elementwise": (lambda x, y: (x.exp() * 2 + y.T).relu(), (_floats(32, 48), _floats(48, 32)), "E_"),
  "strided_conv": (lambda x, w: x.conv2d(w, stride=2, padding=1),
                   (_floats(2, 4, 10, 10), _floats(16, 4, 3, 3)), "r_"),
}


def _kernel_under_test(name: str):
  """The kernel's ScheduleItem, with the kernels before it already run (its inputs realized)."""
  build, arrays, prefix = KERNELS[name]
  items = create_schedule([build(*[Tensor(a, device="CPU").realize() for a in arrays]).lazydata])
  index = next(i for i, it in enumerate(items) if it.is_kernel and it.name.startswith(prefix))
  run_schedule(items[:index])
  return items[index]


def _numpy_result(item) -> np.ndarray:
  out = Buffer("NUMPY", item.output.size, item.output.dtype)
  Device["NUMPY"].run(item.ast, [out] + [i.realized for i in item.inputs], item.points)
  return out.as_numpy().copy()


def _cpu_result(item, opts: opt.Opts) -> np.ndarray:
  program = linearize(item.ast, item.name, opts)
  kernel = Device["CPU"].build(program)
  out = Buffer("CPU", item.output.size, item.output.dtype).allocate()
  out.as_numpy()[:] = np.nan     # an element no lane writes can't pass for a right one
  addresses = [out.address] + [i.realized.address for i in item.inputs]
  run_parallel(kernel.fn, addresses, kernel.parallel, prod(item.full_shape))
  return out.as_numpy().copy()


def _assert_well_formed(dims: list[tuple[int, bool]], o: opt.Opts) -> None:
  # unrolls divide their dims, but tile rows the heuristic's rules chose may leave one tail (opt.tails_are_valid)
  assert opt.tails_are_valid(dims, o), o
  if o.vector is not None: assert o.upcast[o.vector[0]] % o.vector[1] == 0, o
  assert sorted(o.order) == [d for d, (_, r) in enumerate(dims) if not r], o


@pytest.mark.parametrize("name", list(KERNELS))
def test_every_candidate_matches_numpy(name):
  item = _kernel_under_test(name)
  dims, leaves, dtypes_used, ops_used = opt_inputs(item.ast)
  candidates = opt.candidate_opts(dims, leaves, dtypes_used, ops_used)
  assert len(candidates) >= 2 or name == "elementwise", "the search would have nothing to choose from"
  candidates += opt.order_variants(dims, candidates[0])
  want = _numpy_result(item)
  for o in candidates: _assert_well_formed(dims, o)
  # the compilers run outside the GIL: two at once halve the wait
  with ThreadPoolExecutor(max_workers=2) as pool:
    results = list(pool.map(lambda o: _cpu_result(item, o), candidates))
  for o, got in zip(candidates, results):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=str(o))


def test_heuristic_comes_first():
  item = _kernel_under_test("matmul")
  inputs = opt_inputs(item.ast)
  assert opt.candidate_opts(*inputs)[0] == opt.choose_opts(*inputs)


def test_scratch_buffers_cover_the_real_ones():
  item = _kernel_under_test("strided_conv")
  specs = search.buffer_specs(item.ast)
  assert specs[0] == (item.output.size, item.output.dtype)
  for number, buf in enumerate(item.inputs, start=1):
    size, dtype = specs[number]
    assert dtype == buf.dtype and 0 < size <= buf.size


def test_beam_matmul_equals_no_beam(monkeypatch, tmp_path):
  a, b = _floats(32, 64), _floats(64, 48)
  plain = (Tensor(a, device="CPU") @ Tensor(b, device="CPU")).numpy()
  monkeypatch.setattr(Device["CPU"], "programs", {})
  monkeypatch.setenv("BEAM", "2")
  beamed = (Tensor(a, device="CPU") @ Tensor(b, device="CPU")).numpy()
  assert list(tmp_path.glob("*.beam.json")), "no search ran"
  np.testing.assert_allclose(beamed, plain, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(beamed, a @ b, rtol=1e-4, atol=1e-4)


def test_llvm_search_runs(monkeypatch, tmp_path):
  x = _floats(8, 512)
  monkeypatch.setenv("BEAM", "1")
  np.testing.assert_allclose(Tensor(x, device="LLVM").sum(1).numpy(), x.sum(1), rtol=1e-5, atol=1e-5)
  assert list(tmp_path.glob("*.beam.json")), "no search ran"


def test_beam_leaves_kernels_with_lowerings_of_their_own_alone(monkeypatch, tmp_path):
  """A scatter-add (an embedding's gradient) and a flash attention take no opts: BEAM searches the other kernels
  of the step and builds these as they are."""
  import torch
  from tinychad.nn import functional as F
  monkeypatch.setenv("BEAM", "1")
  table, idx = _floats(16, 8), np.array([[1, 3, 3, 0]])
  q, k, v = (_floats(1, 2, 4, 8) for _ in range(3))
  weights = Tensor(table, device="CPU", requires_grad=True)
  looked_up = F.embedding(Tensor(idx, device="CPU"), weights)
  out = F.scaled_dot_product_attention(*(Tensor(x, device="CPU") for x in (q, k, v)), is_causal=True)
  (looked_up.sum() + out.sum()).backward()
  expected = torch.nn.functional.scaled_dot_product_attention(*(torch.tensor(x) for x in (q, k, v)), is_causal=True)
  np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(weights.grad.numpy(), np.bincount(idx[0], minlength=16)[:, None] * np.ones((1, 8)))
  assert list(tmp_path.glob("*.beam.json")), "no search ran"


SECOND_RUN = """
import numpy as np
from tinychad import Tensor
a, b = np.ones((32, 64), np.float32), np.ones((64, 48), np.float32)
assert ((Tensor(a, device="CPU") @ Tensor(b, device="CPU")).numpy() == 64).all()
"""


def test_winner_is_read_from_disk_in_a_second_run(monkeypatch, tmp_path):
  monkeypatch.setenv("BEAM", "1")
  (Tensor(_floats(32, 64), device="CPU") @ Tensor(_floats(64, 48), device="CPU")).realize()
  assert len(list(tmp_path.glob("*.beam.json"))) == 1
  # without kernel records the next process lowers the kernel again, so it asks for the winner
  for record in tmp_path.glob("*.kernel.json"): record.unlink()
  env = dict(os.environ, DEBUG="2")
  run = subprocess.run([sys.executable, "-c", SECOND_RUN], env=env, capture_output=True, text=True, check=True)
  out = run.stdout
  lines = [ln for ln in out.splitlines() if "beam r_32_48_64" in ln]
  assert len(lines) == 1 and "cached" in lines[0], out


def test_cache_off_writes_nothing(monkeypatch, tmp_path):
  monkeypatch.setenv("CACHE", "0")
  item = _kernel_under_test("row_sum")
  calls = []
  real = search.run_search
  monkeypatch.setattr(search, "run_search", lambda *args: calls.append(args) or real(*args))
  # both searched (nothing read back from disk); their winners may differ, being timed on a shared machine
  search.search_opts(item.ast, item.name, "CPU", width=1)
  search.search_opts(item.ast, item.name, "CPU", width=1)
  assert len(calls) == 2
  assert not list(tmp_path.glob("*.beam.json"))


def test_wrong_candidate_is_rejected(monkeypatch):
  item = _kernel_under_test("matmul")
  dims = opt_inputs(item.ast)[0]
  assert dims[0] == (24, False)
  # 5 doesn't divide 24 and there are no remainder loops: rows 20..23 are never computed, so this
  # kernel does less work than any right one and would win on time alone
  wrong = opt.Opts(upcast={0: 5}, order=[0, 1])
  real = opt.candidate_opts
  monkeypatch.setattr(opt, "candidate_opts", lambda *args: [real(*args)[0], wrong])
  monkeypatch.setattr(opt, "order_variants", lambda dims, o: [])
  result = search.run_search(item.ast, item.name, "CPU", width=2)
  assert result.rejected == 1 and result.tried == 2
  assert result.opts == real(*opt_inputs(item.ast))[0]


def test_matches_tolerates_reassociation_only():
  want = rng.uniform(0.5, 1.5, 1000).astype(np.float32)
  assert search._matches(want * np.float32(1 + 1e-6), want)
  wrong = want.copy()
  wrong[7] *= 1.01
  assert not search._matches(wrong, want)
  assert not search._matches(search._unlike(want), want)
  ints = rng.integers(0, 100, 50).astype(np.int32)
  assert not search._matches(search._unlike(ints), ints)


def test_no_beam_never_searches(monkeypatch):
  def fail(*args): raise AssertionError("searched without BEAM")
  monkeypatch.setattr(search, "search_item", fail)
  x = _floats(16, 32)
  np.testing.assert_allclose((Tensor(x, device="CPU") * 3).sum(0).numpy(), (x * 3).sum(0), rtol=1e-5, atol=1e-5)
