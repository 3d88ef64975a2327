"""The LLVM device: kernels compiled to LLVM IR and JIT-compiled in process with llvmlite.

in: a ScheduleItem and its Buffers (output first, then inputs by LOAD number)
out: the output buffer filled by machine code from MCJIT, optimized at -O2 by LLVM's new pass
     manager for the host CPU, run across threads (runtime/threads.py). A kernel's object code is
     cached in memory and on disk (runtime/cache.py) by IR text and host CPU, so a new process
     loads it instead of optimizing again, and a kernel record maps the kernel tree to that object
     code, so a new process doesn't even lower or render it; `prepare(items)` compiles a schedule's
     new kernels ahead (one at a time: llvmlite serializes calls into LLVM).
llvmlite 0.50: llvm.initialize() raises, so only the native target and asm printer are initialized.
Each execution engine gets its own TargetMachine (an engine takes ownership of the one it's given).
"""
from __future__ import annotations
import ctypes
import ctypes.util
import functools
import os
from typing import Callable
from tinychad.codegen import lower_item
from tinychad.codegen.opt import simd_bytes
from tinychad.helpers import DEBUG
from tinychad.renderer.llvmir import render_llvm
from tinychad.runtime.cache import cache_key, cached_bytes, code_version, has_cached_bytes, memoize, read_record, tree_text, write_record
from tinychad.runtime.threads import run_parallel


@functools.lru_cache(maxsize=None)
def _llvm():
  import llvmlite.binding as llvm
  llvm.initialize_native_target()
  llvm.initialize_native_asmprinter()
  _add_runtime_helpers(llvm)
  return llvm


def _add_runtime_helpers(llvm) -> None:
  """Make compiler-runtime helpers visible to the JIT. A float64 -> float16 conversion has no
  instruction on x86 and becomes a call to __truncdfhf2, which lives in libgcc_s, not in Python."""
  try:
    libgcc = ctypes.CDLL(ctypes.util.find_library("gcc_s") or "libgcc_s.so.1")
  except OSError:
    return
  for name in ("__truncdfhf2", "__truncsfhf2", "__extendhfsf2", "__extendhfdf2"):
    if hasattr(libgcc, name): llvm.add_symbol(name, ctypes.cast(getattr(libgcc, name), ctypes.c_void_p).value)


def _features() -> str:
  """The host's CPU features, and on an AVX-512 host whole 512-bit registers: LLVM's tuning for these
  CPUs prefers 256-bit ones and splits each 16-float vector in two, and a 6x64 matmul tile's 24
  accumulators become 48 that spill (8 GFLOP/s instead of ~300, as clang's -mprefer-vector-width)."""
  features = _llvm().get_host_cpu_features().flatten()
  return features + ",-prefer-256-bit" if simd_bytes() == 64 else features


def _target_machine():
  llvm = _llvm()
  target = llvm.Target.from_triple(llvm.get_process_triple())
  return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=_features(),
                                      opt=2, reloc="pic", codemodel="jitdefault", jit=True)


def compile_object(source: str) -> bytes:
  """Machine code (an ELF object) for an LLVM module's text, optimized at -O2 for the host CPU.
  Each call has its own LLVMContext and TargetMachine."""
  llvm = _llvm()
  tm = _target_machine()
  module = llvm.parse_assembly(source, context=llvm.create_context())
  module.triple, module.data_layout = tm.triple, str(tm.target_data)
  module.verify()
  pto = llvm.create_pipeline_tuning_options(speed_level=2)
  pto.loop_vectorization = pto.slp_vectorization = True
  pass_builder = llvm.create_pass_builder(tm, pto)
  pass_builder.getModulePassManager().run(module, pass_builder)
  return tm.emit_object(module)


class CompiledKernel:
  """One kernel's machine code loaded into MCJIT; holds the engine so the code stays alive."""
  def __init__(self, obj: bytes, name: str, n_buffers: int, parallel: int):
    llvm = _llvm()
    self.parallel = parallel
    # an engine needs a module to start from; the kernel itself comes in as an object file
    self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), _target_machine())
    self.engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
    self.engine.finalize_object()
    self.address = self.engine.get_function_address(name)
    self.fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * n_buffers, ctypes.c_int64, ctypes.c_int64)(self.address)


@functools.lru_cache(maxsize=None)
def _host() -> str:
  llvm = _llvm()
  return f"{llvm.get_process_triple()} {llvm.get_host_cpu_name()} {_features()}"


def kernel_key(source: str) -> str:
  """The cache key of a kernel's object code: its IR and the CPU the machine code is for."""
  return cache_key("llvm", _host(), source)


def plan_kernel(item) -> tuple[dict, str | None]:
  """A kernel's record ({"object": key, "buffers": n, "parallel": extent}) and its IR, which is None
  when the record and the object code were already on disk (nothing lowered, nothing rendered)."""
  key = cache_key("llvm-record", tree_text(item.ast), item.name, code_version(), _host(),
                  os.getenv("NOOPT", ""), os.getenv("BEAM", ""))
  # DEBUG>=3 shows the IR and the source, so it always lowers
  record = read_record(key) if DEBUG() < 3 else None
  if record is not None and has_cached_bytes(record["object"], ".o"): return record, None
  program = lower_item(item)
  source = render_llvm(program)
  if DEBUG() >= 4: print(source)
  record = {"object": kernel_key(source), "buffers": len(program.globals), "parallel": program.parallel}
  write_record(key, record)
  return record, source


def object_code(record: dict, source: str | None) -> bytes:
  """The record's object code: from disk, else optimized and compiled from `source` by LLVM."""
  def build() -> bytes:
    if source is None: raise RuntimeError(f"object code {record['object']} vanished from the kernel cache")
    return compile_object(source)
  return cached_bytes(record["object"], ".o", build)


def load_kernel(record: dict, name: str, obj: Callable[[], bytes]) -> CompiledKernel:
  """The kernel loaded into MCJIT, once per process per object code."""
  return memoize(record["object"], lambda: CompiledKernel(obj(), name, record["buffers"], record["parallel"]))


class LLVMDevice:
  def __init__(self, name: str):
    self.name = name
    self.programs: dict = {}      # (kernel tree, name) -> CompiledKernel

  @staticmethod
  def available() -> bool:
    try:
      _llvm()
    except Exception:             # no llvmlite, or it can't find a native target
      return False
    return True

  def program(self, item) -> CompiledKernel:
    key = (item.ast, item.name)
    if key not in self.programs:
      record, source = plan_kernel(item)
      self.programs[key] = load_kernel(record, item.name, lambda: object_code(record, source))
    return self.programs[key]

  def prepare(self, items) -> None:
    """Compile the kernels of a schedule that aren't loaded yet, before the first one runs. One after
    another: llvmlite 0.50 holds one process-wide lock around every call into LLVM (binding/ffi.py's
    _LLVMLock), so threads compiled no faster than one (2.01 s against 2.02 s for two kernels)."""
    for item in items:
      if item.is_kernel: self.program(item)

  def exec(self, item, bufs) -> None:
    kernel = self.program(item)
    run_parallel(kernel.fn, [b.allocate().address for b in bufs], kernel.parallel, item.points, kernel.address)


def device_class(): return LLVMDevice
