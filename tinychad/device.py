"""Devices and their memory.

in: a device name ("NUMPY", "CPU", "LLVM", "OPENCL", "CUDA", optionally "CPU:0")  ->  out: the device object
that runs kernels, and Buffers of memory. The CPU devices live on the host, so their Buffer is a 64-byte aligned
numpy array underneath; a device with memory of its own (DEVICE_MEMORY: OPENCL, CUDA) hands out its buffers
through its `allocator` (alloc, free, copyin, copyout), and `as_numpy` is then a copy. Each device is
a declaration in runtime/ (its renderer, compiler and program loader: runtime/compiled.py), imported
by name on first use; engine/realize.py drives them.
The default device is CUDA where an NVIDIA driver, a GPU and NVRTC are there (runtime/cuda_driver.py says
why not, once per process: without a driver that costs one failed dlopen), else the CPU; DEVICE= overrides.
Asking for CUDA where it can't run raises CUDAUnavailable (a ValueError) saying why.
"""
from __future__ import annotations
import ctypes
import ctypes.util
import importlib
import mmap
import os
import numpy as np
from tinychad.dtype import DType
from tinychad.helpers import GlobalCounters


class _MemoryPool:
  """Freed buffers wait here for the next buffer of the same size class: fresh memory is slow to touch
  (page faults), and a training step asks for the same sizes every time. A buffer of up to SMALL_BYTES is its own
  class; a bigger one gets a block of its size rounded up to one of 16 steps per power of two (at most 1/16 more),
  so that a buffer that grows a little at each step (a KV cache concatenated once per token) takes the block the
  step before gave back: with exact sizes each token's caches were fresh memory, whose page faults made the copy
  into them ~7x slower (a 119 KB cache: 70 us instead of ~10), and the old ones piled up in the pool.
  Bounded so it can't hoard: past LIMIT_BYTES pooled, the sizes given back least recently go back to the allocator,
  whole, until the pool fits (refusing the new ones instead left a process that had run a few models with a pool
  full of their old activations, and every later buffer fresh memory: a tiny op took 7.4 us there, not 5.4);
  empty() gives back the rest. A buffer of BIG_BYTES or more is mapped from the OS on its own (an anonymous mmap,
  page aligned) and never pooled, so its pages go back the moment it dies: through malloc they could stay in the
  process (seen in a long test process, where a freed 256 MiB block kept the resident size up)."""
  LIMIT_BYTES = 1 << 30
  # a buffer this big costs its page faults once per use (~5% of merely writing it once), and pooling it would hold
  # a model's largest activations after they die: `del` of a big tensor should show in the process's memory
  BIG_BYTES = 64 << 20
  SMALL_BYTES = 4096

  def __init__(self):
    # by size class, the one given back most recently last
    self.free: dict[int, list[tuple[np.ndarray, int, ctypes.c_void_p]]] = {}
    self.pooled_bytes, self.last_given = 0, -1     # -1: no size (a zero-byte buffer is pooled too)

  def size_class(self, nbytes: int) -> int:
    """The bytes of the block a buffer of `nbytes` gets (the class it is pooled by)."""
    if nbytes <= self.SMALL_BYTES or nbytes >= self.BIG_BYTES: return nbytes
    step = 1 << (nbytes.bit_length() - 5)
    return (nbytes + step - 1) // step * step

  def take(self, nbytes: int, alignment: int = 64) -> tuple[np.ndarray, int, ctypes.c_void_p]:
    """A block of at least `nbytes` (its size class), its address and that address as a ctypes pointer (kept with
    it: asking numpy for the address costs a microsecond, and a kernel called with pointers skips ctypes'
    conversion of each argument)."""
    # size_class() answers a small buffer the same, but an eager op's buffer is small: the test here saves the call
    size = nbytes if nbytes <= self.SMALL_BYTES else self.size_class(nbytes)
    pooled = self.free.get(size)
    if pooled:
      self.pooled_bytes -= size
      return pooled.pop()
    if size >= self.BIG_BYTES:
      memory = np.frombuffer(mmap.mmap(-1, size), dtype=np.uint8)   # the array keeps the map alive, then unmaps it
      address = memory.ctypes.data
    else:
      raw = np.empty(size + alignment, dtype=np.uint8)
      # asked once: numpy makes a new ctypes helper object on every .ctypes (~9k instructions)
      unaligned = raw.ctypes.data
      start = (-unaligned) % alignment
      memory, address = raw[start:start + size], unaligned + start
    return memory, address, ctypes.c_void_p(address)

  def give(self, nbytes: int, taken: tuple[np.ndarray, int, ctypes.c_void_p]) -> None:
    """Memory back from a buffer: `taken` is what take(nbytes) gave it."""
    size = nbytes if nbytes <= self.SMALL_BYTES else self.size_class(nbytes)
    if size >= self.BIG_BYTES: return
    if size == self.last_given: pooled = self.free[size]     # an eager loop gives back one size: no move
    else:
      # taken out and put back: a dict keeps its keys in insertion order, so this makes the size the latest
      pooled = self.free.pop(size, None) or []
      self.free[size] = pooled
      self.last_given = size
    pooled.append(taken)
    self.pooled_bytes += size
    if self.pooled_bytes > self.LIMIT_BYTES:
      for oldest in list(self.free)[:-1]:      # the last is this size
        self.pooled_bytes -= oldest * len(self.free.pop(oldest))
        if self.pooled_bytes <= self.LIMIT_BYTES: break
      else:      # this size's blocks alone are past the limit: this one goes back to the allocator
        pooled.pop()
        self.pooled_bytes -= size

  def clear(self) -> None:
    self.free.clear()
    self.pooled_bytes, self.last_given = 0, -1

  def empty(self) -> None:
    """Drop every pooled buffer and ask the C allocator to return its free memory to the OS (glibc's malloc_trim;
    elsewhere the allocator decides)."""
    self.clear()
    if _LIBC is not None: _LIBC.malloc_trim(0)


def _load_libc():
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    return libc if hasattr(libc, "malloc_trim") else None
  except OSError:
    return None


_LIBC = _load_libc()
memory_pool = _MemoryPool()
# devices whose buffers live in their own memory, through their device object's `allocator`
DEVICE_MEMORY = frozenset({"OPENCL", "CUDA"})


# PyTorch's memory questions (torch.cuda.memory_allocated() and friends), answered for host memory
def memory_allocated() -> int:
  """Bytes held by live buffers: tensors' data, realized or kept by the graph (GlobalCounters.mem_used). Their
  sizes as asked: a buffer over 4 KiB sits in a block up to 1/16 bigger (the pool's size class)."""
  return GlobalCounters.mem_used
def max_memory_allocated() -> int:
  """The most memory_allocated() has been since the start or reset_peak_memory_stats()."""
  return GlobalCounters.mem_peak
def reset_peak_memory_stats() -> None: GlobalCounters.mem_peak = GlobalCounters.mem_used
def memory_pooled() -> int:
  """Bytes of freed buffers the pool keeps for reuse (not counted by memory_allocated())."""
  return memory_pool.pooled_bytes
def memory_reserved() -> int:
  """PyTorch's meaning: live buffers plus what the pool keeps."""
  return GlobalCounters.mem_used + memory_pool.pooled_bytes
def empty_cache() -> None:
  """Give the pool's buffers back, and the C allocator's free memory to the OS (PyTorch's empty_cache()); a
  device with memory of its own that keeps freed blocks (CUDA) gives them back to its driver."""
  memory_pool.empty()
  for name in DEVICE_MEMORY:
    device = Device._devices.get(name)
    if device is not None and hasattr(device.allocator, "empty"): device.allocator.empty()


class Buffer:
  """`size` elements of `dtype` in host memory for `device` (64-byte aligned, from the pool)."""
  # made and freed once per kernel an eager step runs: slots make both quicker
  __slots__ = ("device", "size", "dtype", "nbytes", "address", "_as_parameter_", "_memory", "_data", "_allocator")
  # a BufferView's buffer and where in it the view starts (bytes); a Buffer is its own memory
  view_of: Buffer | None = None
  view_offset = 0

  def __init__(self, device: str, size: int, dtype: DType):
    self.device, self.size, self.dtype = device, size, dtype
    self.nbytes: int = size * dtype.itemsize
    self._memory: np.ndarray | None = None
    self._data: np.ndarray | None = None
    self._allocator = None     # a device with memory of its own: where the memory goes back

  def __repr__(self) -> str: return f"<Buffer {self.device} {self.size} {self.dtype.name}>"

  def __del__(self):
    memory = self._memory
    if memory is None or GlobalCounters is None: return   # None: the interpreter is shutting down
    nbytes = self.nbytes
    GlobalCounters.mem_used -= nbytes
    if self._allocator is not None: self._allocator.free(memory)
    else: memory_pool.give(nbytes, (memory, self.address, self._as_parameter_))

  def allocate(self) -> Buffer:
    if self._memory is None:
      nbytes = self.nbytes
      if self.device in DEVICE_MEMORY:
        # the allocator is kept: the buffer goes back to it even if the registry has changed or is gone by then
        self._allocator = Device[self.device].allocator
        self._memory, self.address, self._as_parameter_ = self._allocator.alloc(nbytes), 0, None
      # address: what a list of kernels is called with; _as_parameter_, the same as a ctypes pointer, is how ctypes
      # passes the Buffer itself to a kernel (its protocol for objects that stand for a C value)
      else: self._memory, self.address, self._as_parameter_ = memory_pool.take(nbytes)
      used = GlobalCounters.mem_used = GlobalCounters.mem_used + nbytes
      if used > GlobalCounters.mem_peak: GlobalCounters.mem_peak = used
    return self

  def copyin(self, array: np.ndarray) -> Buffer:
    if self.device in DEVICE_MEMORY:
      flat = np.ascontiguousarray(np.broadcast_to(array.reshape(-1), (self.size,)), dtype=self.dtype.np)
      Device[self.device].allocator.copyin(self.allocate()._memory, flat)
    else: self.as_numpy()[:] = array.reshape(-1)
    return self

  def as_numpy(self) -> np.ndarray:
    """The buffer's memory as a flat numpy array (no copy); made on first use, as kernels need only the
    address. A device with memory of its own gives a copy of it, made on every call."""
    if self.device in DEVICE_MEMORY: return Device[self.device].allocator.copyout(self.allocate()._memory, self.size, self.dtype.np)
    # the pool's block may be a little bigger than the buffer (its size class)
    if self._data is None: self._data = self.allocate()._memory[:self.nbytes].view(self.dtype.np)
    return self._data


class BufferView(Buffer):
  """`size` elements of another buffer's memory from byte `view_offset` on, on a host device: a cat's piece that its
  kernel writes straight into the cat's buffer (engine/schedule.py). The view keeps that buffer alive and frees
  nothing; a view of a view is a view of the first buffer."""
  __slots__ = ("view_of", "view_offset")

  def __init__(self, buffer: Buffer, offset: int, size: int):
    super().__init__(buffer.device, size, buffer.dtype)
    if buffer.device in DEVICE_MEMORY: raise ValueError(f"BufferView of a {buffer.device} buffer: views are of host memory")
    if offset < 0 or offset + size > buffer.size:
      raise ValueError(f"BufferView of elements [{offset}, {offset + size}) of a buffer of {buffer.size} elements")
    self.view_of = buffer.view_of or buffer
    self.view_offset = buffer.view_offset + offset * buffer.dtype.itemsize
    self.address = self.view_of.allocate().address + self.view_offset
    self._as_parameter_ = ctypes.c_void_p(self.address)

  def __repr__(self) -> str:
    return f"<BufferView {self.device} {self.size} {self.dtype.name} at byte {self.view_offset}>"
  # its memory is its buffer's (no _memory of its own, which is also why Buffer.__del__ gives nothing back)
  def allocate(self) -> Buffer: return self

  def moved_to(self, buffer: Buffer) -> BufferView:
    """The same elements of `buffer`, a buffer like this view's (a TinyJit replay's new one)."""
    return BufferView(buffer, self.view_offset // self.dtype.itemsize, self.size)

  def as_numpy(self) -> np.ndarray:
    if self._data is None:
      start = self.view_offset // self.dtype.itemsize
      self._data = self.view_of.as_numpy()[start:start + self.size]
    return self._data


class _DeviceRegistry:
  """`Device["CPU"]` gives the device object; `Device.DEFAULT` is the default device's name."""
  _modules = {"NUMPY": "tinychad.runtime.ops_numpy", "CPU": "tinychad.runtime.ops_cpu", "LLVM": "tinychad.runtime.ops_llvm",
              "OPENCL": "tinychad.runtime.ops_opencl", "CUDA": "tinychad.runtime.ops_cuda"}

  def __init__(self):
    self._devices: dict = {}
    self._default: str | None = None

  @staticmethod
  def canonicalize(name: str | None) -> str:
    if name is None: return Device.DEFAULT
    base = name.split(":")[0].upper()
    if base in ("CLANG", "C"): base = "CPU"
    if base == "CL": base = "OPENCL"     # tinygrad's name
    if base == "CUDA" and (reason := _cuda_unavailable()) is not None:
      from tinychad.runtime.cuda_driver import CUDAUnavailable
      raise CUDAUnavailable(f"device CUDA is unavailable: {reason}")
    if base not in _DeviceRegistry._modules:
      raise ValueError(f"unknown device {name!r}; devices are {sorted(_DeviceRegistry._modules)}")
    return base

  def __getitem__(self, name: str):
    if name in self._devices: return self._devices[name]
    name = self.canonicalize(name)
    if name not in self._devices:
      module = importlib.import_module(self._modules[name])
      self._devices[name] = module.device_class()(name)
    return self._devices[name]

  @property
  def DEFAULT(self) -> str:
    if self._default is None: self._default = self._pick_default()
    return self._default

  @DEFAULT.setter
  def DEFAULT(self, name: str) -> None: self._default = self.canonicalize(name)

  def _pick_default(self) -> str:
    if os.getenv("DEVICE"): return self.canonicalize(os.environ["DEVICE"])
    if os.getenv("LLVM", "0") not in ("0", ""): return "LLVM"
    if _cuda_unavailable() is None: return "CUDA"
    for name in ("CPU", "LLVM"):
      if name in self._modules and self.available(name): return name
    return "NUMPY"

  def available(self, name: str) -> bool:
    if name == "CUDA": return _cuda_unavailable() is None    # the driver's answer, without the device's imports
    try:
      module = importlib.import_module(self._modules[name])
    except ImportError:
      return False
    return module.device_class().available()


def _cuda_unavailable() -> str | None:
  """Why CUDA can't run in this process, or None (cached: runtime/cuda_driver.py)."""
  from tinychad.runtime import cuda_driver
  return cuda_driver.unavailable_reason()


Device = _DeviceRegistry()
