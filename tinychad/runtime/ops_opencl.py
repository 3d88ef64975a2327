"""The OPENCL device (also `CL`): kernels lowered for a launch grid (codegen/gpu.py), rendered to OpenCL C
(renderer/gpu.py), built by the platform's compiler through pyopencl and run on its first device.

in: ScheduleItems to lower, GPU Programs to render and build, Buffers of device memory
out: OpenCL programs (their source, then their binary, cached on disk by the kernel cache), kernels launched
     over their grid;
     device memory (cl.Buffer) with host<->device copies for device.Buffer.
On the CI machines the platform is PoCL (Debian's pocl-opencl-icd), which runs OpenCL on the CPU with
real work-groups, work-group memory and barriers. A launch waits for its kernel: realize times each
kernel alone, and a copy back to the host must see the results anyway.
"""
from __future__ import annotations
from typing import Any, NamedTuple
import numpy as np
from tinychad.renderer.gpu import render_gpu_library
from tinychad.renderer.opencl_builtins import BUILTIN_DECLARATIONS
from tinychad.runtime.cache import cache_key, cached_bytes, memoize, stored_bytes
from tinychad.runtime.compiled import Compiled

try:
  import pyopencl as cl
except ImportError:       # the device is then unavailable; asking for it says why
  cl = None


class GPUKernel(NamedTuple):
  fn: Any                 # the cl.Kernel
  parallel: tuple         # (global sizes x3, local sizes x3)
  address: int            # unused: a kernel is launched through the queue
  owner: Any              # the cl.Program holding it


class _Allocator:
  """cl.Buffers, freed ones kept by byte size for the next buffer of that size (bounded, as device.py's
  host pool is), and copies between them and numpy arrays."""
  LIMIT_BYTES = 1 << 30

  def __init__(self, context, queue, device):
    self.context, self.queue, self.device = context, queue, device
    self.free_buffers: dict[int, list] = {}
    self.pooled_bytes = 0

  def alloc(self, nbytes: int):
    nbytes = max(nbytes, 1)       # OpenCL has no empty buffers
    if self.free_buffers.get(nbytes):
      self.pooled_bytes -= nbytes
      return self.free_buffers[nbytes].pop()
    if nbytes > self.device.max_mem_alloc_size:
      raise MemoryError(f"OPENCL: {nbytes} bytes is more than {self.device.name} allocates at once "
                        f"({self.device.max_mem_alloc_size} bytes)")
    try:
      return cl.Buffer(self.context, cl.mem_flags.READ_WRITE, nbytes)
    except cl.Error as error:
      raise MemoryError(f"OPENCL: can't allocate {nbytes} bytes on {self.device.name}: {error}") from None

  def free(self, memory) -> None:
    if self.pooled_bytes + memory.size > self.LIMIT_BYTES: return
    self.free_buffers.setdefault(memory.size, []).append(memory)
    self.pooled_bytes += memory.size

  def copyin(self, memory, array: np.ndarray) -> None:
    if array.nbytes: cl.enqueue_copy(self.queue, memory, array, is_blocking=True)

  def copyout(self, memory, size: int, dtype) -> np.ndarray:
    out = np.empty(size, dtype=dtype)
    if out.nbytes: cl.enqueue_copy(self.queue, out, memory, is_blocking=True)
    return out


def _first_device():
  """The first device of the first OpenCL platform that has one, or None."""
  if cl is None: return None
  try:
    platforms = cl.get_platforms()
  except cl.Error:        # the ICD loader finds no platform
    return None
  for platform in platforms:
    try:
      devices = platform.get_devices()
    except cl.Error:
      continue
    if devices: return devices[0]
  return None


class OpenCLDevice(Compiled):
  batch = True            # an OpenCL program holds several kernels: one build for a schedule's new ones
  suffix = ".cl"

  def __init__(self, name: str):
    super().__init__(name)
    self.device = _first_device()
    if self.device is None:
      why = "pyopencl is not installed (pip install pyopencl)" if cl is None else \
        "no OpenCL platform with a device was found (on Debian: apt-get install pocl-opencl-icd)"
      raise RuntimeError(f"OPENCL device unavailable: {why}")
    self.context = cl.Context([self.device])
    self.queue = cl.CommandQueue(self.context, self.device)
    self.allocator = _Allocator(self.context, self.queue, self.device)
    # work-group memory of its own (a GPU's), not emulated in global memory (PoCL on a CPU: staging matmul tiles
    # there ran 2-5x slower than the register tile alone, bench/README.md "OPENCL")
    self.dedicated_local_memory = self.device.local_mem_type == cl.device_local_mem_type.LOCAL
    self.local_memory = self.dedicated_local_memory      # what the lowering uses (bench/opencl.py may force it)
    pocl = self.device.platform.name == "Portable Computing Language"
    # PoCL has clang parse its whole builtin header (opencl-c.h, 18,000 lines) for every program, ~80% of
    # building a small one: there a program declares the builtins it calls itself and skips that header
    self.declares_builtins = pocl
    # PoCL builds one program at a time (its compiler is locked per context): a schedule's kernels in one program
    if pocl: self.parallel_builds = 1

  @staticmethod
  def available() -> bool: return _first_device() is not None

  gpu_lowering = True   # engine/realize lowers its kernels with codegen/gpu.py, tiling through local_memory or not

  @staticmethod
  def renderer(programs: list, symbols: list[str]) -> str: return render_gpu_library(programs, symbols, "OPENCL")

  def identity(self, source: str = "", contract: bool = False) -> str:
    platform = self.device.platform
    # the lowering's choice too: kernel records made with work-group memory tiles name other sources
    device = self.device
    return f"{platform.name} {platform.version} {device.name} {device.driver_version} local={self.local_memory}" \
      f" declared={self.declares_builtins}"

  def build_program(self, source: str, name: str):
    if self.declares_builtins:
      try:
        return self.build_declared(source)
      except cl.Error:      # a PoCL whose headers are laid out otherwise: the whole header, as on any platform
        pass
    try:
      return cl.Program(self.context, source).build()
    except cl.Error as error:
      raise RuntimeError(f"OPENCL: kernel {name} doesn't build:\n{error}\n{source}") from None

  def build_declared(self, source: str):
    """`source` built with BUILTIN_DECLARATIONS in place of the builtin header: PoCL's _clang_opencl.h includes
    opencl-c.h only where _OPENCL_H_, that header's include guard, is undefined. Raises cl.Error."""
    return cl.Program(self.context, BUILTIN_DECLARATIONS + source).build(options=["-D_OPENCL_H_"])

  # The kernel cache keeps a program's source the first time this machine builds it, and its binary
  # (clGetProgramInfo(CL_PROGRAM_BINARIES)) the second time, from then on loaded with
  # clCreateProgramWithBinary. A binary isn't taken at the first build because on PoCL asking for it compiles
  # a generic work-group function for every kernel (~150 ms each), more than the kernel's own first launch
  # costs; a source this machine built before builds again cheaply against the driver's own cache
  # (~/.cache/pocl: ~55 ms a program), and its binary then loads in ~2-13 ms (bench/README.md, "OPENCL").
  def library(self, source: str, name: str, contract: bool = False):
    key = self.binary_key(source, contract)
    return memoize(key, lambda: self._program(key, source, name)), key

  def stored_library(self, key: str):
    return memoize(key, lambda: self._program(key, None, key))

  def _program(self, key: str, source: str | None, name: str):
    """The program cached under `key`: its binary loaded, else its source built (`source` when not on disk;
    None: nothing stored, never builds). The stored source of a program gets its binary stored beside it."""
    binary_key = cache_key("binary", key)
    if (binary := stored_bytes(binary_key, ".clbin")) is not None:
      try:
        return cl.Program(self.context, [self.device], [binary]).build()
      except cl.Error:        # a binary the driver no longer takes (same version string, new build): the source
        pass
    stored = stored_bytes(key, self.suffix)
    if stored is None and source is None: return None
    program = self.build_program(source if stored is None else stored.decode(), name)
    if stored is None: cached_bytes(key, self.suffix, source.encode)
    else: cached_bytes(binary_key, ".clbin", lambda: program.get_info(cl.program_info.BINARIES)[0])
    return program

  def kernel(self, handle, symbol: str, buffers: int, parallel) -> GPUKernel:
    return GPUKernel(cl.Kernel(handle, symbol), tuple(parallel), 0, handle)

  def build(self, program) -> GPUKernel:
    handle, _ = self.library(self.renderer([program], [program.name]), program.name)
    return self.kernel(handle, program.name, len(program.globals), program.parallel)

  def run(self, kernel: GPUKernel, bufs: list, points: int) -> None:
    fn, launch = kernel.fn, kernel.parallel
    fn.set_args(*[b.allocate()._memory for b in bufs])
    cl.enqueue_nd_range_kernel(self.queue, fn, launch[:3], launch[3:]).wait()


def device_class(): return OpenCLDevice
