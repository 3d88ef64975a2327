"""Small shared helpers: environment flags, counters, argument normalisation."""
from __future__ import annotations
import math
import os


def getenv(key: str, default=0):
  value = os.getenv(key)
  if value is None: return default
  return type(default)(value) if not isinstance(default, bool) else value not in ("0", "", "false", "False")


def DEBUG() -> int: return getenv("DEBUG", 0)


prod = math.prod   # not wrapped in a def: it runs for every LazyBuffer made


def argfix(*x):
  """Let shape-taking functions accept f(2, 3) and f((2, 3)) alike."""
  if x and isinstance(x[0], (tuple, list)):
    if len(x) != 1: raise ValueError(f"bad shape arguments {x}")
    return tuple(x[0])
  return tuple(x)


def all_int(xs) -> bool: return all(isinstance(x, int) for x in xs)


class GlobalCounters:
  """What realizes have run since the last reset: kernels, floating point ops, bytes moved, seconds."""
  kernel_count: int = 0
  global_ops: int = 0
  global_mem: int = 0
  time_sum_s: float = 0.0

  @staticmethod
  def reset() -> None:
    GlobalCounters.kernel_count = GlobalCounters.global_ops = GlobalCounters.global_mem = 0
    GlobalCounters.time_sum_s = 0.0
