"""The host's C compiler: which one, its flags, and C source built into a shared library.

in: C source (a kernel library from the C renderer, or the thread pool's own C)
out: the shared library's bytes (build_c), or the library loaded with ctypes (load_library;
     compile_c does both through the kernel cache, runtime/cache.py).
The compiler is `CC`, else the first of clang, gcc and cc that builds the C renderer's code (it needs
C11 `_Float16`: clang 14 on x86 has none, and taking it anyway would leave the CPU device unavailable).
Flags: -O2 -march=native -fPIC -shared, plus
  -fwrapv             integer overflow wraps as in numpy (signed overflow is otherwise undefined in C); only
                      for a source that carries WRAPS_MARKER (the C renderer writes it for a kernel with signed
                      integer arithmetic, Program.wraps): elsewhere it only costs, as gcc must then redo
                      each index sum in 32 bits instead of stepping pointers
  -fno-math-errno     sqrt may be one instruction (nothing reads errno)
  -ffp-contract=off   no fused multiply-add: a*b+c rounds twice, exactly like numpy; except in kernels
                      whose float sum is already split into partial sums (Program.contract), where
                      -ffp-contract=fast lets a*b+acc be one FMA
  -mprefer-vector-width=512  on AVX-512 hosts (see AVX512_FLAG)
  -Wl,-z,noseparate-code -Wl,-z,norelro  fewer memory mappings per loaded library (see LINK_FLAGS)
and `$CC_FLAGS_EXTRA` (e.g. -fsanitize=address for tests). No -ffast-math: NaN and inf must survive.
gcc (12 here) also gets
  -fno-tree-loop-vectorize  its loop vectorizer miscompiles a float sum over a reversed row (a flip:
                      it read x[2r] twice and never x[2r+1]); kernels are SIMD through C vector
                      types already, so nothing is lost where it matters
  --param=max-unrolled-insns=2000 --param=max-average-unrolled-insns=2000  the size limits of gcc's
                      unroller (200 and 80) silently skip a `#pragma GCC unroll` on a 6x64 matmul
                      tile's loop; only loops with the pragma are unrolled at -O2, so only they see it
  -mno-avx512fp16 -fexcess-precision=standard, for kernels with `_Float16`: its AVX512-FP16 code for
                      a select feeding a store is an instruction the assembler rejects (a zero-masked
                      vmovsh store); without it each half op computes in float and rounds to half on
                      assignment, as numpy does
"""
from __future__ import annotations
import ctypes
import functools
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from tinychad.host import simd_bytes
from tinychad.renderer.cstyle import WRAPS_MARKER
from tinychad.runtime.cache import cache_dir, cache_key, cached_bytes, memoize

BASE_FLAGS = ["-O2", "-march=native", "-fPIC", "-shared", "-fno-math-errno", "-ffp-contract=off",
              "-Werror=implicit-function-declaration"]
WRAP_FLAG = "-fwrapv"
CONTRACT_FLAG = "-ffp-contract=fast"
# on AVX-512 hosts: clang otherwise splits each 16-float vector into two 8-float halves (its tuning
# for these CPUs prefers 256-bit registers), and a 6x64 matmul tile's 24 accumulators become 48 that
# spill to the stack: 79 -> 169 GFLOP/s on one core with clang 14. gcc keeps 512-bit vectors either way
AVX512_FLAG = "-mprefer-vector-width=512"
# each library a process loads costs it memory mappings, one per segment, and Linux caps a process at
# vm.max_map_count (65,530 by default): a test process that had loaded ~9,000 kernel libraries held 45,000, near
# enough that a long worker's last tests failed to load a library ("failed to map segment") or to start a thread.
# Code and read-only data in one segment, and no segment made read-only after relocation, leave 2 mappings per
# library instead of 5; used where the linker takes them (_link_flags)
LINK_FLAGS = ["-Wl,-z,noseparate-code", "-Wl,-z,norelro"]
GCC_FLAGS = ["-fno-tree-loop-vectorize", "--param=max-unrolled-insns=2000", "--param=max-average-unrolled-insns=2000"]
GCC_HALF_FLAGS = ["-mno-avx512fp16", "-fexcess-precision=standard"]


class CompileError(RuntimeError):
  """A kernel's C source did not compile; the message names the kernel and has the compiler output."""


def find_c_compiler() -> str | None:
  """`CC` from the environment, else the first of clang, gcc and cc that builds the C renderer's code."""
  if os.getenv("CC"): return os.environ["CC"]
  return _first_working_compiler()


@functools.lru_cache(maxsize=None)
def _first_working_compiler() -> str | None:
  return next((cc for cc in ("clang", "gcc", "cc") if shutil.which(cc) and compiler_works(cc)), None)


def _probe(cc: str, source: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess | None:
  """`cc` building `source` into a throwaway library with BASE_FLAGS and `flags`; None where `cc` can't run."""
  try:
    return subprocess.run([cc, *BASE_FLAGS, *flags, "-x", "c", "-", "-o", os.devnull], input=source.encode(),
                          capture_output=True)
  except OSError:
    return None


@functools.lru_cache(maxsize=None)
def compiler_works(cc: str) -> bool:
  # the renderer needs C11 `_Float16`; probe once with a function that uses it
  res = _probe(cc, "_Float16 h(_Float16 x) { return x + 1; }\n")
  return res is not None and res.returncode == 0


@functools.lru_cache(maxsize=None)
def _link_flags(cc: str) -> list[str]:
  """LINK_FLAGS where `cc`'s linker takes them without a word of complaint, else none (asked once per compiler)."""
  res = _probe(cc, "int f(int x) { return x + 1; }\n", tuple(LINK_FLAGS))
  return LINK_FLAGS if res is not None and res.returncode == 0 and not res.stderr.strip() else []


@functools.lru_cache(maxsize=None)
def _is_gcc(cc: str) -> bool:
  try: banner = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
  except OSError: return False
  return "Free Software Foundation" in banner and "clang" not in banner


def compile_flags(contract: bool = False, source: str = "", cc: str = "") -> list[str]:
  gcc = GCC_FLAGS + (GCC_HALF_FLAGS if "_Float16" in source else []) if cc and _is_gcc(cc) else []
  wide = [AVX512_FLAG] if simd_bytes() == 64 else []
  wrap = [WRAP_FLAG] if WRAPS_MARKER in source else []
  link = _link_flags(cc) if cc else []
  flags = BASE_FLAGS + wrap + wide + gcc + link + shlex.split(os.getenv("CC_FLAGS_EXTRA", ""))
  return [CONTRACT_FLAG if f == "-ffp-contract=off" else f for f in flags] if contract else flags


def compiler_identity(source: str = "", contract: bool = False) -> str:
  """The compiler and the flags it gets for `source`: with the source, what decides a library's bytes."""
  cc = find_c_compiler() or ""
  return f"{cc} {' '.join(compile_flags(contract, source, cc))}"


def build_c(source: str, name: str, contract: bool = False) -> bytes:
  """The bytes of a shared library built from `source` (not cached). `name` is only for error messages."""
  cc = find_c_compiler()
  if cc is None: raise CompileError(f"kernel {name}: no C compiler found (set CC, or install clang or gcc)")
  with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
    out = Path(tmp) / "kernel.so"
    cmd = [cc, *compile_flags(contract, source, cc), "-x", "c", "-", "-o", str(out), "-lm"]
    try:
      res = subprocess.run(cmd, input=source.encode(), capture_output=True)
    except OSError as e:
      raise CompileError(f"kernel {name}: can't run C compiler {cc!r}: {e}") from None
    if res.returncode != 0:
      raise CompileError(f"kernel {name} failed to compile with {' '.join(cmd)}:\n"
                         f"{res.stderr.decode(errors='replace')}\n--- source ---\n{source}")
    return out.read_bytes()


def load_library(binary: bytes) -> ctypes.CDLL:
  """A shared library's bytes loaded with ctypes (from a file of its own: dlopen needs a path, and a
  path shared with a concurrent writer could hold other bytes)."""
  fd, path = tempfile.mkstemp(suffix=".so", dir=cache_dir())
  try:
    with os.fdopen(fd, "wb") as f: f.write(binary)
    return ctypes.CDLL(path)      # the mapping outlives the file
  finally:
    os.unlink(path)


def compile_c(source: str, name: str, contract: bool = False) -> ctypes.CDLL:
  """The library built from `source`, loaded: from memory, else from the disk cache, else compiled."""
  key = cache_key(".so", compiler_identity(source, contract), source)
  return memoize(key, lambda: load_library(cached_bytes(key, ".so", lambda: build_c(source, name, contract))))


@functools.lru_cache(maxsize=None)
def helper_library(source: str, name: str) -> ctypes.CDLL | None:
  """A runtime helper's C (the thread pool, the generic copy) built and loaded once, or None when there is no
  working C compiler: the caller then does without it (asked once, not at every kernel)."""
  try:
    return compile_c(source, name)
  except (CompileError, OSError):
    return None
