"""The CPU device: kernels rendered to C, built by the host's C compiler (runtime/cc.py) into shared
libraries, loaded with ctypes and run across threads (runtime/threads.py).

in: C source from render_c_library, one library for several kernels  ->  out: the library's bytes
    (cached on disk by the kernel cache), loaded, and each kernel's function in it.
Batching: a gcc process costs ~30 ms to start, as much as a small kernel's compile, and a CNN
training step has ~50 kernels, so a schedule's new kernels share a library per core, the libraries
built at once (engine/realize.py; the cold first step 2.0 -> 1.3 s).
"""
from __future__ import annotations
import ctypes
from tinychad.renderer.cstyle import render_c_library
from tinychad.runtime.cc import build_c, compiler_identity, compiler_works, find_c_compiler, load_library
from tinychad.runtime.compiled import Compiled


class CPUDevice(Compiled):
  renderer = staticmethod(render_c_library)
  batch = True
  suffix = ".so"
  identity = staticmethod(compiler_identity)
  compile = staticmethod(build_c)
  load = staticmethod(load_library)

  @staticmethod
  def available() -> bool:
    cc = find_c_compiler()
    return cc is not None and compiler_works(cc)

  @staticmethod
  def address(lib: ctypes.CDLL, symbol: str) -> int: return ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value


def device_class(): return CPUDevice
