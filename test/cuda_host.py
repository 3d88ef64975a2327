"""The CUDA device with its kernels run on the host: test/fake_libcuda.c as the driver (its "device memory" is
host memory), and each module's CUDA C, as renderer/gpu.py writes it for NVRTC, compiled by the host's C++
compiler against a small shim instead: blocks run one after another, a block's threads as an OpenMP team
(so __syncthreads() is a team barrier and a __shared__ array a static one the team shares), threads one
after another where the kernel has no barrier.

So the CUDA dialect's kernels compute, not only compile, without a GPU: the same lowering (launch grids,
grouped reduces, work-group tiles), the same source but for the prelude (NVRTC's half conversions are PTX,
here _Float16), and the device's own allocator, copies, launches and TinyJit replays through a C driver ABI.
What it can't show: anything about a GPU's speed, its memory model (warps, coalescing, bank conflicts), or
NVRTC's math library's rounding.
"""
from __future__ import annotations
import ctypes
import functools
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from tinychad.renderer.gpu import CUDA_PRELUDE

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")    # 128-thread teams on a 2-core machine: sleep, don't spin

HOST_PRELUDE = """#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <omp.h>
struct tc_dim3 { unsigned x, y, z; };
static tc_dim3 blockIdx, blockDim, gridDim;
static thread_local tc_dim3 threadIdx;
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __syncthreads() _Pragma("omp barrier")
template <class T, class F> inline T tc_bitcast(F x) { T r; memcpy(&r, &x, sizeof(r)); return r; }
inline float tc_h2f(unsigned short h) { _Float16 v; memcpy(&v, &h, 2); return (float)v; }
inline unsigned short tc_f2h(float f) { _Float16 v = (_Float16)f; unsigned short h; memcpy(&h, &v, 2); return h; }
inline float tc_half(float x) { return tc_h2f(tc_f2h(x)); }"""

LAUNCHER = """
template <class... A, size_t... I>
static void tc_call(void (*kernel)(A...), void** params, std::index_sequence<I...>) {
  kernel((A)(*(void**)params[I])...);   // each parameter points to the buffer's device address
}
template <class... A>
static void tc_run(void (*kernel)(A...), const unsigned* dims, void** params, bool barrier) {
  gridDim = {dims[0], dims[1], dims[2]};
  blockDim = {dims[3], dims[4], dims[5]};
  unsigned threads = dims[3] * dims[4] * dims[5];
  for (unsigned z = 0; z < dims[2]; z++)
    for (unsigned y = 0; y < dims[1]; y++)
      for (unsigned x = 0; x < dims[0]; x++) {
        blockIdx = {x, y, z};
        if (barrier) {
          #pragma omp parallel num_threads(threads)
          {
            if ((unsigned)omp_get_num_threads() != threads) abort();    // a barrier needs the whole block
            unsigned t = omp_get_thread_num();
            threadIdx = {t % dims[3], t / dims[3] % dims[4], t / (dims[3] * dims[4])};
            tc_call(kernel, params, std::index_sequence_for<A...>{});
          }
        } else {
          for (unsigned t = 0; t < threads; t++) {
            threadIdx = {t % dims[3], t / dims[3] % dims[4], t / (dims[3] * dims[4])};
            tc_call(kernel, params, std::index_sequence_for<A...>{});
          }
        }
      }
}
"""


def host_source(source: str) -> str:
  """A CUDA module's source (renderer/gpu.py's CUDA dialect) as host C++, with a `tc_launch_<kernel>(dims,
  params)` per kernel, which the fake driver's cuLaunchKernel calls."""
  assert source.startswith(CUDA_PRELUDE), "not a module renderer/gpu.py wrote"
  launchers = []
  for text in source.split('extern "C" __global__ void ')[1:]:     # each kernel's definition
    name, barrier = re.match(r"\w+", text).group(), "true" if "__syncthreads" in text else "false"
    launchers.append(f'extern "C" void tc_launch_{name}(const unsigned* dims, void** params) '
                     f'{{ tc_run({name}, dims, params, {barrier}); }}')
  return HOST_PRELUDE + source[len(CUDA_PRELUDE):] + LAUNCHER + "\n".join(launchers) + "\n"


def compile_host(source: str) -> bytes:
  """The shared object of a CUDA module compiled for the host: an x86-64 ELF image the fake driver loads."""
  with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "module.cpp"
    path.write_text(host_source(source))
    library = path.with_suffix(".so")
    out = subprocess.run(["g++", "-std=c++17", "-O1", "-fopenmp", "-fPIC", "-shared", "-w", "-o", str(library),
                          str(path)], capture_output=True, text=True)
    if out.returncode != 0: raise RuntimeError(f"host build of a CUDA module failed:\n{out.stderr}")
    return library.read_bytes()


def build_fake_driver(directory: Path) -> tuple[ctypes.CDLL, ctypes.CDLL] | None:
  """test/fake_libcuda.c built into a shared library in `directory`: (libcuda's functions as the device loads
  them, the library for the fake's own calls), or None without a C compiler. Each build is a driver of its own
  (its counters and memory apart)."""
  from tinychad.runtime import cuda_driver
  compiler = shutil.which("gcc") or shutil.which("clang") or shutil.which("cc")
  if compiler is None: return None
  path = directory / "libcuda.so.1"
  subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(path),
                  str(Path(__file__).parent / "fake_libcuda.c"), "-ldl"], check=True, capture_output=True)
  return cuda_driver.load_library((str(path),)), ctypes.CDLL(str(path))


@functools.lru_cache(maxsize=None)
def fake_driver() -> tuple[ctypes.CDLL, ctypes.CDLL] | None:
  """The fake driver the host-run device uses, built once per process (the file goes once it is loaded)."""
  with tempfile.TemporaryDirectory(prefix="fake_cuda") as tmp: return build_fake_driver(Path(tmp))


def host_unavailable() -> str | None:
  """Why the host-run CUDA device can't be made here, or None."""
  from tinychad.runtime.nvrtc import load_nvrtc
  # the fake driver tells a host object from a cubin by the ELF machine: x86-64's (a cubin's is CUDA's)
  if platform.machine() != "x86_64": return f"host-run CUDA needs an x86-64 host, this is {platform.machine()}"
  if shutil.which("g++") is None: return "no g++ to build CUDA modules for the host"
  if load_nvrtc() is None: return "NVRTC missing (the device asks it which architectures it compiles for)"
  if fake_driver() is None: return "no C compiler for the fake driver"
  return None


def install_fake(monkeypatch, lib):
  """The CUDA device on the fake driver `lib` (a FakeLib, or the C one) as Device["CUDA"] for one test
  (monkeypatch undoes it; NVRTC compiles for real); returns the device."""
  from tinychad.device import Device
  from tinychad.runtime import cuda_driver
  from tinychad.runtime.ops_cuda import CUDADevice
  # the default device is picked before the fake driver is in, so that a first pick under it isn't kept after
  monkeypatch.setattr(Device, "_default", Device.DEFAULT)
  device = CUDADevice("CUDA", cuda_driver.Driver(lib))
  monkeypatch.setattr(cuda_driver, "unavailable_reason", lambda names=None: None)
  monkeypatch.setitem(Device._devices, "CUDA", device)
  return device


def install(monkeypatch):
  """The host-run CUDA device as Device["CUDA"] for one test (monkeypatch undoes it); returns the device."""
  lib, fake = fake_driver()
  fake.fake_set(ctypes.c_size_t(1 << 34), 0)
  device = install_fake(monkeypatch, lib)
  identity = device.identity
  # its own kernel records and cache entries: a host object where the fake-driver tests keep cubins
  monkeypatch.setattr(device, "identity", lambda source="", contract=False: identity(source, contract) + " host-run")
  monkeypatch.setattr(device, "compile", lambda source, name, contract=False: compile_host(source))
  return device
