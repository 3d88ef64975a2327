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


def attention(node: KernelNode, out: np.ndarray, *inputs: np.ndarray) -> None:
  """A flash-attention kernel (see ops.AttentionArg for its buffers), computed per head with whole score matrices:
  the reference the compiled kernels are tested against, not a memory-frugal one."""
  a = node.arg
  B, H, Hk, L, S, D, E, W = a.batch, a.heads, a.kv_heads, a.length, a.source, a.dim, a.vdim, a.block
  S_p, L_p, group = -(-S // W) * W, -(-L // W) * W, H // Hk
  names = {"forward": ("q", "kT", "v"), "dq": ("q", "kT", "k", "vT", "do", "lse2", "delta"),
           "dkv": ("k", "v", "qT", "q", "doT", "do", "lse2", "delta")}[a.mode if a.mode != "dmask" else "dq"]
  bufs = dict(zip(names + ("mask",), inputs))
  if a.mode == "dkv":
    q = bufs["q"].reshape(B, H, L_p, D)[:, :, :L]
    k, v = bufs["k"].reshape(B, Hk, S, D), bufs["v"].reshape(B, Hk, S, E)
  else:
    q = bufs["q"].reshape(B, H, L, D)
    k = bufs["kT"].reshape(B, Hk, D, S_p)[..., :S].transpose(0, 1, 3, 2)
  k = np.repeat(k, group, axis=1)
  visible = np.ones((L, S), dtype=bool)
  i, j = np.arange(L)[:, None], np.arange(S)[None, :]
  if a.causal or a.window: visible &= j <= i
  if a.window: visible &= j > i - a.window
  scores = np.einsum("bhld,bhsd->bhls", q, k) * (a.scale / np.log(2))
  if a.mask:
    mb, mh, mr, ml = a.mask_strides
    rows, lanes = (S, L) if a.mode == "dkv" else (L, S)
    at = (np.arange(B)[:, None, None, None] * mb + np.arange(H)[None, :, None, None] * mh +
          np.arange(rows)[None, None, :, None] * mr + np.arange(lanes)[None, None, None, :] * ml)
    mask = bufs["mask"][at]
    if a.mode == "dkv": mask = mask.transpose(0, 1, 3, 2)
    if a.mask == "bool": visible = visible & mask
    else: scores = scores + mask / np.log(2)
  scores = np.where(visible, scores, -np.inf)
  with np.errstate(all="ignore"):
    if a.mode == "forward":
      top = scores.max(-1, keepdims=True)
      p = np.exp2(scores - np.where(top == -np.inf, 0, top))
      total = p.sum(-1, keepdims=True)
      v = np.repeat(bufs["v"].reshape(B, Hk, S_p, E)[:, :, :S], group, 1)
      o = np.einsum("bhls,bhse->bhle", np.where(total == 0, 0, p / total), v)
      lse2 = np.where(total == 0, np.inf, top + np.log2(total))[..., 0]
      out[:] = np.concatenate([o.reshape(-1), lse2.reshape(-1)])
      return
    lse2, delta = bufs["lse2"].reshape(B, H, L_p)[..., :L, None], bufs["delta"].reshape(B, H, L_p)[..., :L, None]
    p = np.exp2(scores - lse2)
    if a.mode == "dkv": do = bufs["do"].reshape(B, H, L_p, E)[:, :, :L]
    else: do = bufs["do"].reshape(B, H, L, E)
    v = np.repeat(bufs["v"].reshape(B, Hk, S, E) if a.mode == "dkv" else
                  bufs["vT"].reshape(B, Hk, E, S_p)[..., :S].transpose(0, 1, 3, 2), group, axis=1)
    ds = p * (np.einsum("bhle,bhse->bhls", do, v) - delta)
  if a.mode == "dmask": out[:] = np.pad(ds, ((0, 0), (0, 0), (0, 0), (0, S_p - S))).reshape(-1)
  elif a.mode == "dq": out[:] = (np.einsum("bhls,bhsd->bhld", ds, k) * a.scale).reshape(-1)
  else:
    dk = np.einsum("bhls,bhld->bhsd", ds, q).reshape(B, Hk, group, S, D).sum(2) * a.scale
    dv = np.einsum("bhls,bhle->bhse", p, do).reshape(B, Hk, group, S, E).sum(2)
    out[:] = np.concatenate([dk.reshape(-1), dv.reshape(-1)])


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
    if store.op is LoadOps.ATTENTION:
      attention(store, *arrays)
      return
    with np.errstate(all="ignore"):
      result = evaluate(store.srcs[0], arrays, {})
    out_shape = store.arg[1].shape
    arrays[0][:] = np.broadcast_to(result, out_shape).reshape(-1)


def device_class(): return NumpyDevice
