"""Data parallelism: every rank trains the same model on its own share of each batch.

in: a model (or its parameters) on each rank, gradients from each rank's backward pass
out: the same weights everywhere at the start (broadcast from rank 0) and, before each optimizer step,
every gradient averaged over the ranks, so every rank takes the same step: the result of one process
training on the whole batch (each rank's loss being a mean over its share).
Gradients travel in buckets of about `bucket_mb` MB (one MPI call per bucket, not per tensor), last
layers first: a bucket is computed (realized), its all-reduce started (non-blocking), and the next bucket's
part of the backward pass computed while it travels; the averages are written back once all arrived.
Under TinyJit the bucket starts and finishes are host steps, so a replayed step does the same.
"""
from __future__ import annotations
from typing import Iterable
import numpy as np
from tinychad.device import Buffer
from tinychad.distributed import comm
from tinychad.engine.realize import run_on_host
from tinychad.nn.module import Module
from tinychad.tensor import Tensor


def broadcast_parameters(tensors: Iterable[Tensor], src: int = 0) -> None:
  """Overwrite each tensor with rank src's value (initial weights, buffers)."""
  for tensor in tensors: comm.broadcast(tensor, src)


class _Bucket:
  """Gradients packed into one flat array for one MPI call; the request lives here between start and finish."""
  def __init__(self, buffers: list[Buffer]):
    self.sizes = [b.size for b in buffers]
    self.flat = np.empty(sum(self.sizes), dtype=buffers[0].dtype.np)
    self.request = None

  def start(self, bufs: list[Buffer]) -> None:
    np.concatenate([b.as_numpy() for b in bufs], out=self.flat)
    self.request = comm.start_all_reduce(self.flat)

  def finish(self, bufs: list[Buffer]) -> None:
    comm.wait(self.request, f"gradient all-reduce of {self.flat.nbytes} bytes")
    self.request = None
    self.flat /= comm.world_size()
    offset = 0
    for buf, size in zip(bufs, self.sizes):
      buf.as_numpy()[:] = self.flat[offset:offset + size]
      offset += size


def _buckets(params: list[Tensor], bucket_bytes: int) -> list[list[Tensor]]:
  """Parameters with gradients, last first (the backward pass reaches them first), grouped by dtype into
  runs of about bucket_bytes."""
  buckets: list[list[Tensor]] = []
  size = 0
  for p in reversed(params):
    if p.grad is None: continue
    nbytes = p.grad.numel() * p.grad.dtype.itemsize
    if not buckets or size + nbytes > bucket_bytes or buckets[-1][0].grad.dtype != p.grad.dtype:
      buckets.append([])
      size = 0
    buckets[-1].append(p)
    size += nbytes
  return buckets


def allreduce_gradients(params: Iterable[Tensor], bucket_mb: float = 4.0) -> None:
  """Average every parameter's .grad over the ranks, in place (a no-op in a world of one). Call it between
  loss.backward() and optimizer.step(), on every rank, with the parameters in the same order."""
  if comm.world_size() == 1: return
  pending: list[tuple[_Bucket, list[Buffer]]] = []
  for group in _buckets(list(params), int(bucket_mb * 2**20)):
    holders = [comm.owner(p.grad) for p in group]
    Tensor.realize(*holders)      # this bucket's part of the backward pass, while the last bucket travels
    for p, holder in zip(group, holders): p.grad = holder
    buffers = [comm.host_buffer(h) for h in holders]
    bucket = _Bucket(buffers)
    run_on_host("grad_bucket_start", bucket.start, buffers)
    pending.append((bucket, buffers))
  for bucket, buffers in pending: run_on_host("grad_bucket_finish", bucket.finish, buffers)


class DistributedDataParallel(Module):
  """PyTorch's DDP, on MPI: wraps a model, broadcasts its parameters and buffers from rank 0 when made, and
  calls like the model. Average the gradients with `ddp.allreduce_gradients()` after backward (PyTorch
  does it from hooks inside backward; tinychad's backward is lazy, so the call marks where it happens)."""
  def __init__(self, module: Module, bucket_mb: float = 4.0):
    comm.init()
    self.module, self.bucket_mb = module, bucket_mb
    broadcast_parameters(module.parameters())
    broadcast_parameters([b for _, b in module.named_buffers()])

  def forward(self, *args, **kwargs): return self.module(*args, **kwargs)

  def allreduce_gradients(self) -> None:
    allreduce_gradients(self.module.parameters(), self.bucket_mb)
