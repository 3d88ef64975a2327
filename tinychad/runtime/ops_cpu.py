"""The CPU device: kernels compiled to C and run as native code.

in: a ScheduleItem and its Buffers (output first, then inputs by LOAD number)
out: the output buffer filled by a C function compiled with `CC` (else clang, else gcc) into a
     shared library, loaded with ctypes. Libraries are cached in memory and on disk (runtime/cache.py).
Flags: -O2 -march=native -fPIC -shared, plus
  -fwrapv             integer overflow wraps as in numpy (signed overflow is otherwise undefined in C)
  -ffp-contract=off   no fused multiply-add: a*b+c rounds twice, exactly like numpy
and `$CC_FLAGS_EXTRA` (e.g. -fsanitize=address for tests). No -ffast-math: NaN and inf must survive.
"""
from __future__ import annotations
import ctypes
import functools
import os
import shlex
import subprocess
from pathlib import Path
from tinychad.codegen import lower_item
from tinychad.device import find_c_compiler
from tinychad.helpers import DEBUG
from tinychad.renderer.cstyle import render_c
from tinychad.runtime.cache import cache_key, load_shared_library

BASE_FLAGS = ["-O2", "-march=native", "-fPIC", "-shared", "-fwrapv", "-ffp-contract=off"]


class CompileError(RuntimeError):
  """A kernel's C source did not compile; the message names the kernel and has the compiler output."""


def compile_flags() -> list[str]:
  return BASE_FLAGS + shlex.split(os.getenv("CC_FLAGS_EXTRA", ""))


def compile_c(source: str, name: str, compiler: str | None = None) -> ctypes.CDLL:
  """A loaded shared library built from `source` (cached). `name` is only for error messages."""
  cc = compiler or find_c_compiler()
  if cc is None: raise CompileError(f"kernel {name}: no C compiler found (set CC, or install clang or gcc)")
  flags = compile_flags()

  def build(out: Path) -> None:
    cmd = [cc, *flags, "-x", "c", "-", "-o", str(out), "-lm"]
    try:
      res = subprocess.run(cmd, input=source.encode(), capture_output=True)
    except OSError as e:
      raise CompileError(f"kernel {name}: can't run C compiler {cc!r}: {e}") from None
    if res.returncode != 0:
      raise CompileError(f"kernel {name} failed to compile with {' '.join(cmd)}:\n"
                         f"{res.stderr.decode(errors='replace')}\n--- source ---\n{source}")

  return load_shared_library(cache_key(source, cc, " ".join(flags)), build)


@functools.lru_cache(maxsize=None)
def _compiler_works(cc: str) -> bool:
  # the renderer needs C11 `_Float16`; probe once with a function that uses it
  probe = "_Float16 h(_Float16 x) { return x + 1; }\n"
  try:
    res = subprocess.run([cc, *BASE_FLAGS, "-x", "c", "-", "-o", os.devnull], input=probe.encode(), capture_output=True)
  except OSError:
    return False
  return res.returncode == 0


class CPUDevice:
  def __init__(self, name: str):
    self.name = name
    self.programs: dict = {}      # (kernel tree, name) -> ctypes function

  @staticmethod
  def available() -> bool:
    cc = find_c_compiler()
    return cc is not None and _compiler_works(cc)

  def program(self, item):
    key = (item.ast, item.name)
    if key not in self.programs:
      source = render_c(lower_item(item))
      if DEBUG() >= 4: print(source)
      fn = getattr(compile_c(source, item.name), item.name)
      fn.restype = None
      self.programs[key] = fn
    return self.programs[key]

  def exec(self, item, bufs) -> None:
    fn = self.program(item)
    fn(*[ctypes.c_void_p(b.as_numpy().ctypes.data) for b in bufs])


def device_class(): return CPUDevice
