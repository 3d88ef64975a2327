"""The LLVM device: kernels compiled to LLVM IR and JIT-compiled in process with llvmlite.

in: a ScheduleItem and its Buffers (output first, then inputs by LOAD number)
out: the output buffer filled by machine code from MCJIT, optimized at -O2 by LLVM's new pass
     manager for the host CPU, run across threads (runtime/threads.py). Compiled kernels are cached
     in memory by source text.
llvmlite 0.50: llvm.initialize() raises, so only the native target and asm printer are initialized.
Each execution engine gets its own TargetMachine (an engine takes ownership of the one it's given).
"""
from __future__ import annotations
import ctypes
import ctypes.util
import functools
from tinychad.codegen import lower_item
from tinychad.helpers import DEBUG, prod
from tinychad.renderer.llvmir import render_llvm
from tinychad.runtime.cache import CacheStats, cache_key, memoize
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


def _target_machine():
  llvm = _llvm()
  target = llvm.Target.from_triple(llvm.get_process_triple())
  return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
                                      opt=2, reloc="pic", codemodel="jitdefault", jit=True)


class CompiledKernel:
  """One JIT-compiled function; holds the engine so the machine code stays alive."""
  def __init__(self, source: str, name: str, n_buffers: int, parallel: int):
    llvm = _llvm()
    tm = _target_machine()
    self.parallel = parallel
    module = llvm.parse_assembly(source)
    module.triple, module.data_layout = tm.triple, str(tm.target_data)
    module.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=2)
    pto.loop_vectorization = pto.slp_vectorization = True
    pass_builder = llvm.create_pass_builder(tm, pto)
    pass_builder.getModulePassManager().run(module, pass_builder)
    self.engine = llvm.create_mcjit_compiler(module, tm)
    self.engine.finalize_object()
    self.optimized_ir = str(module)
    address = self.engine.get_function_address(name)
    self.fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * n_buffers, ctypes.c_int64, ctypes.c_int64)(address)
    CacheStats.compiles += 1


def compile_llvm(source: str, name: str, n_buffers: int = 1, parallel: int = 0) -> CompiledKernel:
  return memoize(cache_key("llvm", source), lambda: CompiledKernel(source, name, n_buffers, parallel))


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
      program = lower_item(item)
      source = render_llvm(program)
      if DEBUG() >= 4: print(source)
      self.programs[key] = compile_llvm(source, item.name, len(program.globals), program.parallel)
    return self.programs[key]

  def exec(self, item, bufs) -> None:
    kernel = self.program(item)
    run_parallel(kernel.fn, [b.allocate().address for b in bufs], kernel.parallel, prod(item.full_shape))


def device_class(): return LLVMDevice
