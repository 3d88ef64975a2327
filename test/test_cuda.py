"""The CUDA device. Three kinds of tests:
  - everywhere: its error paths and its plumbing, against a fake driver (FakeLib below: libcuda's functions,
    with memory that is host bytes and launches that are only recorded): no driver, no GPU, a driver older
    than NVRTC, every CUresult turned into an error naming the call, out-of-memory as MemoryError, the
    architecture NVRTC compiles for, the copies, the launch geometry and arguments, the device choice;
  - computing (the `cuda` fixture): a training step against the CPU, a TinyJit replay, and the ~130 kernels of
    test_opencl.py's sample against NUMPY, on the GPU where one is present and everywhere on the host-run
    device (test/cuda_host.py: each module's CUDA C built by g++, launched by the C fake driver);
  - where a GPU is present (skipped elsewhere, the reason saying "no CUDA GPU"): a real out-of-memory.
The property tests against the NUMPY reference and gradients across .to("CUDA") are test_gpu_devices.py's (for
OPENCL and the host-run device too); the op suite runs on CUDA through conftest's `each_device` where a GPU is
present, and on the host-run device with TEST_CUDA_HOST=1.
test/fake_libcuda.c is the fake driver in C: the same calls across a real C ABI.
The CUDA C of every kernel of the op suite and of the bench models compiles to PTX with NVRTC in
test/test_opencl.py; here the same kernels build to sm_90 cubins (what the device loads on an H100), and the
flash-attention kernels, which that sample lacks, both compile and run through the GPU lowering (on OPENCL).
"""
from __future__ import annotations
import ctypes
import os
import subprocess
import sys
from pathlib import Path
import numpy as np
import pytest
from tinychad import Tensor, TinyJit, dtypes, nn
from tinychad.device import Device
from tinychad.nn.optim import Adam
from tinychad.nn.state import get_parameters
from tinychad.runtime import cuda_driver
from tinychad.runtime.cuda_driver import CUDAError, CUDAOutOfMemory, CUDAUnavailable, Driver, too_old
from tinychad.runtime.nvrtc import load_nvrtc
from cuda_host import build_fake_driver, host_unavailable, install, install_fake

has_cuda = Device.available("CUDA")
needs_cuda = pytest.mark.skipif(not has_cuda, reason=f"no CUDA GPU: {cuda_driver.unavailable_reason()}")
needs_nvrtc = pytest.mark.skipif(load_nvrtc() is None, reason="NVRTC missing (pip install nvidia-cuda-nvrtc-cu12)")
rng = np.random.default_rng(0)


class FakeLib:
  """libcuda's functions as the CUDA device calls them (Python ints in, outputs through byref), on one fake GPU
  of compute capability 9.0 with `capacity` bytes. `fail` maps a function's name to the CUresult it returns."""
  def __init__(self, capacity: int = 1 << 20, max_grid=(2**31 - 1, 65535, 65535), fail: dict | None = None):
    self.capacity, self.max_grid, self.fail = capacity, max_grid, fail or {}
    self.memory: dict[int, bytearray] = {}
    self.next_pointer, self.freed, self.modules, self.launches, self.synced = 0x1000, [], [], [], 0
    self.arguments = 0         # how many kernel arguments a launch's params point to (the test sets it)

  def __getattr__(self, name: str):
    raise AttributeError(name)     # a function the fake doesn't have: as a driver without it

  def _out(self, ref, value) -> int:
    ref._obj.value = value        # ctypes.byref(x)._obj is x
    return 0

  def _call(self, name: str, result=0) -> int: return self.fail.get(name, result)

  def cuInit(self, flags): return self._call("cuInit")
  def cuDriverGetVersion(self, ref): return self._call("cuDriverGetVersion") or self._out(ref, 13000)
  def cuDeviceGetCount(self, ref): return self._call("cuDeviceGetCount") or self._out(ref, 1)
  def cuDeviceGet(self, ref, ordinal): return self._call("cuDeviceGet") or self._out(ref, ordinal)
  def cuDeviceGetName(self, buf, size, device):
    buf.value = b"Fake GPU"
    return self._call("cuDeviceGetName")
  def cuDeviceGetAttribute(self, ref, attribute, device):
    values = {5: self.max_grid[0], 6: self.max_grid[1], 7: self.max_grid[2], 75: 9, 76: 0, 36: 2619000, 37: 5120}
    return self._call("cuDeviceGetAttribute") or self._out(ref, values[attribute])
  def cuDevicePrimaryCtxRetain(self, ref, device): return self._call("cuDevicePrimaryCtxRetain") or self._out(ref, 0xC0)
  def cuCtxSetCurrent(self, context): return self._call("cuCtxSetCurrent")
  def cuStreamCreate(self, ref, flags): return self._call("cuStreamCreate") or self._out(ref, 0x5)

  def cuStreamSynchronize(self, stream):
    self.synced += 1
    return self._call("cuStreamSynchronize")

  def cuMemAlloc_v2(self, ref, nbytes):
    if self.fail.get("cuMemAlloc_v2") or sum(map(len, self.memory.values())) + nbytes > self.capacity:
      return self.fail.get("cuMemAlloc_v2", 2)
    pointer, self.next_pointer = self.next_pointer, self.next_pointer + nbytes + 256
    self.memory[pointer] = bytearray(nbytes)
    return self._out(ref, pointer)

  def cuMemFree_v2(self, pointer):
    self.memory.pop(pointer, None)
    self.freed.append(pointer)
    return self._call("cuMemFree_v2")

  def cuMemGetInfo_v2(self, free, total):
    self._out(free, self.capacity - sum(map(len, self.memory.values())))
    return self._out(total, self.capacity)

  def cuMemcpyHtoDAsync_v2(self, pointer, host, nbytes, stream):
    self.memory[pointer][:nbytes] = ctypes.string_at(host, nbytes)
    return self._call("cuMemcpyHtoDAsync_v2")

  def cuMemcpyDtoHAsync_v2(self, host, pointer, nbytes, stream):
    ctypes.memmove(host, bytes(self.memory[pointer][:nbytes]), nbytes)
    return self._call("cuMemcpyDtoHAsync_v2")

  def cuModuleLoadData(self, ref, image):
    self.modules.append(image)
    return self._call("cuModuleLoadData") or self._out(ref, len(self.modules))

  def cuModuleGetFunction(self, ref, module, name): return self._call("cuModuleGetFunction") or self._out(ref, 0xF00)

  def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
    pointers = [ctypes.c_uint64.from_address(params[i]).value for i in range(self.arguments)]
    # the device passes ready-made ctypes values (c_void_p, c_uint)
    self.launches.append(((gx.value, gy.value, gz.value), (bx.value, by.value, bz.value), stream.value, pointers))
    return self._call("cuLaunchKernel")


@pytest.fixture
def fake_cuda(monkeypatch):
  """Installs the CUDA device on a fake driver (a FakeLib, or the C one) for the test: fake_cuda(lib) -> device."""
  return lambda lib: install_fake(monkeypatch, lib)


# ---- everywhere: the error paths ----

def test_no_driver_says_why(monkeypatch):
  reason = cuda_driver._reason(("libcuda_not_installed.so.1",))
  assert reason.startswith("no NVIDIA driver") and "libcuda_not_installed.so.1" in reason
  monkeypatch.setattr(cuda_driver, "unavailable_reason", lambda names=None: reason)
  with pytest.raises(CUDAUnavailable, match="device CUDA is unavailable: no NVIDIA driver"):
    Tensor([1.0], device="CUDA")
  with pytest.raises(ValueError, match="no NVIDIA driver"):      # CUDAUnavailable is a ValueError
    Tensor([1.0]).to("cuda")
  assert not Device.available("CUDA")


@pytest.mark.parametrize("code, says", [(100, "no CUDA GPU is visible"), (34, "stub library"),
                                        (803, "different versions"), (999, "cuInit failed")])
def test_a_driver_that_cannot_start_says_why(monkeypatch, code, says):
  monkeypatch.setattr(cuda_driver, "load_library", lambda names: FakeLib(fail={"cuInit": code}))
  reason = cuda_driver._reason(("fake",))
  assert reason.startswith("the NVIDIA driver can't start") and says in reason and cuda_driver.ERROR_NAMES[code] in reason


def test_no_gpu_and_an_old_driver_say_why(monkeypatch):
  lib = FakeLib()
  monkeypatch.setattr(cuda_driver, "load_library", lambda names: lib)
  lib.cuDeviceGetCount = lambda ref: lib._out(ref, 0)
  assert cuda_driver._reason(("fake",)) == "no CUDA GPU: the NVIDIA driver sees no device"
  assert too_old(12020, (12, 9)) is None and too_old(13000, (12, 9)) is None
  message = too_old(11080, (12, 9))
  assert "too old" in message and "CUDA 11.8" in message and "NVRTC 12.9" in message and "nvrtc-cu11" in message


def test_every_curesult_is_an_error_naming_the_call():
  driver = Driver(FakeLib(fail={"cuStreamSynchronize": 700, "cuMemFree_v2": 12345}))
  with pytest.raises(CUDAError, match="cuStreamSynchronize .*failed: CUDA_ERROR_ILLEGAL_ADDRESS") as info:
    driver.synchronize(5)
  assert info.value.call == "cuStreamSynchronize" and info.value.code == 700
  with pytest.raises(CUDAError, match="cuMemFree_v2 failed: CUresult 12345"): driver.free(0x1000)
  # the driver's own name and text for a code, where it gives them
  lib = FakeLib(fail={"cuInit": 3})

  def name(code, ref):
    ref._obj.value = b"CUDA_ERROR_NOT_INITIALIZED"
    return 0

  def text(code, ref):
    ref._obj.value = b"initialization error"
    return 0
  lib.cuGetErrorName, lib.cuGetErrorString = name, text
  with pytest.raises(CUDAError, match=r"cuInit failed: CUDA_ERROR_NOT_INITIALIZED \(initialization error\)"):
    Driver(lib).init()


def test_out_of_memory_is_a_memory_error_naming_the_size():
  with pytest.raises(MemoryError, match="cuMemAlloc_v2 of 4096 bytes failed: CUDA_ERROR_OUT_OF_MEMORY"):
    Driver(FakeLib(capacity=1024)).alloc(4096)


@needs_nvrtc
def test_device_out_of_memory_names_size_after_giving_back_its_pool(fake_cuda):
  lib = FakeLib(capacity=1 << 16)
  device = fake_cuda(lib)
  with pytest.raises(CUDAOutOfMemory, match=r"can't allocate 262144 bytes \(0.2 MiB\) on Fake GPU \(0 MiB of 0 MiB free\)"):
    Tensor.empty(65536, dtype=dtypes.float32, device="CUDA").realize()
  # freed blocks wait in the pool; an allocation that needs their room gets it back from them
  kept = [device.allocator.alloc(1 << 14) for _ in range(3)]
  for block in kept: device.allocator.free(block)
  assert device.allocator.pooled_bytes == 3 << 14 and not lib.freed
  block = device.allocator.alloc(1 << 15)
  assert len(lib.freed) == 3 and device.allocator.pooled_bytes == 0 and block.nbytes == 1 << 15
  assert lib.synced >= 1        # the pool waited for queued kernels before freeing


@needs_nvrtc
def test_every_kernel_builds_to_a_cubin():
  """What the device loads on an H100: machine code for sm_90 (the PTX check, test/test_opencl.py, stops before
  the assembler, which is where register and shared-memory limits fail)."""
  from test_opencl import _cuda_sources
  from tinychad.runtime.nvrtc import compile_cubin
  for name, source in _cuda_sources(): assert compile_cubin(source, "sm_90", f"{name}.cu")[:4] == b"\x7fELF"


def _attention(device: str, causal: bool, masked: bool):
  """Flash attention's output and gradients on `device` (every kernel of it: forward, dq, dkv, dmask)."""
  arrays = [np.random.default_rng(i).standard_normal((2, 3, 37, 16)).astype(np.float32) for i in range(3)]
  q, k, v = (Tensor(a, device=device, requires_grad=True) for a in arrays)
  mask = Tensor(np.random.default_rng(3).standard_normal((37, 37)).astype(np.float32), device=device,
                requires_grad=True) if masked else None
  out = q.scaled_dot_product_attention(k, v, attn_mask=mask, is_causal=causal)
  (out * out).sum().backward()
  return [t.numpy() for t in (out, q.grad, k.grad, v.grad) + ((mask.grad,) if masked else ())]


@needs_nvrtc
def test_attention_kernels_compile_for_cuda():
  """The flash-attention kernels through the GPU lowering: their CUDA C builds for sm_80 and sm_90 (test_opencl.py's
  kernel sample has none)."""
  from tinychad.codegen.gpu import lower_gpu
  from tinychad.engine.realize import capture
  from tinychad.renderer.gpu import render_gpu_library
  from tinychad.runtime.nvrtc import compile_cubin, compile_cuda
  with capture() as steps:
    for causal, masked in ((True, False), (False, True)): _attention("NUMPY", causal, masked)
  items = {(item.ast, item.name): item for item, _ in steps if item is not None and item.ast.op.name == "ATTENTION"}
  assert {item.ast.arg.mode for item in items.values()} == {"forward", "dq", "dkv", "dmask"}
  for item in items.values():
    source = render_gpu_library([lower_gpu(item)], [item.name], "CUDA")
    compile_cuda(source, "sm_80", f"{item.name}.cu")
    assert compile_cubin(source, "sm_90", f"{item.name}.cu")[:4] == b"\x7fELF"


@pytest.mark.skipif(not Device.available("OPENCL"), reason="no OpenCL platform (apt-get install pocl-opencl-icd)")
@pytest.mark.parametrize("causal, masked", [(True, False), (False, True)])
def test_attention_runs_through_the_gpu_lowering(causal, masked):
  """The same kernels run on OPENCL, the GPU lowering's device that runs everywhere, against the NUMPY reference."""
  for got, want in zip(_attention("OPENCL", causal, masked), _attention("NUMPY", causal, masked)):
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)


def test_the_architecture_nvrtc_compiles_for():
  from tinychad.runtime.ops_cuda import choose_target
  assert choose_target(90, (75, 80, 90, 100)) == ("sm_90", "cubin")
  assert choose_target(110, (75, 80, 90, 100)) == ("compute_100", "ptx")   # a GPU newer than NVRTC: the driver JITs
  with pytest.raises(CUDAUnavailable, match="compiles for sm_75 and newer, and this GPU is sm_61"):
    choose_target(61, (75, 80, 90), (13, 0))


# ---- everywhere: the device's plumbing on the fake driver ----

@needs_nvrtc
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.bool_, np.uint8])
def test_copies_round_trip(fake_cuda, dtype):
  fake_cuda(FakeLib())
  data = (rng.standard_normal((3, 5)) * 10).astype(dtype)
  on_gpu = Tensor(data, device="CUDA")
  assert on_gpu.device == "CUDA"
  np.testing.assert_array_equal(on_gpu.numpy(), data)
  np.testing.assert_array_equal(Tensor(data).to("CUDA").to("CPU").numpy(), data)
  assert Tensor.empty(0, 3, device="CUDA").numpy().shape == (0, 3)


@needs_nvrtc
def test_a_launch_gets_its_grid_and_buffers(fake_cuda):
  lib = FakeLib()
  device = fake_cuda(lib)
  a, b = (Tensor(rng.standard_normal(s).astype(np.float32), device="CUDA") for s in ((64, 32), (32, 48)))
  lib.arguments = 3
  out = (a @ b).realize()
  assert len(lib.launches) == 1 and lib.modules[0][:4] == b"\x7fELF"     # a cubin, compiled by NVRTC for sm_90
  blocks, threads, stream, pointers = lib.launches[0]
  kernel = next(iter(device.programs.values()))
  assert device.arch == "sm_90" and stream == device.stream
  assert tuple(b * t for b, t in zip(blocks, threads)) == kernel.parallel[:3] and threads == kernel.parallel[3:]
  buffers = [out.lazydata.base.realized, a.lazydata.base.realized, b.lazydata.base.realized]
  assert sorted(pointers) == sorted(buf._memory.pointer for buf in buffers)
  assert pointers[0] == buffers[0]._memory.pointer           # the output first, as the kernel's data0


@needs_nvrtc
def test_a_grid_too_big_for_the_gpu_is_a_clear_error(fake_cuda):
  fake_cuda(FakeLib(max_grid=(2**31 - 1, 2, 2)))
  x = Tensor(np.ones((300, 5, 7), np.float32), device="CUDA")
  with pytest.raises(ValueError, match="blocks along [yz], more than this GPU launches"):
    x.permute(2, 1, 0).sum(1).realize()     # a grid of (7, 304) work-items in groups of (7, 16): 19 blocks along y


@pytest.fixture(scope="module")
def c_driver(tmp_path_factory):
  """test/fake_libcuda.c built into a shared library of this module's own: (libcuda's functions as the device
  loads them, the library)."""
  built = build_fake_driver(tmp_path_factory.mktemp("fake_cuda"))
  if built is None: pytest.skip("no C compiler for the fake driver")
  return built


@needs_nvrtc
def test_the_device_through_a_c_abi(fake_cuda, c_driver):
  """Every driver call crosses C as it would into libcuda: outputs through pointers, 64-bit device addresses
  (above 4 GiB, so a cut one shows), size_t sizes, the kernel parameter array, error names from the driver."""
  lib, fake = c_driver
  fake.fake_set(ctypes.c_size_t(1 << 20), 3)
  device = fake_cuda(lib)
  assert device.gpu_name == "Fake C GPU" and device.arch == "sm_90" and device.max_grid == (2**31 - 1, 65535, 65535)
  assert device.memory_bandwidth() == 2 * 2619e6 * 640
  sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
  from bench.gpu import _describe
  assert _describe(device, "CUDA").startswith("GPU: Fake C GPU (sm_90, 132 SMs), driver CUDA 13.0, NVRTC ")
  data = rng.standard_normal((20, 30)).astype(np.float32)
  a, b = Tensor(data, device="CUDA"), Tensor(data.T.copy(), device="CUDA")
  np.testing.assert_array_equal(a.numpy(), data)            # bytes through the C memcpys and back
  assert a.lazydata.base.realized._memory.pointer > 2**32
  out = (a @ b).realize()
  dims, args, name = (ctypes.c_uint * 6)(), (ctypes.c_uint64 * 16)(), ctypes.create_string_buffer(256)
  assert fake.fake_launch(dims, args, name) == 1
  kernel = next(iter(device.programs.values()))
  assert name.value.decode() == kernel.name and tuple(dims) == kernel.blocks + kernel.threads
  assert list(args[:3]) == [t.lazydata.base.realized._memory.pointer for t in (out, a, b)]
  assert fake.fake_syncs() >= 1                              # the copy back waited for the stream
  with pytest.raises(CUDAOutOfMemory, match=r"can't allocate 4194304 bytes \(4.0 MiB\) on Fake C GPU \(\d+ MiB of 1 MiB"):
    Tensor.empty(1 << 20, device="CUDA").realize()
  with pytest.raises(CUDAError, match=r"cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE \(device kernel image is invalid\)"):
    device.load(b"not a cubin")


@needs_nvrtc
def test_a_jitted_training_step_launches_through_the_c_driver(fake_cuda, c_driver):
  """A TinyJit training step (forward, backward, Adam) on the device: every kernel built, loaded and launched
  through the C driver; the replays launch the recorded kernels again, the same number each step. (The fake
  runs no kernel, so the numbers are not checked: the GPU tests do that.)"""
  lib, fake = c_driver
  fake.fake_set(ctypes.c_size_t(1 << 26), 1)
  fake_cuda(lib)
  w = Tensor(rng.standard_normal((32, 10)).astype(np.float32), device="CUDA", requires_grad=True)
  opt = Adam([w], lr=1e-3)
  x, y = Tensor(rng.standard_normal((16, 32)).astype(np.float32), device="CUDA"), Tensor(rng.integers(0, 10, 16), device="CUDA")

  @TinyJit
  def step(x, y):
    opt.zero_grad()
    loss = (x @ w).cross_entropy(y)
    loss.backward()
    opt.step()
    return loss

  counts, last = [], 0
  buf = (ctypes.c_uint * 6)(), (ctypes.c_uint64 * 16)(), ctypes.create_string_buffer(256)
  for _ in range(4):
    step(x, y).realize()
    launches = fake.fake_launch(*buf)
    counts.append(launches - last)
    last = launches
  assert counts[0] > 3 and counts[2] == counts[3] > 0      # steps 3 and 4 are replays


def _default_device(**env: str) -> subprocess.CompletedProcess:
  code = "from tinychad import Device, Tensor; print(Device.DEFAULT); print(Tensor([1.0, 2.0]).sum().item())"
  clean = {k: v for k, v in os.environ.items() if k not in ("DEVICE", "LLVM")}
  return subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=120)


def test_default_device_is_cuda_only_where_it_runs():
  out = _default_device()
  assert out.returncode == 0, out.stderr
  fallback = next((name for name in ("CPU", "LLVM") if Device.available(name)), "NUMPY")
  assert out.stdout.split()[0] == ("CUDA" if has_cuda else fallback)
  assert out.stdout.split()[1] == "3.0"


def test_forcing_cuda_says_why_it_cannot_run():
  out = _default_device(DEVICE="CUDA")
  if has_cuda:
    assert out.returncode == 0 and out.stdout.split() == ["CUDA", "3.0"], out.stderr
  else:
    assert out.returncode != 0 and "CUDAUnavailable: device CUDA is unavailable: " in out.stderr
    assert cuda_driver.unavailable_reason() in out.stderr and "Segmentation" not in out.stderr


# ---- computing: on a GPU where one is present, and everywhere on the host-run device ----

def _losses(device: str, build, steps: int = 3) -> list[float]:
  """Losses of `steps` optimizer steps with `device` as the default; build() -> (optimizer, loss function) is
  called after the seed is set, so every device starts from the same weights."""
  previous, Device.DEFAULT = Device.DEFAULT, device
  Tensor.manual_seed(0)
  try:
    opt, loss_of = build()
    losses = []
    for _ in range(steps):
      opt.zero_grad()
      loss = loss_of()
      loss.backward()
      opt.step()
      losses.append(loss.item())
    return losses
  finally:
    Device.DEFAULT = previous


def _conv_net():
  """A small conv net with Adam."""
  conv, fc = nn.Conv2d(1, 8, 3), nn.Linear(8 * 13 * 13, 10)
  data = np.random.default_rng(1).standard_normal((16, 1, 28, 28)).astype(np.float32)
  labels = np.random.default_rng(2).integers(0, 10, 16)
  loss_of = lambda: fc(conv(Tensor(data)).relu().max_pool2d(2).flatten(1)).cross_entropy(Tensor(labels))
  return Adam(get_parameters([conv, fc]), lr=1e-3), loss_of


@pytest.fixture(params=[pytest.param("GPU", marks=needs_cuda),
                        pytest.param("host", marks=pytest.mark.skipif(host_unavailable() is not None,
                                                                      reason=str(host_unavailable())))])
def cuda(request, monkeypatch) -> str:
  """Device "CUDA" on the GPU, and on the host: the fake C driver running each module's CUDA C compiled for
  the host (test/cuda_host.py), so these tests compute through the CUDA dialect on every machine."""
  if request.param == "host": install(monkeypatch)
  return "CUDA"


def test_training_step_matches_cpu(cuda):
  np.testing.assert_allclose(_losses(cuda, _conv_net), _losses("CPU", _conv_net), rtol=1e-4)


def _model(name: str):
  """A small ResNet, GPT or ViT with AdamW, on its own data."""
  from tinychad.models.gpt import GPT, GPTConfig
  from tinychad.models.resnet import BasicBlock, ResNet
  from tinychad.models.vit import ViT, ViTConfig
  from tinychad.nn.optim import AdamW
  data = np.random.default_rng(1)
  images, classes = data.standard_normal((4, 3, 16, 16)).astype(np.float32), data.integers(0, 10, 4)
  tokens = data.integers(0, 64, (2, 33))
  if name == "resnet":
    model = ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10, width=8, small_input=True)
    loss_of = lambda: model(Tensor(images)).cross_entropy(Tensor(classes))
  elif name == "gpt":
    model = GPT(GPTConfig(block_size=32, vocab_size=64, n_layer=2, n_head=2, n_embd=32))
    loss_of = lambda: model(Tensor(tokens[:, :-1]), Tensor(tokens[:, 1:]))[1]
  else:
    model = ViT(ViTConfig(img_size=16, patch_size=4, num_classes=10, embed_dim=32, depth=2, num_heads=2))
    loss_of = lambda: model(Tensor(images)).cross_entropy(Tensor(classes))
  model.train()
  return AdamW(get_parameters(model), lr=1e-3), loss_of


@pytest.mark.parametrize("name", ["resnet", "gpt", "vit"])
def test_models_train_as_on_the_cpu(cuda, name):
  """BatchNorm, convolutions through work-group tiles, flash attention, LayerNorm, embeddings, AdamW."""
  build = lambda: _model(name)
  np.testing.assert_allclose(_losses(cuda, build), _losses("CPU", build), rtol=1e-4)


def test_the_sample_computes_as_on_numpy(cuda):
  """Every kernel of test_opencl.py's sample (a GPT and a CNN training step with Adam, ops over every dtype:
  the kernels the NVRTC tests compile) computes what NUMPY does."""
  from test_opencl import sample_workload
  results = {}
  for device in (cuda, "NUMPY"):
    previous, Device.DEFAULT = Device.DEFAULT, device
    try:
      results[device] = [out.numpy() for out in sample_workload()]
    finally:
      Device.DEFAULT = previous
  for got, want in zip(results[cuda], results["NUMPY"]):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_grid_past_65535_blocks_folds(cuda):
  """65,600 rows of 128 would be 65,600 blocks along y, which CUDA refuses: the lowering folds them into x."""
  x = (np.arange(65600 * 2 * 128) % 7).astype(np.float32).reshape(65600, 2, 128)
  np.testing.assert_array_equal(Tensor(x, device=cuda).sum(1).numpy(), x.sum(1))


def test_jit_replay_on_cuda(cuda):
  w = Tensor(rng.standard_normal((32, 16)).astype(np.float32), device="CUDA")
  step = TinyJit(lambda x: (x @ w).relu().sum(1))
  for i in range(4):
    x = rng.standard_normal((8, 32)).astype(np.float32)
    np.testing.assert_allclose(step(Tensor(x, device="CUDA")).numpy(), np.maximum(x @ w.numpy(), 0).sum(1), rtol=1e-4)


@needs_cuda
def test_real_out_of_memory():
  with pytest.raises(MemoryError, match="CUDA out of memory: can't allocate"):
    Tensor.empty(1 << 50, dtype=dtypes.uint8, device="CUDA").realize()
  np.testing.assert_array_equal((Tensor([1.0, 2.0], device="CUDA") * 2).numpy(), [2.0, 4.0])   # still usable
