"""The LLVM device: kernels compiled to LLVM IR and JIT-compiled in process with llvmlite.

in: a ScheduleItem and its Buffers (output first, then inputs by LOAD number)
out: the output buffer filled by machine code from MCJIT, optimized at -O2 by LLVM's new pass
     manager for the host CPU. Compiled kernels are cached in memory by source text.
llvmlite 0.50: llvm.initialize() raises, so only the native target and asm printer are initialized.
Each execution engine gets its own TargetMachine (an engine takes ownership of the one it's given).
"""
from __future__ import annotations
import ctypes
import ctypes.util
import functools
from tinychad.codegen import lower_item
from tinychad.helpers import DEBUG
from tinychad.renderer.llvmir import render_llvm
from tinychad.runtime.cache import CacheStats, cache_key, memoize


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
  def __init__(self, source: str, name: str):
    llvm = _llvm()
    tm = _target_machine()
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
    self.fn = ctypes.CFUNCTYPE(None)(address)
    CacheStats.compiles += 1

  def __call__(self, *pointers: int) -> None: self.fn(*[ctypes.c_void_p(p) for p in pointers])


def compile_llvm(source: str, name: str) -> CompiledKernel:
  return memoize(cache_key("llvm", source), lambda: CompiledKernel(source, name))


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
      source = render_llvm(lower_item(item))
      if DEBUG() >= 4: print(source)
      self.programs[key] = compile_llvm(source, item.name)
    return self.programs[key]

  def exec(self, item, bufs) -> None:
    self.program(item)(*[b.as_numpy().ctypes.data for b in bufs])


def device_class(): return LLVMDevice
