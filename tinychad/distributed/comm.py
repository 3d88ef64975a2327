"""MPI collectives on tinychad tensors: the processes of one job, and what they exchange.

in: tensors on each rank (a process that `mpirun` started)  ->  out: the same tensors on every rank, summed,
averaged, maxed, broadcast or gathered, in place where the tensor owns its host buffer (no copy) and returned.
MPI is reached through mpi4py, loaded only when a launcher started this process: a plain `python script.py`
is a world of one, where every collective returns its argument unchanged and nothing MPI is imported.
Every collective is non-blocking underneath (Iallreduce, Ibcast, ...) and waited for with a deadline
(`init(timeout=)`, default 300 s or $TINYCHAD_DIST_TIMEOUT), so a rank that died or hangs makes the
others raise DistributedTimeout instead of waiting forever; and an uncaught exception on any rank calls
MPI_Abort, which stops the whole job at once (mpirun exits non-zero).
Each collective runs as a host step (engine/realize.py's run_on_host), so a TinyJit replay of a training
step exchanges that step's new values. `all_reduce_sum` is differentiable (its backward all-reduces the
gradient), for statistics computed over the whole job's batch (SyncBatchNorm).
"""
from __future__ import annotations
import os
import sys
import time
import traceback
from typing import Any
import numpy as np
from tinychad.device import Buffer
from tinychad.engine.realize import realize, run_on_host
from tinychad.function import Function
from tinychad.lazy import LazyBuffer
from tinychad.tensor import Tensor
from tinychad.view import ShapeTracker
from tinychad.ops import LoadOps

# the environment variables the MPI launchers (Open MPI, MPICH/Hydra, PMIx) set in each process they start
LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")
DEFAULT_TIMEOUT_S = 300.0


class DistributedTimeout(RuntimeError):
  """A collective got no answer from the other ranks in time (one died, hangs, or skipped the call)."""


class _World:
  """This process's place in the job: the mpi4py communicator (None in a world of one) and the deadline."""
  comm: Any = None
  MPI: Any = None
  timeout_s: float = DEFAULT_TIMEOUT_S
  started = False


def launched() -> bool:
  """Whether an MPI launcher started this process."""
  return any(name in os.environ for name in LAUNCHER_VARIABLES)


def init(timeout: float | None = None) -> None:
  """Join the job the launcher started (idempotent). Also sets THREADS, when unset, to this machine's cores
  shared among its ranks, so that two ranks on two cores don't fight over both."""
  if timeout is not None: _World.timeout_s = float(timeout)
  elif "TINYCHAD_DIST_TIMEOUT" in os.environ: _World.timeout_s = float(os.environ["TINYCHAD_DIST_TIMEOUT"])
  if _World.started: return
  _World.started = True
  if not launched(): return
  try:
    from mpi4py import MPI
  except ImportError as error:
    raise RuntimeError("tinychad.distributed: started by an MPI launcher, but mpi4py is not installed "
                       "(pip install 'tinychad[distributed]')") from error
  _World.MPI, _World.comm = MPI, MPI.COMM_WORLD
  local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", os.environ.get("MPI_LOCALNRANKS", _World.comm.Get_size())))
  os.environ.setdefault("THREADS", str(max(1, (os.cpu_count() or 1) // max(local, 1))))
  if _World.comm.Get_size() > 1: sys.excepthook = _abort_on_exception


def _abort_on_exception(kind, value, tb) -> None:
  """An uncaught exception on one rank would leave the others blocked in their next collective: print it,
  then MPI_Abort ends every rank of the job."""
  sys.stderr.write(f"tinychad.distributed: rank {rank()} of {world_size()} failed, aborting the job:\n")
  traceback.print_exception(kind, value, tb)
  sys.stderr.flush()
  _World.comm.Abort(1)


def rank() -> int:
  """This process's number in the job, 0 .. world_size() - 1 (0 in a world of one)."""
  init()
  return _World.comm.Get_rank() if _World.comm is not None else 0


def world_size() -> int:
  """How many processes the job has (1 without a launcher)."""
  init()
  return _World.comm.Get_size() if _World.comm is not None else 1


def is_main() -> bool:
  """Rank 0: the one that prints progress and writes checkpoints."""
  return rank() == 0


def wait(request, what: str) -> None:
  """Wait for a non-blocking MPI request, raising DistributedTimeout past the deadline. The pause between
  polls grows to 1 ms, so a quick collective costs microseconds and a slow one no busy core."""
  deadline, pause = time.monotonic() + _World.timeout_s, 0.0
  while not request.Test():
    if time.monotonic() > deadline:
      raise DistributedTimeout(f"{what} on rank {rank()}: no answer from the other {world_size() - 1} rank(s) "
                               f"after {_World.timeout_s:.0f} s (a rank died, hangs, or never called it)")
    time.sleep(pause)
    pause = min(pause * 2 or 1e-5, 1e-3)


REDUCE_OPS = ("sum", "mean", "max", "min")


def reduce_op(op: str):
  """The MPI op for a reduction name (mean is a sum, divided afterwards)."""
  if op not in REDUCE_OPS: raise ValueError(f"all_reduce: op must be one of {REDUCE_OPS}, got {op!r}")
  MPI = _World.MPI
  return {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]


def all_reduce_numpy(array: np.ndarray, op: str = "sum") -> None:
  """Reduce a contiguous host array over all ranks, in place (MPI_IN_PLACE: no copy)."""
  if op == "mean" and not np.issubdtype(array.dtype, np.floating):
    raise TypeError(f"all_reduce: op='mean' needs a float tensor, got {array.dtype}")
  wait(start_all_reduce(array, op), f"all_reduce({op}) of {array.nbytes} bytes")
  if op == "mean": array /= world_size()


def start_all_reduce(array: np.ndarray, op: str = "sum"):
  """Start reducing a contiguous host array over all ranks in place; wait() on the request it returns ("mean"
  is a sum here: the caller divides)."""
  return _World.comm.Iallreduce(_World.MPI.IN_PLACE, array, op=reduce_op(op))


def owner(tensor: Tensor) -> Tensor:
  """A tensor that will hold `tensor`'s values in a contiguous host buffer of its own once realized: the
  tensor itself when it is one (the common case: a parameter, a gradient), else a contiguous copy."""
  lazy = tensor.lazydata
  return tensor if lazy.base is lazy and lazy.op is not LoadOps.CONST else tensor.contiguous()


def host_buffer(holder: Tensor) -> Buffer:
  """The buffer of a realized owner()."""
  return holder.lazydata.base.realized


def _in_place(tensor: Tensor, name: str, fn) -> Tensor:
  """Run fn on the host buffer of tensor's values, as a host step; write the result back into tensor."""
  holder = owner(tensor).realize()
  run_on_host(name, fn, [host_buffer(holder)])
  if holder is not tensor: tensor.assign(holder.detach())
  return tensor


def all_reduce(tensor: Tensor, op: str = "sum") -> Tensor:
  """Every rank's `tensor` combined elementwise by op ("sum", "mean", "max", "min"): written into `tensor`
  (as torch.distributed.all_reduce) and returned. Not differentiable: see all_reduce_sum."""
  if op not in REDUCE_OPS: raise ValueError(f"all_reduce: op must be one of {REDUCE_OPS}, got {op!r}")
  if world_size() == 1: return tensor
  return _in_place(tensor, f"all_reduce_{op}", lambda bufs: all_reduce_numpy(bufs[0].as_numpy(), op))


def broadcast(tensor: Tensor, src: int = 0) -> Tensor:
  """Rank src's `tensor` on every rank: written into `tensor` and returned."""
  if not 0 <= src < world_size(): raise ValueError(f"broadcast: src {src} is not a rank of a world of {world_size()}")
  if world_size() == 1: return tensor
  def fn(bufs: list[Buffer]) -> None:
    array = bufs[0].as_numpy()
    wait(_World.comm.Ibcast(array, root=src), f"broadcast of {array.nbytes} bytes from rank {src}")
  return _in_place(tensor, "broadcast", fn)


def all_gather(tensor: Tensor) -> Tensor:
  """Every rank's `tensor`, stacked along a new first dim in rank order: shape (world_size, *tensor.shape).
  Every rank must pass the same shape and dtype."""
  if world_size() == 1: return tensor.unsqueeze(0)
  buf = host_buffer(owner(tensor).realize())
  out = Buffer(buf.device, buf.size * world_size(), buf.dtype).allocate()
  def fn(bufs: list[Buffer]) -> None:
    source, target = bufs[1].as_numpy(), bufs[0].as_numpy()
    wait(_World.comm.Iallgather(source, target), f"all_gather of {source.nbytes} bytes")
  run_on_host("all_gather", fn, [out, buf])
  return Tensor.from_lazy(_realized(out, (world_size(),) + tuple(tensor.shape)), False)


def barrier() -> None:
  """Wait until every rank gets here."""
  if world_size() > 1: wait(_World.comm.Ibarrier(), "barrier")


def _realized(buf: Buffer, shape: tuple[int, ...]) -> LazyBuffer:
  """A computed LazyBuffer over `buf`, seen with `shape`."""
  lazy = LazyBuffer(buf.device, ShapeTracker.from_shape(shape), buf.dtype, LoadOps.FROM_NUMPY)
  lazy.realized = buf
  return lazy


def _sum_over_ranks(x: LazyBuffer) -> LazyBuffer:
  """x summed over all ranks, into a new buffer (x is left as it is)."""
  x = x.contiguous()
  realize([x])
  source = x.base.realized
  out = Buffer(source.device, source.size, source.dtype).allocate()
  def fn(bufs: list[Buffer]) -> None:
    target = bufs[0].as_numpy()
    target[:] = bufs[1].as_numpy()
    all_reduce_numpy(target, "sum")
  run_on_host("all_reduce_sum", fn, [out, source])
  return _realized(out, x.shape)


class AllReduceSum(Function):
  """y = sum over ranks of x. Each rank's loss depends on every rank's x through y, so the gradient of x
  is the sum over ranks of the gradients that reached y: the backward is the same all-reduce."""
  def forward(self, x: LazyBuffer) -> LazyBuffer: return _sum_over_ranks(x)
  def backward(self, grad: LazyBuffer) -> LazyBuffer: return _sum_over_ranks(grad)


def all_reduce_sum(tensor: Tensor) -> Tensor:
  """A new tensor: the sum of `tensor` over all ranks, with a gradient (it is `tensor` in a world of one)."""
  return tensor if world_size() == 1 else AllReduceSum.apply(tensor)
