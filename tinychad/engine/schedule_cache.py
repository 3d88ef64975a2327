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
A big graph's key is a GraphKey, which hashes its entries once. The cache forgets the least recently used
templates by the second-chance (CLOCK) rule: a hit only marks its template used, so the key is hashed once per
lookup, and the oldest templates are visited only when the cache is full.
A template also keeps `launch`, what engine/realize.py prepared to run it again without ScheduleItems
(the kernels loaded, the buffers' sizes); it lives and dies with the template, so it is keyed as the
template is, and dropping the cache (the tests' fixture does) drops it too.
"""
from __future__ import annotations
import contextlib
from collections import OrderedDict
from types import FunctionType
from typing import Any, Callable, Iterator
import numpy as np
from tinychad.helpers import EnvFlags, toposort
from tinychad.lazy import LazyBuffer
from tinychad.ops import KernelNode, LoadOps

MAX_SCHEDULES = 1024     # graph shapes remembered, the least recently used forgotten first
# a graph of more nodes is keyed by a GraphKey (its hash kept); a smaller one (and the one-op graphs, graph_key's
# eager case) by its key tuple itself, whose C-level hash, done once per lookup, costs less
# than GraphKey's Python-level __hash__ and __eq__. Measured: a 3-node key looks up in 0.45 us as a tuple; a
# 30-node one (gelu) in 4.5 us as a tuple, 1.9 us as a GraphKey
SMALL_GRAPH = 8
# NOOPT changes what the scheduler packs, so it is part of every key
_NOOPT = EnvFlags("NOOPT")


class CatsInPlace:
  """Whether the scheduler may have a cat's pieces written straight into the cat's buffer (engine/schedule.py):
  export turns it off while it captures a call, as its programs give every kernel a buffer of its own. Part of
  every key, as NOOPT is."""
  allowed = True

  @classmethod
  @contextlib.contextmanager
  def off(cls) -> Iterator[None]:
    before, cls.allowed = cls.allowed, False
    try:
      yield
    finally:
      cls.allowed = before


def _arg_key(arg: Any) -> Any:
  # most ops (every elementwise one but CAST) have no argument: None keys as itself, as no other argument does
  if arg is None: return None
  kind = type(arg)
  # 0.0 == -0.0 and 1 == 1.0 == True hash alike, yet make different kernels; NaN equals nothing. A float
  # constant (the common argument: every scalar in a step) that is neither zero nor NaN keys as its value
  if kind is float and arg == arg and arg != 0.0: return (float, arg)
  if kind is tuple:
    # most arguments are axes or shapes: plain ints (not bools) key as themselves. A loop, not all() over a
    # generator: a decoding step keys hundreds of these
    for item in arg:
      if type(item) is not int: return tuple([_arg_key(item) for item in arg])
    return arg
  # a subgraph's build function equals nothing but itself; an int or a bool inside a tuple of other things (a
  # subgraph's parameters) keys with its type, as 1 == 1.0 == True. Before the general cases below: a decoding
  # step keys ~40 subgraph arguments, and those cases' isinstance checks made each ~2 us
  if kind is FunctionType: return arg
  if kind is int or kind is bool: return (kind, arg)
  if isinstance(arg, (float, np.floating)): return ("float", float(arg).hex())
  if isinstance(arg, tuple): return tuple([_arg_key(item) for item in arg])
  return (kind.__name__, arg)


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


def _one_op_graph(out: LazyBuffer) -> tuple[tuple | list[tuple], list[LazyBuffer]] | None:
  """graph_key's entries and nodes for the eager case, one op whose sources are leaves or views of leaves (a
  computed buffer, a constant), in one pass instead of the generic walk: the same entries and nodes in the same
  order (test_schedule_cache checks it); None for any other graph."""
  if out._base is not None or out.realized is not None: return None
  srcs, arg = out.srcs, out.arg
  tail = (out.op, arg if arg is None else _arg_key(arg), out.dtype, out.device, out.shape)
  # the commonest of them, an op reading one or two different computed buffers whole (a.exp(), a + b), in a
  # few lines: the walk below costs a third of an eager op's realize
  first, last = (srcs[0], srcs[-1]) if srcs else (out, out)
  if first._base is None and last._base is None and first.realized is not None and last.realized is not None:
    if len(srcs) == 1: return ((first.device, first.dtype, first.shape), tail + ((0,),)), [first, out]
    if len(srcs) == 2 and first is not last:
      entries = ((first.device, first.dtype, first.shape), (last.device, last.dtype, last.shape), tail + ((0, 1),))
      return entries, [first, last, out]
  nodes, entries, position = [], [], {}
  for src in srcs:
    if src in position: continue
    base = src._base
    leaf = src if base is None else base
    if leaf not in position:
      if leaf.realized is not None: entries.append((leaf.device, leaf.dtype, leaf.shape))
      elif leaf.srcs: return None
      else: entries.append((leaf.op, _arg_key(leaf.arg), leaf.dtype, leaf.device, leaf.shape, ()))
      position[leaf] = len(nodes)
      nodes.append(leaf)
    if base is not None:
      entries.append((src.st, position[base]))
      position[src] = len(nodes)
      nodes.append(src)
  entries.append(tail + (tuple(map(position.__getitem__, srcs)),))
  nodes.append(out)
  return entries, nodes


def graph_key(outs: list[LazyBuffer]) -> tuple[GraphKey | tuple, list[LazyBuffer]]:
  """(key, nodes): the key of the graph under `outs`, and its LazyBuffers in key order (sources first)."""
  one_op = _one_op_graph(outs[0]) if len(outs) == 1 else None
  if one_op is not None:
    entries, nodes = one_op
    return (tuple(entries), (len(nodes) - 1,), _NOOPT.any(), CatsInPlace.allowed), nodes
  nodes = toposort(outs, _key_sources)
  position = dict(zip(nodes, range(len(nodes))))
  at = position.__getitem__
  entries = []
  for lb in nodes:
    base = lb._base
    if base is not None: entries.append((lb.st, position[base]))
    elif lb.realized is not None: entries.append((lb.device, lb.dtype, lb.shape))
    else:
      arg = lb.arg
      entries.append((lb.op, arg if arg is None else _arg_key(arg), lb.dtype, lb.device, lb.shape, tuple(map(at, lb.srcs))))
  key = (tuple(entries), tuple([position[out] for out in outs]), _NOOPT.any(), CatsInPlace.allowed)
  return (GraphKey(key) if len(entries) > SMALL_GRAPH else key), nodes


class Template:
  """A schedule over positions: (kernel tree, output, inputs, info, into) per item, where a position < 0
  is the -1-i'th buffer the scheduler made itself, remade from `made` = (device, view, dtype), and `into` is
  None or (the cat's position, element offset) for a piece written into its cat's buffer.
  `launch` is None until realize prepares one (engine/realize.py: Launch)."""
  def __init__(self, items: list, nodes: list[LazyBuffer]):
    self.launch: Any = None
    self.used = False       # looked up since the cache last passed it over (remember's second chance)
    position = {lb: i for i, lb in enumerate(nodes)}
    made: dict[LazyBuffer, int] = {}
    def ref(lb: LazyBuffer) -> int:
      if lb in position: return position[lb]
      made.setdefault(lb, len(made))
      return -1 - made[lb]
    self.steps = [(it.ast, ref(it.output), tuple(ref(i) for i in it.inputs), it.info,
                   None if it.into is None else (ref(it.into[0]), it.into[1])) for it in items]
    self.made = [(lb.device, lb.st, lb.dtype) for lb in made]

  def items(self, nodes: list[LazyBuffer], make: Callable[[KernelNode, LazyBuffer, tuple, tuple, Any], Any]) -> list:
    if self.made:
      # the made buffers go after the nodes, so position -1-i (counted from the end) picks made[i]
      nodes = nodes + [LazyBuffer(device, st, dtype, LoadOps.CONTIGUOUS) for device, st, dtype in reversed(self.made)]
    return [make(ast, nodes[out], tuple([nodes[i] for i in ins]), info,
                 None if into is None else (nodes[into[0]], into[1])) for ast, out, ins, info, into in self.steps]


_templates: OrderedDict[GraphKey | tuple, Template] = OrderedDict()


def lookup(key: GraphKey | tuple) -> Template | None:
  """The template of the graphs with this key, if one was scheduled (and not forgotten since)."""
  template = _templates.get(key)
  if template is not None: template.used = True
  return template


def remember(key: GraphKey | tuple, nodes: list[LazyBuffer], items: list) -> Template:
  template = _templates[key] = Template(items, nodes)
  while len(_templates) > MAX_SCHEDULES:
    # the oldest template goes unless it was used since it was last here: then it gets a second chance, at the end
    oldest_key, oldest = next(iter(_templates.items()))
    if oldest.used:
      oldest.used = False
      _templates.move_to_end(oldest_key)
    else: del _templates[oldest_key]
  return template
