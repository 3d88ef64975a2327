"""The CUDA driver API (libcuda, installed with the NVIDIA driver) through ctypes, every call checked.

in: the driver library (LIBRARY_NAMES), or any object with the same functions (a fake driver, in tests)
out: Driver: the few calls the CUDA device makes (start, device facts, memory, copies, modules, launches)
     as Python methods. Every CUresult is checked: a nonzero one raises CUDAError naming the call, the
     error's name and the driver's description; CUDA_ERROR_OUT_OF_MEMORY raises CUDAOutOfMemory, a
     MemoryError. unavailable_reason(): why CUDA can't run in this process (no driver, the driver can't
     start, no GPU, NVRTC missing, a driver older than NVRTC), or None; computed once, and where no driver
     is installed it costs one failed dlopen.
Why ctypes and not PyPI's cuda-bindings: the driver library comes with the NVIDIA driver, not from PyPI, so
a wrapper adds a dependency whose major version must match the driver, for ~20 plain C calls; the GPU
machines this is run on reach no package registry; and the table of functions is the seam where tests put
a fake driver (test/test_cuda.py), so the error paths are tested on machines without a GPU.
"""
from __future__ import annotations
import ctypes
import functools
from ctypes import POINTER, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_void_p

LIBRARY_NAMES = ("libcuda.so.1", "libcuda.so")

# cuda.h's names for the results tinychad can meet: errors read by name even when the driver can't say
# (it failed to load, or cuGetErrorName itself failed)
ERROR_NAMES = {
  1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY", 3: "CUDA_ERROR_NOT_INITIALIZED",
  4: "CUDA_ERROR_DEINITIALIZED", 34: "CUDA_ERROR_STUB_LIBRARY", 46: "CUDA_ERROR_DEVICE_UNAVAILABLE",
  100: "CUDA_ERROR_NO_DEVICE", 101: "CUDA_ERROR_INVALID_DEVICE", 200: "CUDA_ERROR_INVALID_IMAGE",
  201: "CUDA_ERROR_INVALID_CONTEXT", 209: "CUDA_ERROR_NO_BINARY_FOR_GPU", 218: "CUDA_ERROR_INVALID_PTX",
  221: "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", 222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", 400: "CUDA_ERROR_INVALID_HANDLE",
  500: "CUDA_ERROR_NOT_FOUND", 700: "CUDA_ERROR_ILLEGAL_ADDRESS", 701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
  702: "CUDA_ERROR_LAUNCH_TIMEOUT", 715: "CUDA_ERROR_ILLEGAL_INSTRUCTION", 716: "CUDA_ERROR_MISALIGNED_ADDRESS",
  719: "CUDA_ERROR_LAUNCH_FAILED", 803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
  804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", 999: "CUDA_ERROR_UNKNOWN"}
OUT_OF_MEMORY, NO_DEVICE = 2, 100
# what a failed cuInit means for someone asking for the device
_INIT_MEANS = {NO_DEVICE: "no CUDA GPU is visible to this process",
               34: "libcuda is CUDA's stub library, not a driver (no NVIDIA driver is installed)",
               803: "the NVIDIA driver library and kernel module have different versions (reboot or reinstall)",
               804: "this GPU doesn't support the forward-compatibility driver that was loaded"}
# cuDeviceGetAttribute's attribute numbers (cuda.h's CUdevice_attribute)
ATTRIBUTES = {"max_grid_x": 5, "max_grid_y": 6, "max_grid_z": 7, "multiprocessors": 16, "memory_clock_khz": 36,
              "memory_bus_bits": 37, "cc_major": 75, "cc_minor": 76}

_SIGNATURES = {
  "cuInit": [c_uint], "cuDriverGetVersion": [POINTER(c_int)], "cuDeviceGetCount": [POINTER(c_int)],
  "cuDeviceGet": [POINTER(c_int), c_int], "cuDeviceGetName": [c_char_p, c_int, c_int],
  "cuDeviceGetAttribute": [POINTER(c_int), c_int, c_int],
  "cuDevicePrimaryCtxRetain": [POINTER(c_void_p), c_int], "cuCtxSetCurrent": [c_void_p],
  "cuStreamCreate": [POINTER(c_void_p), c_uint], "cuStreamSynchronize": [c_void_p],
  "cuMemAlloc_v2": [POINTER(c_uint64), c_size_t], "cuMemFree_v2": [c_uint64],
  "cuMemGetInfo_v2": [POINTER(c_size_t), POINTER(c_size_t)],
  "cuMemcpyHtoDAsync_v2": [c_uint64, c_void_p, c_size_t, c_void_p],
  "cuMemcpyDtoHAsync_v2": [c_void_p, c_uint64, c_size_t, c_void_p],
  "cuModuleLoadData": [POINTER(c_void_p), c_char_p], "cuModuleGetFunction": [POINTER(c_void_p), c_void_p, c_char_p],
  "cuLaunchKernel": [c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_void_p, POINTER(c_void_p),
                     POINTER(c_void_p)],
  "cuGetErrorName": [c_int, POINTER(c_char_p)], "cuGetErrorString": [c_int, POINTER(c_char_p)]}


class CUDAError(RuntimeError):
  """A CUDA driver call returned an error: `call` is the function, `code` the CUresult."""
  def __init__(self, message: str, call: str, code: int):
    super().__init__(message)
    self.call, self.code = call, code


class CUDAOutOfMemory(MemoryError):
  """cuMemAlloc found no room (CUDA_ERROR_OUT_OF_MEMORY)."""


class CUDAUnavailable(ValueError):
  """The CUDA device was asked for where it can't run; the message says why."""


def load_library(names: tuple[str, ...] = LIBRARY_NAMES) -> ctypes.CDLL:
  """libcuda with its functions' argument types set; OSError listing what was tried when none loads."""
  errors = []
  for name in names:
    try:
      lib = ctypes.CDLL(name)
    except OSError as error:
      errors.append(str(error))
      continue
    for function, argtypes in _SIGNATURES.items():
      fn = getattr(lib, function, None)
      if fn is not None: fn.argtypes, fn.restype = argtypes, c_int
    return lib
  raise OSError(errors[0] if errors else "no library names given")


class Driver:
  """The driver calls the CUDA device makes, on `lib` (libcuda, or a fake with the same functions)."""
  def __init__(self, lib):
    self.lib = lib

  def describe(self, code: int) -> str:
    """'CUDA_ERROR_X (the driver's text)' for a CUresult, from the driver where it can tell."""
    name, text = c_char_p(), c_char_p()
    try:
      has_name = self.lib.cuGetErrorName(code, ctypes.byref(name)) == 0 and name.value
      has_text = self.lib.cuGetErrorString(code, ctypes.byref(text)) == 0 and text.value
    except (AttributeError, ctypes.ArgumentError):
      has_name = has_text = False
    label = name.value.decode() if has_name else ERROR_NAMES.get(code, f"CUresult {code}")
    return f"{label} ({text.value.decode()})" if has_text else label

  def call(self, function: str, *args, doing: str = "") -> None:
    """lib.function(*args); a nonzero CUresult raises CUDAError (CUDAOutOfMemory for an out-of-memory)."""
    code = getattr(self.lib, function)(*args)
    if code != 0: self.fail(function, code, doing)

  def fail(self, function: str, code: int, doing: str = "") -> None:
    """Raise the error for `function`'s nonzero CUresult `code`; `doing` says what the call was for."""
    message = f"CUDA: {function}{' ' + doing if doing else ''} failed: {self.describe(code)}"
    if code == OUT_OF_MEMORY: raise CUDAOutOfMemory(message)
    raise CUDAError(message, function, code)

  def _int(self, function: str, *args) -> int:
    out = c_int()
    self.call(function, ctypes.byref(out), *args)
    return out.value

  # ---- starting: driver, device, context, stream ----
  def init(self) -> None: self.call("cuInit", 0)
  def version(self) -> int: return self._int("cuDriverGetVersion")
  def device_count(self) -> int: return self._int("cuDeviceGetCount")
  def device(self, ordinal: int) -> int: return self._int("cuDeviceGet", ordinal)
  def attribute(self, name: str, device: int) -> int: return self._int("cuDeviceGetAttribute", ATTRIBUTES[name], device)

  def device_name(self, device: int) -> str:
    name = ctypes.create_string_buffer(256)
    self.call("cuDeviceGetName", name, len(name), device)
    return name.value.decode(errors="replace")

  def primary_context(self, device: int) -> int:
    context = c_void_p()
    self.call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
    return context.value

  def set_context(self, context: int) -> None: self.call("cuCtxSetCurrent", context)

  def stream(self) -> int:
    stream = c_void_p()
    self.call("cuStreamCreate", ctypes.byref(stream), 0)
    return stream.value

  def synchronize(self, stream: int) -> None:
    self.call("cuStreamSynchronize", stream, doing="(waiting for the kernels and copies queued before it; "
              "an error here may be an earlier kernel's: DEBUG=2 waits after each one)")

  # ---- memory ----
  def alloc(self, nbytes: int) -> int:
    pointer = c_uint64()
    self.call("cuMemAlloc_v2", ctypes.byref(pointer), nbytes, doing=f"of {nbytes} bytes")
    return pointer.value

  def free(self, pointer: int) -> None: self.call("cuMemFree_v2", pointer)

  def memory_info(self) -> tuple[int, int]:
    free, total = c_size_t(), c_size_t()
    self.call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value

  def copy_in(self, pointer: int, host: int, nbytes: int, stream: int) -> None:
    self.call("cuMemcpyHtoDAsync_v2", pointer, host, nbytes, stream)

  def copy_out(self, host: int, pointer: int, nbytes: int, stream: int) -> None:
    self.call("cuMemcpyDtoHAsync_v2", host, pointer, nbytes, stream)

  # ---- code ----
  def load_module(self, image: bytes) -> int:
    module = c_void_p()
    self.call("cuModuleLoadData", ctypes.byref(module), image)
    return module.value

  def function(self, module: int, name: str) -> int:
    fn = c_void_p()
    self.call("cuModuleGetFunction", ctypes.byref(fn), module, name.encode(), doing=f"for kernel {name}")
    return fn.value

  @staticmethod
  def launch_arguments(fn: int, blocks: tuple[int, int, int], threads: tuple[int, int, int], stream: int) -> tuple:
    """cuLaunchKernel's arguments before the parameters, made once per kernel: ctypes passes ready-made values
    fastest (converting the plain ints cost ~1.7 us of a launch)."""
    return (c_void_p(fn), *(c_uint(n) for n in (*blocks, *threads)), c_uint(0), c_void_p(stream))

  def launch(self, arguments: tuple, params, name: str) -> None:
    """Launch a kernel: `arguments` from launch_arguments, `params` a pointer to each parameter's value."""
    code = self.lib.cuLaunchKernel(*arguments, params, None)
    if code != 0:     # the error's words made only on an error: this is the hot path
      blocks, threads = tuple(a.value for a in arguments[1:4]), tuple(a.value for a in arguments[4:7])
      self.fail("cuLaunchKernel", code, f"of kernel {name} on {blocks} blocks of {threads} threads")


def _reason(names: tuple[str, ...]) -> str | None:
  try:
    driver = Driver(load_library(names))
  except OSError as error:
    return f"no NVIDIA driver ({error})"
  try:
    driver.init()
    count = driver.device_count()
  except CUDAError as error:
    return f"the NVIDIA driver can't start: {_INIT_MEANS.get(error.code, error.call + ' failed')} ({error})"
  if count == 0: return "no CUDA GPU: the NVIDIA driver sees no device"
  from tinychad.runtime.nvrtc import load_nvrtc, nvrtc_version    # only once a driver and a GPU are there
  if load_nvrtc() is None: return "NVRTC, CUDA's runtime compiler, is not installed (pip install nvidia-cuda-nvrtc-cu12)"
  return too_old(driver.version(), nvrtc_version())


def too_old(driver_version: int, nvrtc: tuple[int, int]) -> str | None:
  """Why a driver can't load what this NVRTC compiles, or None. A driver runs the cubins of every toolkit
  of its own major version and older (CUDA's minor-version compatibility), so the majors decide."""
  if driver_version // 1000 >= nvrtc[0]: return None
  return (f"the NVIDIA driver is too old: it runs CUDA {driver_version // 1000}.{driver_version % 1000 // 10} code, "
          f"and NVRTC {nvrtc[0]}.{nvrtc[1]} compiles for CUDA {nvrtc[0]} (update the driver, or install the NVRTC "
          f"of CUDA {driver_version // 1000}: pip install nvidia-cuda-nvrtc-cu{driver_version // 1000})")


@functools.lru_cache(maxsize=None)
def unavailable_reason(names: tuple[str, ...] = LIBRARY_NAMES) -> str | None:
  """Why the CUDA device can't run here, or None when it can (computed once per process)."""
  return _reason(names)
