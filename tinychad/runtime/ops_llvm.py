"""The LLVM device: kernels rendered to LLVM IR, compiled in-process by llvmlite, run as native code.

in: LLVM IR text of one kernel from render_llvm  ->  out: its object code (an ELF object, optimized
    at -O2 by LLVM's new pass manager for the host CPU; cached on disk by the kernel cache, keyed by
    the IR and the host CPU), loaded into MCJIT, and the kernel's function in it.
One kernel per module, compiled one after another (batch = False): llvmlite 0.50 holds one
process-wide lock around every call into LLVM (binding/ffi.py's _LLVMLock), so threads compiled no
faster than one (2.01 s against 2.02 s for two kernels).
llvmlite 0.50: llvm.initialize() raises, so only the native target and asm printer are initialized.
Each execution engine gets its own TargetMachine (an engine takes ownership of the one it's given).
"""
from __future__ import annotations
import ctypes
import ctypes.util
import functools
from tinychad.host import simd_bytes
from tinychad.renderer.llvmir import render_llvm
from tinychad.runtime.compiled import Compiled


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
  tm = _target_machine()
  return tm.emit_object(optimized_module(source, tm))


def optimized_module(source: str, tm):
  """An LLVM module's text parsed for target machine `tm` (the host's, or another: the export's aarch64 check),
  verified and optimized at -O2 with loop and SLP vectorization."""
  llvm = _llvm()
  module = llvm.parse_assembly(source, context=llvm.create_context())
  module.triple, module.data_layout = tm.triple, str(tm.target_data)
  module.verify()
  pto = llvm.create_pipeline_tuning_options(speed_level=2)
  pto.loop_vectorization = pto.slp_vectorization = True
  pass_builder = llvm.create_pass_builder(tm, pto)
  pass_builder.getModulePassManager().run(module, pass_builder)
  return module


def _load(obj: bytes):
  """Object code loaded into an MCJIT engine of its own (the engine keeps the code alive)."""
  llvm = _llvm()
  # an engine needs a module to start from; the kernel itself comes in as an object file
  engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), _target_machine())
  engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
  engine.finalize_object()
  return engine


@functools.lru_cache(maxsize=None)
def _host() -> str:
  llvm = _llvm()
  return f"{llvm.get_process_triple()} {llvm.get_host_cpu_name()} {_features()}"


def _render(programs: list, symbols: list[str]) -> str:
  (program,), (symbol,) = programs, symbols    # one kernel per module, under its own name
  assert symbol == program.name, "the LLVM renderer names a function after its program"
  return render_llvm(program)


class LLVMDevice(Compiled):
  renderer = staticmethod(_render)
  suffix = ".o"
  load = staticmethod(_load)

  @staticmethod
  def available() -> bool:
    try:
      _llvm()
    except Exception:             # no llvmlite, or it can't find a native target
      return False
    return True

  @staticmethod
  def identity(source: str = "", contract: bool = False) -> str: return _host()   # contract is in the IR itself

  @staticmethod
  def compile(source: str, name: str, contract: bool = False) -> bytes: return compile_object(source)

  @staticmethod
  def address(engine, symbol: str) -> int: return engine.get_function_address(symbol)


def device_class(): return LLVMDevice
