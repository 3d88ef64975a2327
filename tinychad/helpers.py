"""Small shared helpers: environment flags, counters, argument normalisation, permutations, graph order,
atomic file writes, the garbage collector's threshold."""
from __future__ import annotations
import contextlib
import gc
import math
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Hashable, Iterable, Iterator, TypeVar

T = TypeVar("T", bound=Hashable)


# os.getenv encodes the key and decodes the value through os.environ's Mapping methods (~0.7 us); the
# engine reads its flags (DEBUG, NOOPT, GRAPH, PORT) on every realize, so on POSIX read the bytes dict
# os.environ keeps instead: os.environ's setters (monkeypatch.setenv too) update it, so it is never stale
_ENVIRON_BYTES: dict | None = getattr(os.environ, "_data", None) if os.name == "posix" else None


def getenv(key: str, default=0):
  if _ENVIRON_BYTES is None: value = os.getenv(key)
  else:
    value = _ENVIRON_BYTES.get(key.encode())
    if value is not None: value = os.fsdecode(value)
  if value is None: return default
  return type(default)(value) if not isinstance(default, bool) else value not in ("0", "", "false", "False")


class EnvFlags:
  """Integer flags read on every realize (DEBUG, GRAPH and PORT together; NOOPT for the schedule's key): `any()` says
  whether one of them is nonzero, as any(getenv(key, 0) ...) would. The keys are encoded once, and none of them set
  (the usual case) costs a membership test each: a call of getenv per flag, or a set operation on the environment's
  keys, costs two to three times as much, on every op an eager model runs."""
  __slots__ = ("keys", "encoded")

  def __init__(self, *keys: str):
    self.keys, self.encoded = keys, tuple(key.encode() for key in keys)

  def any(self) -> bool:
    environ = _ENVIRON_BYTES
    if environ is None: return any(getenv(key, 0) for key in self.keys)
    for key in self.encoded:
      if key in environ: return any(getenv(key, 0) for key in self.keys)
    return False


def DEBUG() -> int: return getenv("DEBUG", 0)


# Python's own first-generation threshold, and the one tinychad sets in its place (bench/README.md, "Garbage
# collection"): an eager step keeps ~6,000-30,000 of its objects alive until its backward pass is done
PYTHON_GC_THRESHOLD, GC_THRESHOLD = 700, 50_000


def relax_gc() -> None:
  """Let Python's cycle collector wait for GC_THRESHOLD new live objects instead of 700. tinychad records
  several objects per op (Tensor, Function, LazyBuffer, tuples), none in a reference cycle, so they die by
  reference counting; at 700 the collector scans each step's graph over and over while it is still alive,
  and promotes it to the oldest generation, whose full collections walk every object in the process (every
  few steps, tens of ms). The environment's GC_THRESHOLD sets another value (700 is Python's, 0 turns
  automatic collection off); a threshold the program set itself before importing tinychad is left alone."""
  threshold, *older = gc.get_threshold()
  wanted = os.environ.get("GC_THRESHOLD")
  if wanted is not None:
    if not wanted.isdigit(): raise ValueError(f"GC_THRESHOLD: expected a count of objects (0 or more), got {wanted!r}")
    gc.set_threshold(int(wanted), *older)
  elif threshold == PYTHON_GC_THRESHOLD: gc.set_threshold(GC_THRESHOLD, *older)


prod = math.prod   # not wrapped in a def: it runs for every LazyBuffer made


def argfix(*x):
  """Let shape-taking functions accept f(2, 3) and f((2, 3)) alike."""
  if x and isinstance(x[0], (tuple, list)):
    if len(x) != 1: raise ValueError(f"bad shape arguments {x}")
    return tuple(x[0])
  return tuple(x)


def all_int(xs) -> bool: return all(isinstance(x, int) for x in xs)


def inverse_permutation(order: tuple[int, ...]) -> tuple[int, ...]:
  """The order that undoes `order`: x.permute(order).permute(inverse_permutation(order)) is x."""
  inverse = [0] * len(order)
  for position, axis in enumerate(order): inverse[axis] = position
  return tuple(inverse)


class _Counters:
  """What realizes have run since the last reset: kernels, floating point ops, bytes moved, and the seconds kernels
  ran (counted at DEBUG>=2 only, where each kernel is timed); and the memory device.py's Buffers hold (reset() leaves
  those: they are state, not counts of work).
  One instance, GlobalCounters: every kernel run adds to three counters, and setting an attribute of an
  instance with slots costs a fifth of setting a class attribute (which invalidates the type's caches)."""
  __slots__ = ("kernel_count", "global_ops", "global_mem", "time_sum_s", "mem_used", "mem_peak")

  def __init__(self):
    self.mem_used = 0       # bytes held by live buffers (tinygrad's name; tinychad.memory_allocated())
    self.mem_peak = 0       # the most mem_used has been since the last tinychad.reset_peak_memory_stats()
    self.reset()

  def reset(self) -> None:
    self.kernel_count = self.global_ops = self.global_mem = 0
    self.time_sum_s = 0.0


GlobalCounters = _Counters()


def toposort(roots: Iterable[T], children: Callable[[T], Iterable[T]]) -> list[T]:
  """Every node reachable from `roots`, each once, children before the nodes that reach them (roots
  last, in the order given). Every graph walk in tinychad goes through here: kernel trees, the lazy
  graph, autograd. It keeps a stack of its own, so a graph thousands of nodes deep (an unrolled RNN's
  backward) needs no Python recursion."""
  order: list[T] = []
  seen: set[T] = set()
  for root in roots:
    if root in seen: continue
    seen.add(root)
    stack = [(root, iter(children(root)))]
    while stack:
      node, pending = stack[-1]
      for child in pending:
        if child not in seen:
          seen.add(child)
          stack.append((child, iter(children(child))))
          break
      else:
        stack.pop()
        order.append(node)
  return order


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike) -> Iterator[BinaryIO]:
  """A binary file to write that becomes `path` only when the `with` block ends without an exception:
  the bytes go to a temporary file beside `path` (same filesystem, so the rename is atomic), are
  fsynced, then replace `path`. A reader (another process, or this one after a crash or power loss)
  sees the old file or the whole new one, never a part; on an exception the temporary file is removed
  and `path` is left as it was. Every file tinychad writes goes through here."""
  path = Path(path)
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
  try:
    with os.fdopen(fd, "wb") as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError): os.unlink(tmp)
    raise


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
  """Write `data` to `path` whole or not at all (see atomic_open)."""
  with atomic_open(path) as f: f.write(data)
