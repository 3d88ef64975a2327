"""One rank of the MPI tests (test_distributed.py launches it with `mpirun -np 2`): run a scenario, check
its results on this rank, exit non-zero on any mismatch.

in: argv[1], the scenario: collectives | train-mlp | train-cnn | raise | hang
out: exit status 0 when every check passed on this rank; "ok <scenario> rank r" on stdout.
The training scenarios compare K data-parallel steps (each rank on half of each batch, gradients
averaged) with one process training on the whole batch, both computed here, to 1e-5.
"""
from __future__ import annotations
import sys
import time
import numpy as np
from tinychad import Tensor, TinyJit, dtypes, nn
from tinychad import distributed as dist
from tinychad.data import DataLoader, DistributedSampler
from tinychad.nn.optim import SGD, Adam
from tinychad.nn.state import get_state_dict, load_state_dict


def check_collectives(rank: int, world: int) -> None:
  for dtype in (dtypes.float32, dtypes.float64, dtypes.int32):
    x = Tensor(np.arange(6).reshape(2, 3) * (rank + 1), dtype=dtype)
    expected_sum = np.arange(6).reshape(2, 3) * sum(range(1, world + 1))
    out = dist.all_reduce(x, "sum")
    assert out is x and np.array_equal(x.numpy(), expected_sum), (dtype, x.numpy())
    assert np.array_equal(dist.all_reduce(Tensor([rank, -rank], dtype=dtype), "max").numpy(), [world - 1, 0])
    assert np.array_equal(dist.all_reduce(Tensor([rank], dtype=dtype), "min").numpy(), [0])
    y = Tensor(np.full((3,), rank + 7), dtype=dtype)
    assert np.array_equal(dist.broadcast(y, src=1).numpy(), np.full(3, 8)), y.numpy()
    gathered = dist.all_gather(Tensor([[rank, rank * 10]], dtype=dtype))
    assert gathered.shape == (world, 1, 2)
    assert np.array_equal(gathered.numpy(), np.array([[[r, r * 10]] for r in range(world)])), gathered.numpy()
  mean = dist.all_reduce(Tensor([float(rank), 2.0]), "mean")
  assert np.allclose(mean.numpy(), [(world - 1) / 2, 2.0])
  # a view: the reduced values land in the tensor, which now owns them
  base = Tensor(np.arange(8, dtype=np.float32).reshape(2, 4))
  view = base.T
  dist.all_reduce(view)
  assert np.array_equal(view.numpy(), np.arange(8).reshape(2, 4).T * world)
  # differentiable sum: each rank's loss depends on every rank's x
  x = Tensor([1.0 + rank, 2.0], requires_grad=True)
  total = dist.all_reduce_sum(x * x)
  (total * (rank + 1)).sum().backward()
  # d/dx_r of sum over ranks s of (s+1) * sum_ranks(x^2) = 2 x_r * sum_s (s+1)
  assert np.allclose(x.grad.numpy(), 2 * x.numpy() * sum(range(1, world + 1))), x.grad.numpy()
  dist.barrier()


def make_model(kind: str) -> nn.Module:
  Tensor.manual_seed(1234 + dist.rank())       # different on each rank: DDP's broadcast must fix that
  if kind == "mlp": return nn.Sequential(lambda x: x.flatten(1), nn.Linear(64, 32), Tensor.relu, nn.Linear(32, 10))
  # batchnorm in training mode: its batch statistics must cover the whole batch (SyncBatchNorm). The conv has
  # no bias: batchnorm cancels it, so its gradient is rounding noise, which Adam would blow up to full steps
  return nn.Sequential(nn.Conv2d(1, 4, 3, bias=False), nn.BatchNorm2d(4), Tensor.relu, lambda x: x.max_pool2d(2),
                       lambda x: x.flatten(1), nn.Linear(4 * 3 * 3, 10)).train()


def train(model: nn.Module, params: list[Tensor], loader: DataLoader, opt, steps: int, jit: bool, ddp=None) -> list[float]:
  def step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    loss = model(x).cross_entropy(y)
    loss.backward()
    if ddp is not None: ddp.allreduce_gradients()
    opt.step()
    return loss.realize()
  run = TinyJit(step) if jit else step
  losses = []
  for _, (x, y) in zip(range(steps), loader): losses.append(run(x, y).item())
  return losses


def check_training(kind: str, rank: int, world: int) -> None:
  rng = np.random.default_rng(0)
  X = rng.standard_normal((96, 1, 8, 8)).astype(np.float32)
  Y = rng.integers(0, 10, 96).astype(np.int32)
  for jit in (False, True):
    reference = make_model(kind)
    model = make_model(kind)
    if kind == "cnn": model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    ddp = dist.DistributedDataParallel(model, bucket_mb=0.001)     # tiny buckets: several MPI calls per step
    # the reference starts from rank 0's weights too, which the wrapper broadcast
    load_state_dict(reference, {k[len("module."):]: v.numpy() for k, v in get_state_dict(ddp).items()})
    make_opt = (lambda p: SGD(p, lr=0.1, momentum=0.9)) if kind == "mlp" else (lambda p: Adam(p, lr=1e-2))
    shard = DataLoader(X, Y, batch_size=8, sampler=DistributedSampler(len(Y), seed=5))
    # the whole batch i is every rank's batch i, side by side
    shards = [DistributedSampler(len(Y), world, r, seed=5).indices().reshape(-1, 8) for r in range(world)]
    order = np.concatenate(shards, axis=1).reshape(-1)
    whole = DataLoader(X[order], Y[order], batch_size=8 * world)
    steps = 5
    train(ddp, model.parameters(), shard, make_opt(model.parameters()), steps, jit, ddp)
    train(reference, reference.parameters(), whole, make_opt(reference.parameters()), steps, jit)
    mine, theirs = get_state_dict(model), get_state_dict(reference)
    for name in theirs:
      assert np.allclose(mine[name].numpy(), theirs[name].numpy(), atol=1e-5, rtol=1e-5), (kind, jit, name)


def main() -> None:
  scenario = sys.argv[1]
  dist.init(timeout=float(sys.argv[2]) if len(sys.argv) > 2 else None)
  rank, world = dist.rank(), dist.world_size()
  assert world >= 2, "launch with mpirun -np 2"
  if scenario == "collectives": check_collectives(rank, world)
  elif scenario in ("train-mlp", "train-cnn"): check_training(scenario.split("-")[1], rank, world)
  elif scenario == "raise":
    dist.barrier()
    if rank == 1: raise RuntimeError("rank 1 fails on purpose")
    dist.barrier()      # rank 0 waits here; the abort must end it
  elif scenario == "hang":
    if rank == 1: time.sleep(600)
    dist.barrier()      # rank 0 times out here
  print(f"ok {scenario} rank {rank}", flush=True)


if __name__ == "__main__":
  main()
