"""NVRTC, NVIDIA's runtime CUDA compiler, through ctypes: CUDA C in, PTX out, no GPU or driver needed.

in: CUDA C source (renderer/gpu.py's CUDA dialect), a GPU architecture ("sm_80", "sm_90")
out: the PTX text, or NVRTCError carrying the compiler's log (on an error, and on a warning when asked).
The library comes from PyPI's nvidia-cuda-nvrtc-cu12 (nvidia/cuda_nvrtc/lib/) or the system's CUDA
toolkit. It is how the CUDA dialect is checked on machines without a GPU: every kernel of the op
suite compiles for sm_80 and sm_90 (test/test_opencl.py).
"""
from __future__ import annotations
import ctypes
import functools
import glob
import os


class NVRTCError(RuntimeError):
  pass


def _candidates() -> list[str]:
  paths = []
  try:
    import nvidia.cuda_nvrtc
    for root in nvidia.cuda_nvrtc.__path__: paths += sorted(glob.glob(os.path.join(root, "lib", "libnvrtc.so*")))
  except ImportError:
    pass
  return paths + ["libnvrtc.so", "libnvrtc.so.12"]


@functools.lru_cache(maxsize=None)
def load_nvrtc() -> ctypes.CDLL | None:
  """The NVRTC library, or None when neither PyPI's wheel nor a CUDA toolkit provides it."""
  for path in _candidates():
    if "builtins" in os.path.basename(path): continue
    try:
      lib = ctypes.CDLL(path)
    except OSError:
      continue
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib
  return None


def nvrtc_version() -> tuple[int, int]:
  lib = load_nvrtc()
  if lib is None: raise NVRTCError("NVRTC is not installed (pip install nvidia-cuda-nvrtc-cu12)")
  major, minor = ctypes.c_int(), ctypes.c_int()
  lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
  return major.value, minor.value


def compile_cuda(source: str, arch: str = "sm_80", name: str = "kernel.cu", warnings_fail: bool = True) -> str:
  """PTX for `source` on `arch`; NVRTCError with the log on an error (or any warning, by default)."""
  lib = load_nvrtc()
  if lib is None: raise NVRTCError("NVRTC is not installed (pip install nvidia-cuda-nvrtc-cu12)")
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
    options = [f"--gpu-architecture={arch}".encode(), b"--std=c++17", b"-default-device"]
    array = (ctypes.c_char_p * len(options))(*options)
    status = lib.nvrtcCompileProgram(program, len(options), array)
    if status != 0: raise NVRTCError(f"NVRTC can't compile {name} for {arch}:\n{log()}")
    if warnings_fail and log(): raise NVRTCError(f"NVRTC warns on {name} for {arch}:\n{log()}")
    size = ctypes.c_size_t()
    check(lib.nvrtcGetPTXSize(program, ctypes.byref(size)), "PTX size")
    ptx = ctypes.create_string_buffer(size.value)
    check(lib.nvrtcGetPTX(program, ptx), "PTX")
    return ptx.value.decode()
  finally:
    lib.nvrtcDestroyProgram(ctypes.byref(program))
