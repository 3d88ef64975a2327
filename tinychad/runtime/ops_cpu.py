"""The CPU device: kernels compiled to C and run as native code.

in: a ScheduleItem and its Buffers (output first, then inputs by LOAD number)
out: the output buffer filled by a C function compiled with `CC` (else clang, else gcc) into a
     shared library, loaded with ctypes, run across threads (runtime/threads.py). Libraries are cached
     in memory and on disk (runtime/cache.py).
Flags: -O2 -march=native -fPIC -shared, plus
  -fwrapv             integer overflow wraps as in numpy (signed overflow is otherwise undefined in C)
  -fno-math-errno     sqrt may be one instruction (nothing reads errno)
  -ffp-contract=off   no fused multiply-add: a*b+c rounds twice, exactly like numpy; except in kernels
                      whose float sum is already split into partial sums (Program.contract), where
                      -ffp-contract=fast lets a*b+acc be one FMA
  -mprefer-vector-width=512  on AVX-512 hosts (see AVX512_FLAG)
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
`prepare(items)` compiles every new kernel of a schedule up front, into one library per core
(several kernels per gcc process), the libraries at once.
A process keeps each kernel it has loaded: NOOPT and BEAM apply to kernels first built after they
are set (as in tinygrad, which reads them once), and an exec pays no environment lookups.
"""
from __future__ import annotations
import ctypes
import functools
import os
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from tinychad.codegen import lower_item
from tinychad.codegen.opt import simd_bytes
from tinychad.device import find_c_compiler
from tinychad.helpers import DEBUG
from tinychad.renderer.cstyle import render_c, render_c_library
from tinychad.runtime.cache import cache_key, cached_library, code_version, load_shared_library, read_record, tree_text, write_record
from tinychad.runtime.threads import run_parallel

BASE_FLAGS = ["-O2", "-march=native", "-fPIC", "-shared", "-fwrapv", "-fno-math-errno", "-ffp-contract=off"]
CONTRACT_FLAG = "-ffp-contract=fast"
# on AVX-512 hosts: clang otherwise splits each 16-float vector into two 8-float halves (its tuning
# for these CPUs prefers 256-bit registers), and a 6x64 matmul tile's 24 accumulators become 48 that
# spill to the stack: 79 -> 169 GFLOP/s on one core with clang 14. gcc keeps 512-bit vectors either way
AVX512_FLAG = "-mprefer-vector-width=512"


class CompileError(RuntimeError):
  """A kernel's C source did not compile; the message names the kernel and has the compiler output."""


GCC_FLAGS = ["-fno-tree-loop-vectorize", "--param=max-unrolled-insns=2000", "--param=max-average-unrolled-insns=2000"]
GCC_HALF_FLAGS = ["-mno-avx512fp16", "-fexcess-precision=standard"]


@functools.lru_cache(maxsize=None)
def _is_gcc(cc: str) -> bool:
  try: banner = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
  except OSError: return False
  return "Free Software Foundation" in banner and "clang" not in banner


def compile_flags(contract: bool = False, source: str = "", cc: str = "") -> list[str]:
  gcc = GCC_FLAGS + (GCC_HALF_FLAGS if "_Float16" in source else []) if cc and _is_gcc(cc) else []
  wide = [AVX512_FLAG] if simd_bytes() == 64 else []
  flags = BASE_FLAGS + wide + gcc + shlex.split(os.getenv("CC_FLAGS_EXTRA", ""))
  return [CONTRACT_FLAG if f == "-ffp-contract=off" else f for f in flags] if contract else flags


def library_key(source: str, cc: str, contract: bool = False) -> str:
  """The cache key of the library built from `source` by `cc` with our flags."""
  return cache_key(source, cc, " ".join(compile_flags(contract, source, cc)))


def compile_c(source: str, name: str, compiler: str | None = None, contract: bool = False) -> ctypes.CDLL:
  """A loaded shared library built from `source` (cached). `name` is only for error messages."""
  cc = compiler or find_c_compiler()
  if cc is None: raise CompileError(f"kernel {name}: no C compiler found (set CC, or install clang or gcc)")
  flags = compile_flags(contract, source, cc)

  def build(out: Path) -> None:
    cmd = [cc, *flags, "-x", "c", "-", "-o", str(out), "-lm"]
    try:
      res = subprocess.run(cmd, input=source.encode(), capture_output=True)
    except OSError as e:
      raise CompileError(f"kernel {name}: can't run C compiler {cc!r}: {e}") from None
    if res.returncode != 0:
      raise CompileError(f"kernel {name} failed to compile with {' '.join(cmd)}:\n"
                         f"{res.stderr.decode(errors='replace')}\n--- source ---\n{source}")

  return load_shared_library(library_key(source, cc, contract), build)


@functools.lru_cache(maxsize=None)
def compiler_works(cc: str) -> bool:
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
    self.programs: dict = {}      # (kernel tree, name) -> (ctypes function, parallel extent, its address)

  @staticmethod
  def available() -> bool:
    cc = find_c_compiler()
    return cc is not None and compiler_works(cc)

  @staticmethod
  def _record_key(item) -> str:
    cc = find_c_compiler() or ""
    return cache_key(tree_text(item.ast), item.name, code_version(), cc, " ".join(compile_flags()),
                     os.getenv("NOOPT", ""), os.getenv("BEAM", ""))

  @staticmethod
  def _recorded(key: str) -> tuple | None:
    """The loaded kernel its record names, if it was built before (no lowering, no rendering)."""
    # DEBUG>=3 shows the IR and the source, so it always lowers
    record = read_record(key) if DEBUG() < 3 else None
    lib = cached_library(record["library"]) if record is not None else None
    return None if lib is None else _function(lib, record)

  def _build(self, item) -> tuple:
    """(C function, parallel extent, the function's address) for a kernel: from its record, else
    lowered, rendered and compiled on its own, and its record written."""
    key = self._record_key(item)
    built = self._recorded(key)
    return built if built is not None else self._build_alone(key, lower_item(item), find_c_compiler() or "")

  def program(self, item):
    key = (item.ast, item.name)
    if key not in self.programs: self.programs[key] = self._build(item)
    return self.programs[key]

  def prepare(self, items) -> None:
    """Compile the kernels of a schedule that aren't loaded yet, a few libraries at once.

    Kernels that need the same compiler flags share a library, one per core (each compiled by its own
    process, in parallel): a gcc process costs ~30 ms to start, as much as a small kernel's compile,
    and a CNN training step has ~50 kernels (its cold first step 2.0 -> 1.3 s)."""
    todo = {(item.ast, item.name): item for item in items if item.is_kernel and (item.ast, item.name) not in self.programs}
    if len(todo) < 2 or DEBUG() >= 3:
      return
    cc = find_c_compiler() or ""
    groups: dict[bool, list] = {}
    for key, item in todo.items():
      record_key = self._record_key(item)
      built = self._recorded(record_key)
      if built is not None:
        self.programs[key] = built
        continue
      # FMA contraction is a flag for a whole file (compile_flags); the half-precision flags change
      # only half-precision code, so they don't split a group
      program = lower_item(item)
      groups.setdefault(program.contract, []).append((key, record_key, program))
    libraries = [part for members in groups.values() for part in _balanced_parts(members, os.cpu_count() or 1)]
    with ThreadPoolExecutor(max_workers=max(1, len(libraries))) as pool:
      for built in pool.map(lambda members: self._build_library(members, cc), libraries):
        self.programs.update(built)

  def _build_library(self, members: list, cc: str) -> dict:
    """One library holding these kernels (each under a name of its own in it), their records written;
    if it doesn't compile, each kernel is built alone, so the error names the kernel that failed."""
    symbols = [f"{program.name}_{i}" for i, (_, _, program) in enumerate(members)]
    source = render_c_library([program for _, _, program in members], symbols)
    try:
      # the members share one contract flag (prepare groups them by it)
      lib = compile_c(source, ", ".join(program.name for _, _, program in members), cc or None, contract=members[0][2].contract)
    except CompileError:
      return {key: self._build_alone(record_key, program, cc) for key, record_key, program in members}
    return {key: _function(lib, _write_record(record_key, program, source, cc, symbol))
            for (key, record_key, program), symbol in zip(members, symbols)}

  @staticmethod
  def _build_alone(record_key: str, program, cc: str) -> tuple:
    source = render_c(program)
    if DEBUG() >= 4: print(source)
    lib = compile_c(source, program.name, cc or None, contract=program.contract)
    return _function(lib, _write_record(record_key, program, source, cc, program.name))

  def exec(self, item, bufs) -> None:
    fn, extent, address = self.program(item)
    run_parallel(fn, [b.allocate().address for b in bufs], extent, item.points, address)


def _write_record(record_key: str, program, source: str, cc: str, symbol: str) -> dict:
  """The record of a kernel built as `symbol` in the library compiled from `source`, written to disk."""
  record = {"library": library_key(source, cc, program.contract), "symbol": symbol,
            "buffers": len(program.globals), "parallel": program.parallel}
  write_record(record_key, record)
  return record


def _function(lib: ctypes.CDLL, record: dict) -> tuple:
  """(C function, parallel extent, its address) for the kernel `record` describes in `lib`."""
  fn = getattr(lib, record["symbol"])
  fn.restype = None
  fn.argtypes = [ctypes.c_void_p] * record["buffers"] + [ctypes.c_int64, ctypes.c_int64]
  return fn, record["parallel"], ctypes.cast(fn, ctypes.c_void_p).value


def _balanced_parts(members: list, parts: int) -> list[list]:
  """`members` (key, record key, program) cut into at most `parts` groups of nearly equal size in
  uops (a stand-in for compile time), the biggest placed first."""
  groups: list[list] = [[] for _ in range(min(parts, len(members)))]
  sizes = [0] * len(groups)
  for member in sorted(members, key=lambda m: -len(m[2].uops)):
    lightest = sizes.index(min(sizes))
    groups[lightest].append(member)
    sizes[lightest] += len(member[2].uops)
  return groups


def device_class(): return CPUDevice
