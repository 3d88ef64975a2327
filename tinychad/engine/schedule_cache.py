"""Remembering schedules: a model records the same graph at every step, so it is scheduled once.

in: the LazyBuffers to realize
out: a key for the shape of their graph, and for a key seen before the kernels scheduled then, over
     this graph's buffers.
The key lists every LazyBuffer reachable from the outputs (down to realized bases), in first-visit
order, as what the scheduler reads of it: a view is its ShapeTracker and its base's position; a
realized base its device, dtype and shape; any other base its op, argument, dtype, device, shape and
its sources' positions. Which buffers are shared, and which are the outputs, are in the positions.
Two graphs with equal keys differ only in which buffers they hold, so the scheduler's fusion choices
and kernel trees are the same: a ScheduleItem is kept as its kernel tree and the positions of its
output and inputs. Buffers the scheduler made itself (packed panels) are made anew each time.
"""
from __future__ import annotations
from collections import OrderedDict
from typing import Any, Callable
import numpy as np
from tinychad.helpers import getenv
from tinychad.lazy import LazyBuffer
from tinychad.ops import KernelNode, LoadOps

MAX_SCHEDULES = 1024     # graph shapes remembered, least recently used forgotten first


def _arg_key(arg: Any) -> Any:
  # 0.0 == -0.0 and 1 == 1.0 == True hash alike, yet make different kernels; NaN equals nothing
  if isinstance(arg, (float, np.floating)): return ("float", float(arg).hex())
  if isinstance(arg, tuple):
    # most arguments are axes or shapes: plain ints (not bools) key as themselves
    if all(type(a) is int for a in arg): return arg
    return tuple(_arg_key(a) for a in arg)
  return (type(arg).__name__, arg)


def graph_key(outs: list[LazyBuffer]) -> tuple[tuple, list[LazyBuffer]]:
  """(key, nodes): the key of the graph under `outs`, and its LazyBuffers in key order."""
  position: dict[LazyBuffer, int] = {}
  nodes: list[LazyBuffer] = []
  entries: list[tuple] = []
  # depth first, sources before their users; a graph a few thousand ops deep must not recurse. A
  # buffer stays on the stack until its sources have positions, then takes the next one.
  stack = list(reversed(outs))
  while stack:
    lb = stack[-1]
    if lb in position:
      stack.pop()
      continue
    base = lb._base
    sources = (base,) if base is not None else lb.srcs if lb.realized is None else ()
    ready = True
    for src in reversed(sources):
      if src not in position:
        stack.append(src)
        ready = False
    if not ready: continue
    stack.pop()
    if base is not None: entry: tuple = (lb.st, position[base])
    elif lb.realized is not None: entry = (lb.device, lb.dtype, lb.shape)
    else: entry = (lb.op, _arg_key(lb.arg), lb.dtype, lb.device, lb.shape, tuple(map(position.__getitem__, sources)))
    position[lb] = len(nodes)
    nodes.append(lb)
    entries.append(entry)
  # NOOPT changes what the scheduler packs
  return (tuple(entries), tuple(position[out] for out in outs), getenv("NOOPT", 0)), nodes


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
    made = [LazyBuffer(device, st, dtype, LoadOps.CONTIGUOUS) for device, st, dtype in self.made]
    def pick(ref: int) -> LazyBuffer: return nodes[ref] if ref >= 0 else made[-1 - ref]
    return [make(ast, pick(out), tuple(pick(i) for i in ins), info) for ast, out, ins, info in self.steps]


_templates: OrderedDict[tuple, _Template] = OrderedDict()


def remembered(key: tuple, nodes: list[LazyBuffer], make: Callable) -> list | None:
  """The items scheduled before for a graph with this key, over `nodes`; None if there were none."""
  template = _templates.get(key)
  if template is None: return None
  _templates.move_to_end(key)
  return template.items(nodes, make)


def remember(key: tuple, nodes: list[LazyBuffer], items: list) -> None:
  _templates[key] = _Template(items, nodes)
  if len(_templates) > MAX_SCHEDULES: _templates.popitem(last=False)
