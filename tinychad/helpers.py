"""Small shared helpers: environment flags, counters, argument normalisation, graph order."""
from __future__ import annotations
import math
import os
from typing import Callable, Hashable, Iterable, TypeVar

T = TypeVar("T", bound=Hashable)


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
