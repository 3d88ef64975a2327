"""Facts about the host CPU that both the code generator and the runtimes need.

in: /proc/cpuinfo and the core count (read once), THREADS  ->  out: the SIMD register width and the threads
kernels are split over. Kept below codegen and the runtimes so neither has to import the other for them. An
export for another machine (WebAssembly's 128-bit SIMD, NEON) lowers its kernels inside `target_simd_bytes(16)`,
which every caller of simd_bytes() then sees (and target_threads() as one thread); an export for a machine whose
code generator wants other kernel shapes names its row of codegen/opt.py's tuning table there too
(`target_simd_bytes(16, "wasm")`, seen by target_tuning()).
"""
import contextlib
import functools
import os
from typing import Iterator
from tinychad.helpers import getenv

MAX_THREADS = 64                        # the most threads the thread pool (runtime/threads.py) runs

_targets: list[tuple[int, str]] = []   # the open target_simd_bytes() blocks' (width, tuning), innermost last


def simd_bytes() -> int:
  """Bytes in one SIMD register of the machine kernels are made for: the host's, unless an export
  for another machine is lowering them (target_simd_bytes)."""
  return _targets[-1][0] if _targets else host_simd_bytes()


def target_tuning() -> str:
  """The row of the kernel tuning table (codegen/opt.py's TUNING) for the machine kernels are made for."""
  return _targets[-1][1] if _targets else cpu_tuning(host_simd_bytes())


def cpu_tuning(nbytes: int) -> str:
  """The tuning row of a CPU with `nbytes`-byte SIMD registers: AVX2 has 16 of them, half of what AVX-512
  and NEON have, so its register tile is smaller ("avx2"); the others take "host"."""
  return "avx2" if nbytes == 32 else "host"


@contextlib.contextmanager
def target_simd_bytes(nbytes: int, tuning: str = "host") -> Iterator[None]:
  """Kernels lowered inside the block are made for SIMD registers of `nbytes` bytes, shaped by the
  tuning table's row `tuning`."""
  _targets.append((nbytes, tuning))
  try:
    yield
  finally:
    _targets.pop()


@functools.lru_cache(maxsize=None)
def host_simd_bytes() -> int:
  """Bytes in one SIMD register of this host: 64 with AVX-512, 32 with AVX2, else 16."""
  try:
    with open("/proc/cpuinfo") as f: flags = next((ln for ln in f if ln.startswith("flags")), "").split()
  except OSError:
    flags = []
  if "avx512f" in flags: return 64
  return 32 if "avx2" in flags else 16


@functools.lru_cache(maxsize=None)
def host_cores() -> int:
  return os.cpu_count() or 1       # ~9 us a call here: asked once, not per kernel


def thread_count() -> int:
  """Threads the runtime splits a kernel's outermost loop over: THREADS, else the host's cores (at most MAX_THREADS)."""
  return max(1, min(getenv("THREADS", host_cores()), MAX_THREADS))


def target_threads() -> int:
  """Threads the kernels being lowered will be split over: thread_count() for the host's own, 1 for an export's
  (its program runs every kernel on one thread)."""
  return 1 if _targets else thread_count()
