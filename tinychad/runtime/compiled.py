"""What every compiled device shares: the kernel calling convention, building a binary through the
kernel cache, and running a loaded kernel across threads.

in: a device's declaration (a subclass of Compiled, see ops_cpu.py and ops_llvm.py):
      renderer(programs, symbols) -> source   the source of one binary defining each program's
                                              function under its symbol (renderer/)
      batch                                   True: one binary may hold several kernels, and several
                                              binaries build at once (separate compiler processes)
      parallel_builds                         how many binaries a schedule's new kernels are cut into, built at
                                              once (one per core unless the compiler builds one at a time)
      suffix                                  the binary's file suffix in the kernel cache
      identity(source="", contract=False)     the compiler and its flags (or the target CPU): with the
                                              source, what decides the binary's bytes
      compile(source, name, contract) -> bytes  the binary; `name` is for error messages only
      load(binary) -> handle                  the binary loaded (a ctypes.CDLL, an MCJIT engine)
      address(handle, symbol) -> int          where a function's machine code is
out: Kernels, each a native function fn(buffer addresses..., start, end) over [start, end) of its
     parallel loop, its extent, its address (for the thread pool) and the handle that keeps it loaded; a kernel
     shared by trees that differ in their inputs' offsets (codegen/offsets.py) adds its `shifts` to the addresses.
engine/realize.py drives the steps (lower, render, compile, load, run) and fills `programs`.
"""
from __future__ import annotations
import ctypes
import os
from typing import Any, Callable, NamedTuple
from tinychad.runtime.cache import cache_key, cached_bytes, memoize, stored_bytes
from tinychad.runtime.threads import MIN_PARALLEL_WORK, run_parallel


class Kernel(NamedTuple):
  fn: Any              # ctypes function: (void* buffers..., void* constants..., int64 start, int64 end)
  parallel: int        # the extent of its parallel loop
  address: int         # fn's machine code address (asking ctypes for it costs ~1.5 us a call)
  owner: Any           # the loaded binary (and what the constants point to): holding it keeps them mapped
  constants: tuple[int, ...] = ()   # pointers passed after the buffers (runtime/copy.py's geometry)
  shifts: tuple[int, ...] = ()      # bytes added to each buffer's address (codegen/offsets.py), buffer 0 first


def buffer_addresses(kernel: Kernel, bufs: list) -> list[int]:
  """The buffers' addresses as the kernel takes them (allocated first), each plus its shift."""
  addresses = [b.allocate().address for b in bufs]
  for i, shift in enumerate(kernel.shifts): addresses[i] += shift
  return addresses


def kernel_function(address: int, buffers: int):
  """The ctypes function at `address` taking `buffers` pointers, then the parallel loop's [start, end)."""
  return ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * buffers, ctypes.c_int64, ctypes.c_int64)(address)


class Compiled:
  batch = False
  parallel_builds = os.cpu_count() or 1
  suffix = ""

  def __init__(self, name: str):
    self.name = name
    self.programs: dict = {}      # (kernel tree, kernel name) -> Kernel; filled by engine/realize.py

  def binary_key(self, source: str, contract: bool) -> str:
    return cache_key(self.suffix, self.identity(source, contract), source)

  def binary(self, source: str, name: str, contract: bool = False) -> bytes:
    """The binary of `source`: from the disk cache, else compiled (and stored there)."""
    return cached_bytes(self.binary_key(source, contract), self.suffix, lambda: self.compile(source, name, contract))

  def library(self, source: str, name: str, contract: bool = False) -> tuple[Any, str]:
    """(the binary of `source` loaded, once per process; its cache key)."""
    key = self.binary_key(source, contract)
    return memoize(key, lambda: self.load(self.binary(source, name, contract))), key

  def stored_library(self, key: str) -> Any | None:
    """The binary cached under `key`, loaded; None when it isn't in memory or on disk (never compiles)."""
    return memoize(key, lambda: None if (binary := stored_bytes(key, self.suffix)) is None else self.load(binary))

  def kernel(self, handle: Any, symbol: str, buffers: int, parallel: int) -> Kernel:
    address = self.address(handle, symbol)
    return Kernel(kernel_function(address, buffers), parallel, address, handle)

  def build(self, program) -> Kernel:
    """One Program rendered, compiled (through the disk cache) and loaded on its own, not kept in memory."""
    source = self.renderer([program], [program.name])
    handle = self.load(self.binary(source, program.name, program.contract))
    return self.kernel(handle, program.name, len(program.globals), program.parallel)

  @staticmethod
  def run(kernel: Kernel, bufs: list, points: int) -> None:
    """The kernel over its whole parallel loop on `bufs`; `points` (its iteration space) decides the threads."""
    run_parallel(kernel.fn, buffer_addresses(kernel, bufs) + list(kernel.constants), kernel.parallel, points,
                 kernel.address)

  def launcher(self, kernel: Kernel, points: int) -> Callable[[list], None]:
    """run(kernel, bufs, points) with what depends only on the kernel decided once (a remembered schedule's
    launch, engine/realize.py): a kernel too small for threads whatever THREADS says (run_parallel's rule)
    is its ctypes function called over its whole loop; a bigger one goes through run(), which reads the
    thread count each time, as does every kernel of a device with a run() of its own (OPENCL's queue) and every
    kernel whose buffers' addresses are shifted. The buffers must be allocated (a realized buffer, or one just
    allocated)."""
    if points >= MIN_PARALLEL_WORK or type(self).run is not Compiled.run or kernel.shifts:
      return lambda bufs: self.run(kernel, bufs, points)
    # the kernel's signature without argument types, called with the buffers (ctypes passes each as its pointer,
    # Buffer._as_parameter_) and ctypes objects for the loop's bounds, made once: converting each int through the
    # argument types costs about as much as the call itself
    fn, start, end = ctypes.CFUNCTYPE(None)(kernel.address), ctypes.c_int64(0), ctypes.c_int64(max(kernel.parallel, 1))
    if kernel.constants:
      constants = [ctypes.c_void_p(c) for c in kernel.constants]
      return lambda bufs: fn(*bufs, *constants, start, end)
    return lambda bufs: fn(*bufs, start, end)
