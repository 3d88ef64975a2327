"""The numpy reference device: runs a kernel tree by evaluating it with numpy.

in: a kernel tree and its Buffers  ->  out: the output buffer filled.
Loads are zero-copy strided views where one view suffices (masks become zero padding); stacked
views fall back to index arrays. This device is the oracle the compiled devices are tested against,
so it follows C semantics exactly (truncating integer division, fmod remainder): each op's numpy
implementation is in the op table (ops.OP_INFO), and CAST and BITCAST, which need the target dtype, are here.
"""
from __future__ import annotations
import numpy as np
from tinychad.dtype import dtypes
from tinychad.ops import OP_INFO, UnaryOps, ReduceOps, BufferOps, LoadOps, KernelNode
from tinychad.view import read_view


def evaluate(node: KernelNode, bufs: list[np.ndarray], cache: dict) -> np.ndarray:
  if id(node) in cache: return cache[id(node)]
  op = node.op
  if op is BufferOps.LOAD:
    out = read_view(bufs[node.arg[0]], node.arg[1], node.dtype)
  elif op is BufferOps.GATHER:
    number, row0, row_stride, rows = node.arg
    index = np.broadcast_to(evaluate(node.srcs[0], bufs, cache), row0.shape).astype(np.int64)
    table = bufs[number]
    # where row 0's elements are, as positions in the table, then moved down to the picked row
    positions = read_view(np.arange(table.size), row0, dtypes.int64) + index * row_stride
    inside = (index >= 0) & (index < rows)
    out = np.where(inside, table[np.where(inside, positions, 0)], np.zeros((), table.dtype)).astype(node.dtype.np, copy=False)
  elif op is BufferOps.CONST:
    out = read_view(np.array([node.arg[0]], dtype=node.dtype.np), node.arg[1], node.dtype)
  elif isinstance(op, ReduceOps):
    src = evaluate(node.srcs[0], bufs, cache)
    src = np.broadcast_to(src, node.arg[1])
    info = OP_INFO[op]
    out = info.numpy(src, axis=node.arg[0], keepdims=True, initial=info.identity(node.dtype))
    out = out.astype(node.dtype.np, copy=False)
  elif op is UnaryOps.CAST:
    out = evaluate(node.srcs[0], bufs, cache).astype(node.dtype.np)
  elif op is UnaryOps.BITCAST:
    out = np.ascontiguousarray(evaluate(node.srcs[0], bufs, cache)).view(node.dtype.np)
  else:
    srcs = [evaluate(s, bufs, cache) for s in node.srcs]
    out = np.asarray(OP_INFO[op].numpy(*srcs)).astype(node.dtype.np, copy=False)
  cache[id(node)] = out
  return out


def scatter_add(node: KernelNode, table: np.ndarray, rows: np.ndarray, indices: np.ndarray) -> None:
  """table[r] = the sum of rows[i] over every i with indices[i] == r (see LoadOps.SCATTER_ADD)."""
  count, width = node.arg[1], node.arg[2]
  table[:] = 0
  inside = (indices >= 0) & (indices < node.arg[0])
  np.add.at(table.reshape(-1, width), indices[inside].astype(np.int64), rows.reshape(count, width)[inside])


class NumpyDevice:
  """Needs no compiler: its program is the kernel tree itself, interpreted on every run."""
  renderer = None

  def __init__(self, name: str):
    self.name = name
    self.programs: dict = {}      # (kernel tree, kernel name) -> the kernel tree

  @staticmethod
  def available() -> bool: return True

  @staticmethod
  def run(store: KernelNode, bufs, points: int) -> None:
    arrays = [b.as_numpy() for b in bufs]
    if store.op is LoadOps.SCATTER_ADD:
      scatter_add(store, *arrays)
      return
    with np.errstate(all="ignore"):
      result = evaluate(store.srcs[0], arrays, {})
    out_shape = store.arg[1].shape
    arrays[0][:] = np.broadcast_to(result, out_shape).reshape(-1)


def device_class(): return NumpyDevice
