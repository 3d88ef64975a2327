"""The CUDA device: kernels lowered for a launch grid (codegen/gpu.py), rendered to CUDA C (renderer/gpu.py),
compiled by NVRTC (runtime/nvrtc.py) for the GPU's own architecture and run through the CUDA driver API
(runtime/cuda_driver.py).

in: ScheduleItems to lower, GPU Programs to render and compile, Buffers of device memory
out: cubins (machine code for the GPU's sm_XY), cached on disk by the kernel cache under a key of the
     source, the architecture, NVRTC's version and its flags; kernels launched on the device's stream;
     device memory (cuMemAlloc) with host<->device copies for device.Buffer.
Where NVRTC doesn't know the GPU's architecture (a GPU newer than it), the device loads PTX for the newest
architecture NVRTC knows below it, and the driver compiles that for the GPU when it loads it.
Launches and copies to the device are queued on one stream and return at once, so Python schedules the next
kernel while the GPU runs this one; a copy to the host waits for everything queued before it (that is how
results reach numpy), Device["CUDA"].synchronize() waits too (benchmarks call it), and DEBUG>=2 waits after
every kernel, so that the time it prints is the kernel's and an error is reported by the kernel that made it.
Freed memory is kept by byte size for the next buffer of that size (cuMemAlloc and cuMemFree are slow, and
cuMemFree waits for the GPU); on an out-of-memory the kept memory goes back to the driver and the
allocation is tried once more, as PyTorch's caching allocator does.
STATUS: written without a GPU. It has never run on one: only the CUDA C and its compilation by NVRTC are
tested on machines without a GPU (test/test_opencl.py, test/test_cuda.py), and the driver calls against fake
drivers (test/test_cuda.py). test/test_cuda.py's GPU tests and the op suite run it where a GPU is present.
"""
from __future__ import annotations
import ctypes
import sys
import threading
from typing import Any, NamedTuple
import numpy as np
from tinychad.helpers import DEBUG
from tinychad.renderer.gpu import render_gpu_library
from tinychad.runtime.compiled import Compiled
from tinychad.runtime.cuda_driver import CUDAOutOfMemory, CUDAUnavailable, Driver, load_library, unavailable_reason
from tinychad.runtime.nvrtc import OPTIONS, compile_cubin, compile_cuda, nvrtc_version, supported_archs


class CUDAKernel(NamedTuple):
  fn: int                 # the CUfunction
  parallel: tuple         # (global sizes x3, local sizes x3), as codegen/gpu.py chose them
  address: int            # unused: a kernel is launched through the driver
  owner: Any              # the CUmodule holding it
  blocks: tuple           # the launch: blocks per grid dimension, threads per block
  threads: tuple
  name: str
  arguments: tuple        # cuLaunchKernel's arguments before the parameters, as ctypes values
  pointers: Any           # the buffers' device addresses of the next launch (the driver copies them at a launch)
  params: Any             # kernelParams: a pointer to each of `pointers`


class DeviceMemory:
  """One cuMemAlloc'd block: its device address and size."""
  __slots__ = ("pointer", "nbytes")

  def __init__(self, pointer: int, nbytes: int):
    self.pointer, self.nbytes = pointer, nbytes

  def __repr__(self) -> str: return f"<DeviceMemory 0x{self.pointer:x} {self.nbytes} bytes>"


class _Allocator:
  """Device memory for device.Buffer: blocks kept by byte size once freed, and copies to and from numpy arrays."""
  def __init__(self, device: CUDADevice):
    self.device, self.driver = device, device.driver
    self.free_blocks: dict[int, list[DeviceMemory]] = {}
    self.pooled_bytes = 0

  def alloc(self, nbytes: int) -> DeviceMemory:
    nbytes = max(nbytes, 1)       # cuMemAlloc refuses 0 bytes
    if self.free_blocks.get(nbytes):
      self.pooled_bytes -= nbytes
      return self.free_blocks[nbytes].pop()
    self.device.current()
    try:
      return DeviceMemory(self.driver.alloc(nbytes), nbytes)
    except CUDAOutOfMemory:
      if not self.pooled_bytes: raise self._out_of_memory(nbytes) from None
    self.empty()
    try:
      return DeviceMemory(self.driver.alloc(nbytes), nbytes)
    except CUDAOutOfMemory:
      raise self._out_of_memory(nbytes) from None

  def _out_of_memory(self, nbytes: int) -> CUDAOutOfMemory:
    try:
      free, total = self.driver.memory_info()
      state = f"{free / 2**20:.0f} MiB of {total / 2**20:.0f} MiB free"
    except Exception:     # the out-of-memory is the error to report, not this question's answer
      state = "free memory unknown"
    return CUDAOutOfMemory(f"CUDA out of memory: can't allocate {nbytes} bytes ({nbytes / 2**20:.1f} MiB) on "
                           f"{self.device.gpu_name} ({state})")

  def free(self, memory: DeviceMemory) -> None:
    self.free_blocks.setdefault(memory.nbytes, []).append(memory)
    self.pooled_bytes += memory.nbytes

  def empty(self) -> None:
    """Give every kept block back to the driver (after the queued work that may still read them)."""
    if not self.pooled_bytes or sys.is_finalizing(): return
    self.device.synchronize()
    for blocks in self.free_blocks.values():
      for memory in blocks: self.driver.free(memory.pointer)
    self.free_blocks.clear()
    self.pooled_bytes = 0

  def copyin(self, memory: DeviceMemory, array: np.ndarray) -> None:
    # from pageable memory the copy returns once the driver has staged the bytes, so `array` may go at once
    if array.nbytes:
      self.device.current()
      self.driver.copy_in(memory.pointer, array.ctypes.data, array.nbytes, self.device.stream)

  def copyout(self, memory: DeviceMemory, size: int, dtype) -> np.ndarray:
    out = np.empty(size, dtype=dtype)
    if out.nbytes:
      self.device.current()
      self.driver.copy_out(out.ctypes.data, memory.pointer, out.nbytes, self.device.stream)
      self.device.synchronize()
    return out


def choose_target(capability: int, archs: tuple[int, ...], nvrtc: tuple[int, int] = (0, 0)) -> tuple[str, str]:
  """(architecture, binary kind) for a GPU of compute capability `capability` (90 for 9.0) and an NVRTC that
  compiles for `archs`: its own sm_XY cubin when NVRTC knows it, else PTX for the newest one below it."""
  if capability in archs: return f"sm_{capability}", "cubin"
  older = [a for a in archs if a <= capability]
  if not older:
    raise CUDAUnavailable(f"device CUDA is unavailable: NVRTC {nvrtc[0]}.{nvrtc[1]} compiles for sm_{min(archs)} and "
                          f"newer, and this GPU is sm_{capability}")
  return f"compute_{max(older)}", "ptx"


class CUDADevice(Compiled):
  batch = True            # a module holds several kernels: one NVRTC compile for a schedule's new ones

  def __init__(self, name: str, driver: Driver | None = None):
    """The first GPU; `driver` replaces libcuda (tests give a fake one)."""
    super().__init__(name)
    if driver is None:
      if (reason := unavailable_reason()) is not None: raise CUDAUnavailable(f"device CUDA is unavailable: {reason}")
      driver = Driver(load_library())
    self.driver = driver
    driver.init()
    self.ordinal = driver.device(0)
    self.gpu_name = driver.device_name(self.ordinal)
    self.context = driver.primary_context(self.ordinal)
    self._thread = threading.local()       # a context is current per thread: NVRTC builds load modules in workers
    self.current()
    self.stream = driver.stream()
    self.max_grid = tuple(driver.attribute(f"max_grid_{axis}", self.ordinal) for axis in "xyz")
    self.capability = 10 * driver.attribute("cc_major", self.ordinal) + driver.attribute("cc_minor", self.ordinal)
    self.nvrtc = nvrtc_version()
    self.arch, self.kind = choose_target(self.capability, supported_archs(), self.nvrtc)
    self.suffix = f".{self.kind}"
    self.allocator = _Allocator(self)

  @staticmethod
  def available() -> bool: return unavailable_reason() is None

  def current(self) -> None:
    """Make the device's context the calling thread's (once per thread)."""
    if getattr(self._thread, "context", None) != self.context:
      self.driver.set_context(self.context)
      self._thread.context = self.context

  def synchronize(self) -> None:
    """Wait for every kernel and copy queued on the device's stream."""
    self.current()
    self.driver.synchronize(self.stream)

  def memory_bandwidth(self) -> float | None:
    """The GPU's peak memory bandwidth in bytes/s, from its memory clock and bus width (double data rate),
    or None where the driver doesn't say."""
    try:
      clock_khz = self.driver.attribute("memory_clock_khz", self.ordinal)
      bus_bits = self.driver.attribute("memory_bus_bits", self.ordinal)
    except Exception:
      return None
    return 2 * clock_khz * 1e3 * bus_bits / 8 if clock_khz and bus_bits else None

  # engine/realize lowers its kernels with codegen/gpu.py; a GPU's shared memory is its own: matmuls tile through it
  gpu_lowering, local_memory = True, True

  @staticmethod
  def renderer(programs: list, symbols: list[str]) -> str: return render_gpu_library(programs, symbols, "CUDA")

  def identity(self, source: str = "", contract: bool = False) -> str:
    # the GPU's name too: a loaded module is kept per process under the binary's key (runtime/cache.py's memoize)
    # and belongs to one device's context, and tests run fake devices beside a real one
    return f"NVRTC {self.nvrtc[0]}.{self.nvrtc[1]} {self.arch} {' '.join(OPTIONS)} {self.gpu_name}"

  def compile(self, source: str, name: str, contract: bool = False) -> bytes:
    # warnings don't stop a build here: test/test_opencl.py fails on any, for every kernel of the op suite
    if self.kind == "cubin": return compile_cubin(source, self.arch, f"{name}.cu", warnings_fail=False)
    return compile_cuda(source, self.arch, f"{name}.cu", warnings_fail=False).encode() + b"\0"

  def load(self, binary: bytes) -> int:
    self.current()
    return self.driver.load_module(binary)

  def kernel(self, handle: int, symbol: str, buffers: int, parallel) -> CUDAKernel:
    parallel = tuple(parallel)
    threads = parallel[3:]
    blocks = tuple(size // group for size, group in zip(parallel[:3], threads))
    for axis, count, limit in zip("xyz", blocks, self.max_grid):
      if count > limit:
        raise ValueError(f"CUDA: kernel {symbol} needs {count} blocks along {axis}, more than this GPU launches "
                         f"({limit}); its launch is {parallel[:3]} work-items in groups of {threads}")
    self.current()
    fn = self.driver.function(handle, symbol)
    # made once per kernel, filled per launch: with the ready-made arguments, a launch from Python went from 11-15 us
    # to 5-8 us (device.run against the C fake driver, on a loaded 2-core machine)
    pointers = (ctypes.c_uint64 * buffers)()
    params = (ctypes.c_void_p * buffers)(*[ctypes.addressof(pointers) + 8 * i for i in range(buffers)])
    return CUDAKernel(fn, parallel, 0, handle, blocks, threads, symbol,
                      self.driver.launch_arguments(fn, blocks, threads, self.stream), pointers, params)

  def run(self, kernel: CUDAKernel, bufs: list, points: int) -> None:
    """Queue `kernel` on the device's stream (realize launches one kernel at a time, so its arrays are free)."""
    self.current()
    pointers = kernel.pointers
    for i, buf in enumerate(bufs): pointers[i] = buf.allocate()._memory.pointer
    self.driver.launch(kernel.arguments, kernel.params, kernel.name)
    if DEBUG() >= 2: self.synchronize()


def device_class(): return CUDADevice
