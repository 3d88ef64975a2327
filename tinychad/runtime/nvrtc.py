"""NVRTC, NVIDIA's runtime CUDA compiler, through ctypes: CUDA C in, PTX or a cubin out, no GPU or driver needed.

in: CUDA C source (renderer/gpu.py's CUDA dialect), a GPU architecture ("sm_80", "sm_90"; "compute_90" for PTX
    only)
out: the PTX text (compile_cuda), the cubin's bytes (compile_cubin: machine code for exactly that GPU, what the
     CUDA device loads), or NVRTCError carrying the compiler's log (on an error, and on a warning when asked).
The library comes from PyPI (nvidia-cuda-nvrtc-cu12: nvidia/cuda_nvrtc/lib/; CUDA 13's nvidia-cuda-nvrtc:
nvidia/cu13/lib/), or a CUDA toolkit ($CUDA_HOME, /usr/local/cuda), or the loader's path. NVRTC_PATH names
a library to use instead. It is how the CUDA dialect is checked on machines without a GPU: every kernel of
the op suite compiles for sm_80 and sm_90 (test/test_opencl.py).
"""
from __future__ import annotations
import ctypes
import functools
import glob
import os


class NVRTCError(RuntimeError):
  pass


MISSING = "NVRTC is not installed (pip install nvidia-cuda-nvrtc-cu12)"
# fixed flags: C++17 for the prelude's templates; -default-device so that memcpy and friends need no headers
OPTIONS = ("--std=c++17", "-default-device")


def _candidates() -> list[str]:
  paths = [os.environ["NVRTC_PATH"]] if os.getenv("NVRTC_PATH") else []
  try:
    import nvidia     # PyPI's CUDA wheels share this namespace package: cuda_nvrtc/lib (CUDA 12), cu13/lib (CUDA 13)
    for root in nvidia.__path__: paths += sorted(glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so*")), reverse=True)
  except ImportError:
    pass
  for toolkit in (os.getenv("CUDA_HOME"), os.getenv("CUDA_PATH"), "/usr/local/cuda"):
    if toolkit: paths += sorted(glob.glob(os.path.join(toolkit, "lib64", "libnvrtc.so*")), reverse=True)
  return paths + ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"]


@functools.lru_cache(maxsize=None)
def load_nvrtc() -> ctypes.CDLL | None:
  """The NVRTC library, or None when neither PyPI's wheel nor a CUDA toolkit provides it."""
  for path in _candidates():
    if "builtins" in os.path.basename(path) or ".alt." in os.path.basename(path): continue
    try:
      # NVRTC opens its builtins library by name when it compiles; CUDA 13's wheel doesn't set the search path
      # to its own folder, so the one beside it is loaded first (the loader then finds it by that name)
      for builtins in glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so.*")):
        if ".alt." not in builtins: ctypes.CDLL(builtins)
      lib = ctypes.CDLL(path)
    except OSError:
      continue
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib
  return None


def nvrtc_version() -> tuple[int, int]:
  lib = load_nvrtc()
  if lib is None: raise NVRTCError(MISSING)
  major, minor = ctypes.c_int(), ctypes.c_int()
  lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
  return major.value, minor.value


@functools.lru_cache(maxsize=None)
def supported_archs() -> tuple[int, ...]:
  """The GPU architectures this NVRTC compiles for, as numbers (90 for sm_90), oldest first."""
  lib = load_nvrtc()
  if lib is None: raise NVRTCError(MISSING)
  count = ctypes.c_int()
  if lib.nvrtcGetNumSupportedArchs(ctypes.byref(count)) != 0: raise NVRTCError("NVRTC can't list its architectures")
  archs = (ctypes.c_int * count.value)()
  if lib.nvrtcGetSupportedArchs(archs) != 0: raise NVRTCError("NVRTC can't list its architectures")
  return tuple(sorted(archs))


def _compile(source: str, arch: str, name: str, warnings_fail: bool, cubin: bool) -> bytes:
  lib = load_nvrtc()
  if lib is None: raise NVRTCError(MISSING)
  program = ctypes.c_void_p()

  def check(status: int, what: str) -> None:
    if status != 0: raise NVRTCError(f"NVRTC {what}: {lib.nvrtcGetErrorString(status).decode()}\n{log()}")

  def log() -> str:
    size = ctypes.c_size_t()
    if lib.nvrtcGetProgramLogSize(program, ctypes.byref(size)) != 0: return ""
    text = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(program, text)
    return text.value.decode(errors="replace").strip()

  check(lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), name.encode(), 0, None, None), "create")
  try:
    options = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in OPTIONS)]
    array = (ctypes.c_char_p * len(options))(*options)
    status = lib.nvrtcCompileProgram(program, len(options), array)
    if status != 0: raise NVRTCError(f"NVRTC can't compile {name} for {arch}:\n{log()}")
    if warnings_fail and log(): raise NVRTCError(f"NVRTC warns on {name} for {arch}:\n{log()}")
    size = ctypes.c_size_t()
    what = "cubin" if cubin else "PTX"
    check((lib.nvrtcGetCUBINSize if cubin else lib.nvrtcGetPTXSize)(program, ctypes.byref(size)), f"{what} size")
    out = ctypes.create_string_buffer(size.value)
    check((lib.nvrtcGetCUBIN if cubin else lib.nvrtcGetPTX)(program, out), what)
    return out.raw
  finally:
    lib.nvrtcDestroyProgram(ctypes.byref(program))


def compile_cuda(source: str, arch: str = "sm_80", name: str = "kernel.cu", warnings_fail: bool = True) -> str:
  """PTX for `source` on `arch`; NVRTCError with the log on an error (or any warning, by default)."""
  return _compile(source, arch, name, warnings_fail, cubin=False).rstrip(b"\0").decode()


def compile_cubin(source: str, arch: str = "sm_90", name: str = "kernel.cu", warnings_fail: bool = True) -> bytes:
  """The cubin (machine code for GPUs of exactly `arch`, an "sm_XY") of `source`; NVRTCError as compile_cuda."""
  if not arch.startswith("sm_"): raise ValueError(f"compile_cubin: a cubin needs a real architecture (sm_XY), not {arch!r}")
  return _compile(source, arch, name, warnings_fail, cubin=True)
