"""Remembering schedules: a model records the same graph at every step, so it is scheduled once.

in: the LazyBuffers to realize
out: a key for the shape of their graph, and for a key seen before the kernels scheduled then, over
     this graph's buffers.
The key lists every LazyBuffer reachable from the outputs (down to realized bases), sources first
(helpers.toposort's order), as what the scheduler reads of it: a view is its ShapeTracker and its
base's position; a realized base its device, dtype and shape; any other base its op, argument, dtype,
device, shape and its sources' positions. Which buffers are shared, and which are the outputs, are in the positions.
Two graphs with equal keys differ only in which buffers they hold, so the scheduler's fusion choices
and kernel trees are the same: a ScheduleItem is kept as its kernel tree and the positions of its
output and inputs. Buffers the scheduler made itself (packed panels) are made anew each time.
The key is a GraphKey, which hashes its entries once: the cache looks it up and reorders it (LRU).
"""
from __future__ import annotations
from collections import OrderedDict
from typing import Any, Callable
import numpy as np
from tinychad.helpers import getenv, toposort
from tinychad.lazy import LazyBuffer
from tinychad.ops import KernelNode, LoadOps

MAX_SCHEDULES = 1024     # graph shapes remembered, least recently used forgotten first


def _arg_key(arg: Any) -> Any:
  # most ops (every elementwise one but CAST) have no argument: None keys as itself, as no other argument does
  if arg is None: return None
  # 0.0 == -0.0 and 1 == 1.0 == True hash alike, yet make different kernels; NaN equals nothing. A float
  # constant (the common argument: every scalar in a step) that is neither zero nor NaN keys as its value
  if type(arg) is float and arg == arg and arg != 0.0: return (float, arg)
  if isinstance(arg, (float, np.floating)): return ("float", float(arg).hex())
  if isinstance(arg, tuple):
    # most arguments are axes or shapes: plain ints (not bools) key as themselves
    if all(type(a) is int for a in arg): return arg
    return tuple(_arg_key(a) for a in arg)
  return (type(arg).__name__, arg)


class GraphKey:
  """A graph's key (the tuple graph_key builds) with its hash worked out once: a step's graph has
  thousands of entries, and a tuple's hash is not kept, so each dictionary lookup or reordering of the
  cache would walk it all again. Equal keys have equal entries."""
  __slots__ = ("entries", "_hash")

  def __init__(self, entries: tuple):
    self.entries, self._hash = entries, hash(entries)

  def __hash__(self) -> int: return self._hash
  def __eq__(self, other) -> bool:
    return self is other or (isinstance(other, GraphKey) and self._hash == other._hash and self.entries == other.entries)


def _key_sources(lb: LazyBuffer) -> tuple[LazyBuffer, ...]:
  """What the key reads below a buffer: a view's base, an uncomputed base's sources; a computed one is a leaf."""
  base = lb._base
  if base is not None: return (base,)
  return lb.srcs if lb.realized is None else ()


def graph_key(outs: list[LazyBuffer]) -> tuple[GraphKey, list[LazyBuffer]]:
  """(key, nodes): the key of the graph under `outs`, and its LazyBuffers in key order (sources first)."""
  nodes = toposort(outs, _key_sources)
  position = {lb: i for i, lb in enumerate(nodes)}
  entries = []
  for lb in nodes:
    base = lb._base
    if base is not None: entries.append((lb.st, position[base]))
    elif lb.realized is not None: entries.append((lb.device, lb.dtype, lb.shape))
    else: entries.append((lb.op, _arg_key(lb.arg), lb.dtype, lb.device, lb.shape, tuple([position[s] for s in lb.srcs])))
  # NOOPT changes what the scheduler packs
  return GraphKey((tuple(entries), tuple([position[out] for out in outs]), getenv("NOOPT", 0))), nodes


class _Template:
  """A schedule over positions: (kernel tree, output, inputs, info) per item, where a position < 0
  is the -1-i'th buffer the scheduler made itself, remade from `made` = (device, view, dtype)."""
  def __init__(self, items: list, nodes: list[LazyBuffer]):
    position = {lb: i for i, lb in enumerate(nodes)}
    made: dict[LazyBuffer, int] = {}
    def ref(lb: LazyBuffer) -> int:
      if lb in position: return position[lb]
      made.setdefault(lb, len(made))
      return -1 - made[lb]
    self.steps = [(it.ast, ref(it.output), tuple(ref(i) for i in it.inputs), it.info) for it in items]
    self.made = [(lb.device, lb.st, lb.dtype) for lb in made]

  def items(self, nodes: list[LazyBuffer], make: Callable[[KernelNode, LazyBuffer, tuple, tuple], Any]) -> list:
    if self.made:
      # the made buffers go after the nodes, so position -1-i (counted from the end) picks made[i]
      nodes = nodes + [LazyBuffer(device, st, dtype, LoadOps.CONTIGUOUS) for device, st, dtype in reversed(self.made)]
    return [make(ast, nodes[out], tuple([nodes[i] for i in ins]), info) for ast, out, ins, info in self.steps]


_templates: OrderedDict[GraphKey, _Template] = OrderedDict()


def remembered(key: GraphKey, nodes: list[LazyBuffer], make: Callable) -> list | None:
  """The items scheduled before for a graph with this key, over `nodes`; None if there were none."""
  template = _templates.get(key)
  if template is None: return None
  _templates.move_to_end(key)
  return template.items(nodes, make)


def remember(key: GraphKey, nodes: list[LazyBuffer], items: list) -> None:
  _templates[key] = _Template(items, nodes)
  if len(_templates) > MAX_SCHEDULES: _templates.popitem(last=False)
