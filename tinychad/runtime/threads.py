"""Running one compiled kernel on several cores.

in: a native function taking (buffer pointers..., start, end), the extent of its parallel loop and
    the kernel's total work (points of its iteration space)
out: the function called once per chunk of [0, extent), the chunks on a persistent thread pool.
ctypes drops the GIL for the duration of a foreign call, so the chunks really run at once. Kernels
with less than MIN_PARALLEL_WORK points run on the calling thread: waking a worker costs tens of
microseconds, more than a small kernel takes. `THREADS` sets the thread count (default: all cores).
"""
from __future__ import annotations
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable
from tinychad.helpers import getenv

MIN_PARALLEL_WORK = 1 << 16

_pool: ThreadPoolExecutor | None = None


def thread_count() -> int:
  return max(1, getenv("THREADS", os.cpu_count() or 1))


def _executor(workers: int) -> ThreadPoolExecutor:
  global _pool
  if _pool is None or _pool._max_workers < workers:
    _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tinychad")
  return _pool


def chunks(extent: int, parts: int) -> list[tuple[int, int]]:
  """[0, extent) cut into `parts` nearly equal ranges, the larger ones first."""
  base, extra = divmod(extent, parts)
  out, start = [], 0
  for i in range(parts):
    end = start + base + (1 if i < extra else 0)
    out.append((start, end))
    start = end
  return out


def run_parallel(fn: Callable[..., None], args: list, extent: int, work: int) -> None:
  """fn(*args, start, end) over [0, extent), split across threads when the kernel is big enough."""
  parts = min(thread_count(), extent) if work >= MIN_PARALLEL_WORK else 1
  if parts <= 1:
    fn(*args, 0, max(extent, 1))
    return
  ranges = chunks(extent, parts)
  futures = [_executor(parts - 1).submit(fn, *args, lo, hi) for lo, hi in ranges[1:]]
  fn(*args, *ranges[0])
  for f in futures: f.result()
