"""The OPENCL device and the GPU lowering: the launch geometry, grouped reduces, register and work-group
memory tiles, the kernel cache, device memory errors, and the CUDA dialect compiled by NVRTC for sm_80 and
sm_90 (no GPU needed). The property tests against the NUMPY reference that every GPU-style device passes
(odd sizes, 0-size dims, non-contiguous views, dtypes, moving tensors with gradients) are test_gpu_devices.py.

OPENCL runs where pyopencl and an OpenCL platform (PoCL on CI) are installed; the NVRTC tests where
PyPI's nvidia-cuda-nvrtc-cu12 is. The op suite itself runs on OPENCL through conftest's `each_device`.
"""
from __future__ import annotations
import functools
import sys
from pathlib import Path
import numpy as np
import pytest
from tinychad import Tensor, dtypes
from tinychad.device import Device
from tinychad.codegen import gpu
from tinychad.codegen.gpu import GROUP_REDUCE_THREADS, MAX_WORK_GROUP, REGISTER_TILE, lower_gpu, work_group
from tinychad.codegen.localtile import TILE_K
from tinychad.codegen.uops import UOps
from tinychad.engine.realize import capture
from tinychad.engine.schedule import create_schedule
from tinychad.renderer.gpu import render_gpu_library
from tinychad.runtime.nvrtc import compile_cuda, load_nvrtc

has_opencl = Device.available("OPENCL")
needs_opencl = pytest.mark.skipif(not has_opencl, reason="no OpenCL platform (apt-get install pocl-opencl-icd)")
needs_nvrtc = pytest.mark.skipif(load_nvrtc() is None, reason="NVRTC missing (pip install nvidia-cuda-nvrtc-cu12)")
rng = np.random.default_rng(0)


def on_both(fn, *arrays: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """fn over the arrays as Tensors on OPENCL and on NUMPY."""
  return tuple(fn(*[Tensor(a, device=d) for a in arrays]).numpy() for d in ("OPENCL", "NUMPY"))


def assert_both(fn, *arrays: np.ndarray, atol: float = 1e-5) -> None:
  got, want = on_both(fn, *arrays)
  assert got.shape == want.shape and got.dtype == want.dtype
  np.testing.assert_allclose(got, want, atol=atol, rtol=1e-5)


def test_work_group_sizes():
  assert work_group([1000]) == [128]            # padded to 1024
  assert work_group([100, 7]) == [100, 1]       # a whole small extent, then what is left of the group
  assert work_group([130]) == [16]              # 144: 128 would pad to 256
  assert work_group([5, 3, 2]) == [5, 3, 2]
  assert all(np.prod(work_group(e)) <= MAX_WORK_GROUP for e in ([4096, 4096], [3, 999, 17], [1, 1, 1]))


def _program(t: Tensor, local_memory: bool = False):
  items = [i for i in create_schedule([t.lazydata]) if i.is_kernel]
  return lower_gpu(items[-1], local_memory)


def test_loops_become_a_guarded_grid():
  a = Tensor(np.ones((3, 5, 7, 9), np.float32), device="NUMPY")
  b = Tensor(np.ones((9, 5, 3, 7), np.float32), device="NUMPY")
  program = _program(a.permute(3, 1, 0, 2) + b)
  specials = [u for u in program.uops if u.op is UOps.SPECIAL]
  assert [u.arg[2] for u in specials] == [0, 1, 2]
  assert not any(u.op is UOps.RANGE for u in program.uops)       # every loop became a work-item index
  grid, local = program.parallel[:3], program.parallel[3:]
  assert all(g % g_local == 0 for g, g_local in zip(grid, local)) and np.prod(local) <= MAX_WORK_GROUP
  assert np.prod(grid) >= 3 * 5 * 7 * 9
  # many outputs: each work-item runs its own reduce loop
  program = _program(Tensor(np.ones((3000, 300), np.float32), device="NUMPY").sum(1))
  assert [u.arg[0] for u in program.uops if u.op is UOps.RANGE] == ["ridx0"]
  assert not any(u.op is UOps.BARRIER for u in program.uops)


def test_matmul_gets_a_register_tile():
  a, b = (Tensor(np.ones(s, np.float32), device="NUMPY") for s in ((64, 32), (32, 48)))
  program = _program(a @ b)
  assert sum(u.vec for u in program.uops if u.op is UOps.DEFINE_ACC) == REGISTER_TILE ** 2
  assert program.parallel[:2] == (48 // REGISTER_TILE, 64 // REGISTER_TILE)
  # a row of B is one vector load, a row of the tile one vector store
  assert any(u.op is UOps.LOAD and u.vec == REGISTER_TILE for u in program.uops)
  assert "vload4(" in render_gpu_library([program], ["k"]) and "vstore4(" in render_gpu_library([program], ["k"])
  assert "vload" not in render_gpu_library([program], ["k"], "CUDA")
  # 65 rows: not a multiple of the tile, so that axis stays one output per work-item
  a = Tensor(np.ones((65, 32), np.float32), device="NUMPY")
  assert sum(u.vec for u in _program(a @ b).uops if u.op is UOps.DEFINE_ACC) == REGISTER_TILE


def test_matmul_tiles_through_work_group_memory():
  a, b = (Tensor(np.ones(s, np.float32), device="NUMPY") for s in ((64, 40), (40, 48)))
  program = _program(a @ b, local_memory=True)
  ops = [u.op for u in program.uops]
  # a __local array per load of the reduce body (A's four tile rows, B's vector row), two barriers a step
  assert ops.count(UOps.DEFINE_SHARED) == 5 and ops.count(UOps.BARRIER) == 2
  assert sum(u.vec for u in program.uops if u.op is UOps.DEFINE_ACC) == REGISTER_TILE ** 2
  assert [u.arg[1] for u in program.uops if u.op is UOps.RANGE and u.arg[0].endswith("_tile")] == [-(-40 // TILE_K)]
  columns, rows = program.parallel[3:5]
  assert program.parallel[:2] == (48 // REGISTER_TILE, -(-16 // rows) * rows) and columns * rows <= MAX_WORK_GROUP
  source = render_gpu_library([program], ["k"])
  assert source.count("__local float") == 5 and source.count("barrier(") == 2
  assert not any(u.op is UOps.DEFINE_SHARED for u in _program(a @ b).uops)       # only where asked
  # not matmul-shaped, or too short a reduce: the plain grid
  for t in (a.exp() + 1, a.sum(1), a[:, :8] @ b[:8]):
    assert not any(u.op is UOps.DEFINE_SHARED for u in _program(t, local_memory=True).uops)


def test_few_long_reduces_are_grouped():
  program = _program(Tensor(np.ones((6, 1000), np.float32), device="NUMPY").sum(1))
  ops = [u.op for u in program.uops]
  assert UOps.DEFINE_SHARED in ops and ops.count(UOps.BARRIER) == 1 + GROUP_REDUCE_THREADS.bit_length() - 1
  assert program.parallel == (GROUP_REDUCE_THREADS, 6, 1, GROUP_REDUCE_THREADS, 1, 1)


def test_grid_folds_where_a_dimension_passes_the_block_limit():
  """CUDA launches at most 65535 work-groups along dimensions 1 and 2: a sum over the middle axis of
  (70000, 3, 128) would need 70000 groups of 128 along dimension 1, so its rows fold into dimension 0
  (2^31 - 1) with the columns."""
  x = Tensor(np.zeros((70000, 3, 128), np.float32), device="NUMPY")
  program = _program(x.sum(1))
  grid, local = program.parallel[:3], program.parallel[3:]
  blocks = [g // l for g, l in zip(grid, local)]
  assert all(b <= limit for b, limit in zip(blocks, gpu.MAX_GRID_BLOCKS)) and np.prod(grid) >= 70000 * 128
  assert [u.arg[:2] for u in program.uops if u.op is UOps.SPECIAL] == [("gidx_fold0", "global")]
  # under the limit the loops keep a dimension each
  assert len([u for u in _program(x[:60000].sum(1)).uops if u.op is UOps.SPECIAL]) == 2


@pytest.fixture
def tiny_grid(monkeypatch):
  """OPENCL lowering every kernel afresh under a limit of 2 work-groups along dimensions 1 and 2, so kernels
  of test sizes fold as a GPU's would at 65535 (and grouped reduces and work-group tiles that don't fit decline)."""
  from tinychad.engine import realize
  device = Device["OPENCL"]
  monkeypatch.setattr(gpu, "MAX_GRID_BLOCKS", (2**31 - 1, 2, 2))
  monkeypatch.setattr(realize, "_recorded", lambda device, key: None)
  monkeypatch.setattr(device, "programs", {})
  monkeypatch.setattr(device, "local_memory", True)
  return device


@needs_opencl
def test_folded_grids_compute_the_same(tiny_grid):
  a = rng.standard_normal((3, 5, 7, 9)).astype(np.float32)
  b = rng.standard_normal((9, 5, 3, 7)).astype(np.float32)
  assert_both(lambda x, y: x.permute(3, 1, 0, 2) + y, a, b)
  assert_both(lambda x: x.permute(2, 0, 3, 1).sum(2), a)
  assert_both(lambda x: x.sum(1), rng.standard_normal((6, 1000)).astype(np.float32), atol=1e-4)
  p, q = rng.standard_normal((5, 70, 33)).astype(np.float32), rng.standard_normal((5, 33, 40)).astype(np.float32)
  assert_both(lambda x, y: x @ y, p, q, atol=1e-4)
  for kernel in tiny_grid.programs.values():
    blocks = [g // l for g, l in zip(kernel.parallel[:3], kernel.parallel[3:])]
    assert blocks[1] <= 2 and blocks[2] <= 2, kernel.parallel


@pytest.fixture(params=["register tile", "no register tile"])
def local_tiles(request, monkeypatch):
  """OPENCL lowering matmul-shaped kernels through work-group memory as on a GPU (PoCL's is ordinary
  memory, so it doesn't by default), with and without gpu.py's register tile."""
  device = Device["OPENCL"]
  monkeypatch.setattr(device, "local_memory", True)
  monkeypatch.setattr(device, "programs", {})
  if request.param == "no register tile": monkeypatch.setattr(gpu, "_register_tile", lambda dims, access: {})


@needs_opencl
@pytest.mark.parametrize("m, k, n", [(64, 64, 64), (17, 33, 65), (130, 17, 129), (3, 100, 41), (100, 16, 36),
                                     (33, 257, 7)])
def test_local_tiled_matmul(local_tiles, m, k, n):
  a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
  assert any(u.op is UOps.DEFINE_SHARED for u in _program(Tensor(a, device="NUMPY") @ Tensor(b, device="NUMPY"),
                                                           local_memory=True).uops)
  assert_both(lambda x, y: x @ y, a, b, atol=1e-4)


@needs_opencl
def test_local_tiled_kernels(local_tiles):
  """Batched, fused, transposed, 1x1-convolution and other-dtype kernels through the tiles, forward and backward."""
  a, b = rng.standard_normal((3, 37, 24)).astype(np.float32), rng.standard_normal((3, 24, 45)).astype(np.float32)
  assert_both(lambda x, y: x @ y, a, b, atol=1e-4)
  # two batch axes (one operand's permuted, so they don't merge): the group's batch index is folded from both
  a, b = rng.standard_normal((3, 2, 17, 20)).astype(np.float32), rng.standard_normal((2, 3, 20, 19)).astype(np.float32)
  program = _program(Tensor(a, device="NUMPY").permute(1, 0, 2, 3) @ Tensor(b, device="NUMPY"), local_memory=True)
  assert ("gidx_batch", "group", 2) in [u.arg for u in program.uops if u.op is UOps.SPECIAL]
  assert_both(lambda x, y: x.permute(1, 0, 2, 3) @ y, a, b, atol=1e-4)
  w, bias = rng.standard_normal((50, 33)).astype(np.float32), rng.standard_normal(50).astype(np.float32)
  x = rng.standard_normal((21, 33)).astype(np.float32)
  assert_both(lambda x, w, bias: x.linear(w.T, bias).relu().exp(), x, w, bias, atol=1e-4)
  assert_both(lambda w, x: w[::2] @ x[:, ::-1].T, w, x, atol=1e-4)       # strided, reversed operands
  images = rng.standard_normal((2, 24, 9, 7)).astype(np.float32)
  kernel = rng.standard_normal((20, 24, 1, 1)).astype(np.float32)
  assert_both(lambda x, k: x.conv2d(k), images, kernel, atol=1e-4)
  for dtype in (np.float64, np.int32):
    p, q = (rng.integers(-5, 5, s).astype(dtype) for s in ((19, 40), (40, 23)))
    assert_both(lambda x, y: x @ y, p, q)
  xs = Tensor(x, device="OPENCL", requires_grad=True)
  ws = Tensor(w, device="OPENCL", requires_grad=True)
  (xs @ ws.T).square().sum().backward()
  want = 2 * (x @ w.T)
  np.testing.assert_allclose(xs.grad.numpy(), want @ w, atol=1e-3, rtol=1e-5)
  np.testing.assert_allclose(ws.grad.numpy(), want.T @ x, atol=1e-3, rtol=1e-5)


def _tiled(t: Tensor) -> bool:
  return any(u.op is UOps.RANGE and u.arg[0].endswith("_tile") for u in _program(t, local_memory=True).uops)


def test_convolutions_tile_as_implicit_matmuls():
  """A convolution's kernel is a matrix product whose rows are (batch, height, width), its columns the output
  channels and its reduce (channels, kernel window) several loops: it tiles through work-group memory too."""
  x = Tensor(np.ones((4, 8, 10, 10), np.float32), device="NUMPY")
  w = Tensor(np.ones((16, 8, 3, 3), np.float32), device="NUMPY")
  program = _program(x.conv2d(w, padding=1), local_memory=True)
  assert [u.arg[1] for u in program.uops if u.op is UOps.RANGE and u.arg[0].endswith("_tile")] == [-(-8 * 9 // TILE_K)]
  assert all(_tiled(t) for t in (x.conv2d(w), x.conv2d(w, stride=2), x.conv2d(w[:, :4], groups=2)))
  assert not _tiled(x.max_pool2d(2))       # a 2x2 window: too short a reduce


def test_tiles_stay_within_the_work_group_memory(monkeypatch):
  from tinychad.codegen import localtile
  a, b = (Tensor(np.ones(s, np.float32), device="NUMPY") for s in ((64, 40), (40, 48)))
  # A's four tile rows of 8 x 16 floats and B's 16 x 12 vectors of 4: 2048 + 3072 bytes
  monkeypatch.setattr(localtile, "LOCAL_TILE_MAX_BYTES", 5120)
  assert _tiled(a @ b)
  monkeypatch.setattr(localtile, "LOCAL_TILE_MAX_BYTES", 5119)
  assert not _tiled(a @ b)


@needs_opencl
@pytest.mark.parametrize("shape, kernel, kwargs", [((2, 5, 9, 11), (7, 5, 3, 3), {"padding": 1}),
                                                  ((3, 4, 12, 10), (9, 4, 5, 5), {"stride": 2, "padding": 2}),
                                                  ((2, 6, 8, 8), (6, 3, 3, 3), {"groups": 2, "dilation": 2}),
                                                  ((1, 3, 17, 13), (20, 3, 3, 2), {})])
def test_local_tiled_convolutions(local_tiles, shape, kernel, kwargs):
  """Convolutions through the tiles at sizes the tiles don't divide, forward and both gradients."""
  x, w = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(kernel).astype(np.float32)
  results = []
  for device in ("OPENCL", "NUMPY"):
    xs, ws = Tensor(x, device=device, requires_grad=True), Tensor(w, device=device, requires_grad=True)
    out = xs.conv2d(ws, **kwargs)
    (out * out).sum().backward()
    results.append([out.numpy(), xs.grad.numpy(), ws.grad.numpy()])
  for got, want in zip(*results): np.testing.assert_allclose(got, want, atol=1e-3, rtol=1e-4)


@pytest.mark.skipif(Device.available("CUDA"), reason="a CUDA GPU is present")
def test_cuda_says_why_it_is_missing():
  with pytest.raises(ValueError, match="device CUDA is unavailable: "):
    Tensor([1.0], device="CUDA")


@needs_opencl
def test_kernel_cache_keeps_source_then_binary(monkeypatch, tmp_path):
  """A program's source is stored the first time this machine builds it, its binary the second, and from then
  on the binary loads without building the source (runtime/ops_opencl.py says why in that order)."""
  from tinychad.runtime import cache
  monkeypatch.setenv("TINYCHAD_CACHE", str(tmp_path))
  device = Device["OPENCL"]
  source = "__kernel void twice(__global float* a) { a[get_global_id(0)] *= 2.0f; }"
  built = []
  build = device.build_program
  monkeypatch.setattr(device, "build_program", lambda text, name: built.append(text) or build(text, name))

  def run_in_new_process(load):
    cache._memory.clear()       # what a new process starts with: only the disk
    program = load()
    data = np.arange(4, dtype=np.float32)
    memory = device.allocator.alloc(data.nbytes)
    device.allocator.copyin(memory, data)
    import pyopencl as cl
    cl.Kernel(program, "twice")(device.queue, (4,), None, memory).wait()
    np.testing.assert_array_equal(device.allocator.copyout(memory, 4, np.float32), data * 2)
  key = device.binary_key(source, False)
  run_in_new_process(lambda: device.library(source, "twice")[0])
  assert len(built) == 1 and sorted(p.suffix for p in tmp_path.glob(key + "*")) == [".cl", ".sha256"]
  run_in_new_process(lambda: device.stored_library(key))
  assert len(built) == 2 and len(list(tmp_path.glob("*.clbin"))) == 1
  run_in_new_process(lambda: device.stored_library(key))
  assert len(built) == 2                     # loaded from the binary
  assert device.stored_library("0" * 64) is None


@needs_opencl
def test_device_memory_errors():
  with pytest.raises(MemoryError, match="OPENCL"):
    Tensor.empty(1 << 62, dtype=dtypes.uint8, device="OPENCL").realize()


def sample_workload() -> list[Tensor]:
  """On the default device: a sample of ops over every dtype, a conv net's training step with Adam
  (bench/cnn_train.py's), and bench/gpt.py's GPT forward and a training step of it; their results (the
  losses, the weights after the step, the ops' outputs), realized."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
  from bench.gpt import VOCAB, tensor_gpt, weight_shapes
  from tinychad.nn.optim import Adam
  Tensor.manual_seed(0)
  w = {name: (Tensor.randn(*shape) * 0.02).requires_grad_() for name, shape in weight_shapes(8).items()}
  logits = tensor_gpt(w, Tensor.randint(0, VOCAB, size=(2, 8)))
  opt = Adam(list(w.values()), lr=1e-3)
  gpt_loss = logits.reshape(16, VOCAB).cross_entropy(Tensor.randint(0, VOCAB, size=(16,)))
  gpt_loss.backward()
  opt.step()
  x = Tensor.randn(4, 1, 28, 28)
  conv1, conv2 = Tensor.randn(32, 1, 5, 5, requires_grad=True), Tensor.randn(64, 32, 5, 5, requires_grad=True)
  fc = Tensor.randn(10, 1024, requires_grad=True)
  opt = Adam([conv1, conv2, fc], lr=1e-3)
  h = x.conv2d(conv1).relu().max_pool2d(2).conv2d(conv2).relu().max_pool2d(2)
  cnn_loss = h.flatten(1).linear(fc.T).cross_entropy(Tensor.randint(0, 10, size=(4,)))
  cnn_loss.backward()
  opt.step()
  table = Tensor.randn(10, 6, requires_grad=True)
  picked = table[Tensor([1, 3, 3, 9, 0])]
  (picked * picked).sum().backward()
  outs = [gpt_loss, *w.values(), cnn_loss, conv1, conv2, fc, table.grad]
  for dtype in (dtypes.float16, dtypes.float64, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int64, dtypes.bool):
    a = Tensor([[1, 0, 3], [4, 5, 0]], dtype=dtype)
    outs += [(a + a) * a, a.max(1), a < a.T.reshape(2, 3), a.cast(dtypes.float32).exp() if dtype != dtypes.bool else a]
  f = Tensor.randn(33, 17)
  outs += [f.sin() / f.sqrt() % 3, f.bitcast(dtypes.int32) // 7, (f @ f.T).softmax(), f.cumsum(0), f.trunc(),
           Tensor.randn(5, 3000).sum(1), Tensor.randn(700).max(), Tensor.randn(3, 40, 24) @ Tensor.randn(3, 24, 45),
           Tensor.randn(30, 40).cast(dtypes.float64) @ Tensor.randn(40, 20).cast(dtypes.float64),
           Tensor.randint(0, 9, size=(30, 40)) @ Tensor.randint(0, 9, size=(40, 20))]
  for out in outs: out.realize()
  return outs


@functools.lru_cache(maxsize=None)
def _sample_kernels() -> tuple:
  """The ScheduleItem of every kernel of sample_workload(), run on NUMPY (fast to run, nothing to compile)."""
  previous, Device.DEFAULT = Device.DEFAULT, "NUMPY"
  try:
    with capture() as steps: sample_workload()
  finally:
    Device.DEFAULT = previous
  return tuple({(item.ast, item.name): item for item, _ in steps if item is not None and item.is_kernel}.values())


def _cuda_sources() -> tuple[tuple[str, str], ...]:
  """(name, CUDA source) of every kernel of _sample_kernels()."""
  # a CUDA GPU's shared memory is its own: matmul-shaped kernels are tiled through it (codegen/localtile.py)
  return tuple((item.name, render_gpu_library([lower_gpu(item, local_memory=True)], [item.name], "CUDA"))
               for item in _sample_kernels())


@needs_opencl
@pytest.mark.parametrize("local_memory", [False, True])
def test_pocl_builds_with_declared_builtins(local_memory):
  """On PoCL a program declares the builtins it calls instead of parsing the whole builtin header
  (runtime/ops_opencl.py, a fifth of the build): every kernel of the sample builds so, in one program."""
  device = Device["OPENCL"]
  if not device.declares_builtins: pytest.skip(f"{device.device.platform.name} builds with its builtin header")
  items = _sample_kernels()
  assert len(items) > 80
  symbols = [f"{item.name}_{i}" for i, item in enumerate(items)]
  device.build_declared(render_gpu_library([lower_gpu(item, local_memory) for item in items], symbols))


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_kernels_compile(arch):
  sources = _cuda_sources()
  assert len(sources) > 80 and sum("gidx_col" in source for _, source in sources) >= 5     # tiled through shared memory
  for name, source in sources: compile_cuda(source, arch, f"{name}.cu")      # raises on any error or warning


@needs_nvrtc
def test_nvrtc_reports_errors():
  with pytest.raises(RuntimeError, match="undefined"):
    compile_cuda('extern "C" __global__ void k(float* a) { a[0] = not_defined; }', "sm_80")
