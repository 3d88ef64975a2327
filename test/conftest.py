"""Shared test set-up: run op tests on every available device, seed everything, find the data.

The op suite (`each_device`) runs on every device with the kernel optimizations on, and once more on
each compiled device with them off (NOOPT=1): the plain loops must compute the same numbers.
"""
from __future__ import annotations
import os
import pathlib
import numpy as np
import pytest
from tinychad import Tensor
from tinychad.device import Device
from cuda_host import host_unavailable, install

# tests never touch the network: the shared MNIST copy sits next to the repository
_SHARED_MNIST = pathlib.Path(__file__).resolve().parents[2] / "shared" / "datasets" / "mnist"
if "TINYCHAD_DATA" not in os.environ and _SHARED_MNIST.exists():
  os.environ["TINYCHAD_DATA"] = str(_SHARED_MNIST)

# OPENCL joins wherever a platform is installed (TEST_OPENCL=0 leaves it out): on PoCL each new program costs
# ~0.05 s CPU to build (its builtins declared, not PoCL's whole header parsed) and each kernel ~0.12 s more at its
# first launch; cold, its ~1,900 tests took 1,351 s CPU on a loaded 2-core machine, where they took 2,657 s before
# (bench/README.md, "OPENCL": the whole part cold, before and after).
# CUDA joins wherever a GPU, its driver and NVRTC are there (never on CI: test/test_cuda.py says why not)
# CUDA_HOST (asked for with TEST_CUDA_HOST=1): the CUDA device with each module's CUDA C built for the host and run
# there (test/cuda_host.py); only asked for, as each new module is a g++ build of ~0.4 s (the CUDA dialect's
# property tests, training steps and sample run on it in test_gpu_devices.py and test_cuda.py anyway)
OPENCL_DEVICES = ["OPENCL"] if os.getenv("TEST_OPENCL", "1") != "0" and Device.available("OPENCL") else []
CUDA_HOST_DEVICES = ["CUDA_HOST"] if os.getenv("TEST_CUDA_HOST") == "1" and host_unavailable() is None else []
ALL_DEVICES = [name for name in ("NUMPY", "CPU", "LLVM") if Device.available(name)] + OPENCL_DEVICES + \
  (["CUDA"] if Device.available("CUDA") else []) + CUDA_HOST_DEVICES
# NUMPY has no kernels to optimize: only the CPU compilers run the op suite with NOOPT=1 as well (the GPU
# lowering of OPENCL and CUDA never uses the CPU's kernel optimizations)
NOOPT_DEVICES = [f"{name}-NOOPT" for name in ALL_DEVICES if name not in ("NUMPY", "OPENCL", "CUDA", "CUDA_HOST")]


@pytest.fixture
def set_noopt(monkeypatch):
  """set_noopt("0"/"1"): NOOPT for the rest of the test, with the compiled devices' loaded kernels
  forgotten for it; a device keeps every kernel it loaded, whatever NOOPT was then."""
  def setter(value: str) -> None:
    monkeypatch.setenv("NOOPT", value)
    for name in ("CPU", "LLVM"):
      if Device.available(name): monkeypatch.setattr(Device[name], "programs", {})
  return setter


@pytest.fixture(params=ALL_DEVICES + NOOPT_DEVICES)
def each_device(request, set_noopt, monkeypatch):
  """Makes the test run once per device, with that device as the default (NOOPT as the environment
  has it), and once per compiled device with NOOPT=1 ("CPU-NOOPT")."""
  device, _, noopt = request.param.partition("-")
  if noopt: set_noopt("1")
  if device == "CUDA_HOST":
    install(monkeypatch)
    device = "CUDA"
  previous = Device.DEFAULT
  Device.DEFAULT = device
  yield device
  Device.DEFAULT = previous


@pytest.fixture(params=["default"] + OPENCL_DEVICES + CUDA_HOST_DEVICES)
def train_device(request, monkeypatch):
  """Makes a training or TinyJit test run on the default device and once more on OPENCL (a GPU-style
  lowering: its own kernels, launches and device memory), as the default; with TEST_CUDA_HOST=1 on the
  host-run CUDA device too."""
  previous = Device.DEFAULT
  if request.param == "CUDA_HOST": install(monkeypatch)
  if request.param != "default": Device.DEFAULT = "CUDA" if request.param == "CUDA_HOST" else request.param
  yield Device.DEFAULT
  Device.DEFAULT = previous


@pytest.fixture(autouse=True)
def _seed(request):
  Tensor.manual_seed(0)
  np.random.seed(0)
  # a module's own `rng` too: each test then draws the same inputs whatever ran before it in this
  # process (pytest-xdist hands tests out in any order). Shared draws made a float sum's cancellation,
  # and so its rounding error against the reference, change from run to run.
  if request.module is not None and isinstance(getattr(request.module, "rng", None), np.random.Generator):
    request.module.rng = np.random.default_rng(0)
  yield
  # Module.train() also sets the global Tensor.training (tinygrad's switch): a test that trains a model must not
  # leave the next test on this worker in training mode (its dropout would drop)
  Tensor.training = False
