"""Data-parallel training speed: 1 process x 2 threads against 2 MPI processes x 1 thread, beside PyTorch DDP.

Model: bench/cnn_train.py's CNN (conv5x5 1->32, relu, maxpool, conv5x5 32->64, relu, maxpool, linear 1024->10),
global batch 128 of 28x28 images, Adam; each of 2 ranks takes 64 and the gradients are averaged.
Rows, all measured in one run: images/s of the training step (median over timed steps after warm-up) and the
all-reduce time per step (one all-reduce of the model's gradient bytes, median).
  tinychad  1 process, THREADS=2, TinyJit step
  tinychad  mpirun -np 2, THREADS=1 each, TinyJit step with tinychad.distributed's bucketed all-reduce
  torch     1 process, 2 threads
  torch     2 processes x 1 thread, DistributedDataParallel (gloo over loopback)
Then a sweep of all-reduce sizes (2 ranks, loopback), from which docs/distributed.md's cost model takes
its latency and bandwidth.
  python bench/distributed.py [--steps N]
"""
from __future__ import annotations
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GLOBAL_BATCH = 128


def tinychad_worker(steps: int) -> dict:
  import numpy as np
  from tinychad import Tensor, TinyJit, nn
  from tinychad import distributed as dist
  from tinychad.nn.optim import Adam
  dist.init()
  world, batch = dist.world_size(), GLOBAL_BATCH // dist.world_size()
  model = nn.Sequential(nn.Conv2d(1, 32, 5), Tensor.relu, lambda x: x.max_pool2d(2), nn.Conv2d(32, 64, 5), Tensor.relu,
                        lambda x: x.max_pool2d(2), lambda x: x.flatten(1), nn.Linear(1024, 10))
  ddp = dist.DistributedDataParallel(model)
  opt = Adam(model.parameters(), lr=1e-3)

  @TinyJit
  def train_step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    loss = ddp(x).cross_entropy(y)
    loss.backward()
    ddp.allreduce_gradients()
    opt.step()
    return loss.realize()

  rng = np.random.default_rng(dist.rank())
  x = Tensor(rng.standard_normal((batch, 1, 28, 28)).astype(np.float32))
  y = Tensor(rng.integers(0, 10, batch).astype(np.int32))
  times = []
  for i in range(steps + 3):
    dist.barrier()
    start = time.perf_counter()
    train_step(x, y).item()
    if i >= 3: times.append(time.perf_counter() - start)
  grad_bytes = sum(p.numel() for p in model.parameters()) * 4
  flat = Tensor.zeros(grad_bytes // 4).contiguous().realize()
  reduce_times = []
  for _ in range(20):
    dist.barrier()
    start = time.perf_counter()
    dist.all_reduce(flat)
    reduce_times.append(time.perf_counter() - start)
  return {"step_s": statistics.median(times), "allreduce_s": statistics.median(reduce_times) if world > 1 else 0.0,
          "grad_bytes": grad_bytes}


SWEEP_BYTES = [2**k for k in range(3, 27, 2)]     # 8 B .. 32 MiB


def sweep_worker() -> dict:
  """Median seconds of an all-reduce (sum, float32) of each size in SWEEP_BYTES."""
  from tinychad import Tensor
  from tinychad import distributed as dist
  dist.init()
  seconds = {}
  for nbytes in SWEEP_BYTES:
    flat = Tensor.zeros(nbytes // 4).contiguous().realize()
    times = []
    for _ in range(max(5, min(50, 2**24 // nbytes))):
      dist.barrier()
      start = time.perf_counter()
      dist.all_reduce(flat)
      times.append(time.perf_counter() - start)
    seconds[str(nbytes)] = statistics.median(times)
  return {"sweep": seconds}


def torch_worker(steps: int) -> dict:
  import torch
  import torch.distributed as tdist
  world = int(os.environ.get("WORLD_SIZE", "1"))
  rank = int(os.environ.get("RANK", "0"))
  if world > 1: tdist.init_process_group("gloo", rank=rank, world_size=world)
  torch.manual_seed(0)
  model = torch.nn.Sequential(torch.nn.Conv2d(1, 32, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Conv2d(32, 64, 5),
                              torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(1024, 10))
  if world > 1: model = torch.nn.parallel.DistributedDataParallel(model)
  opt = torch.optim.Adam(model.parameters(), lr=1e-3)
  batch = GLOBAL_BATCH // world
  x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
  times = []
  for i in range(steps + 3):
    if world > 1: tdist.barrier()
    start = time.perf_counter()
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    loss.item()
    if i >= 3: times.append(time.perf_counter() - start)
  grad_bytes = sum(p.numel() for p in model.parameters()) * 4
  reduce_times = []
  if world > 1:
    flat = torch.zeros(grad_bytes // 4)
    for _ in range(20):
      tdist.barrier()
      start = time.perf_counter()
      tdist.all_reduce(flat)
      reduce_times.append(time.perf_counter() - start)
    tdist.destroy_process_group()
  return {"step_s": statistics.median(times), "allreduce_s": statistics.median(reduce_times) if reduce_times else 0.0,
          "grad_bytes": grad_bytes}


def _bench_lines(output: str) -> list[dict]:
  return [json.loads(line[len("BENCH "):]) for line in output.splitlines() if line.startswith("BENCH ")]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run(kind: str, processes: int, steps: int) -> dict:
  """One configuration, in fresh processes; rank 0's measurement."""
  threads = "2" if processes == 1 else "1"
  env = {**os.environ, "PYTHONPATH": str(ROOT), "THREADS": threads, "OMP_NUM_THREADS": threads}
  script = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--steps", str(steps)]
  if kind in ("tinychad", "sweep") and processes > 1:
    launcher = shutil.which("mpirun") or shutil.which("mpirun", path=str(Path(sys.executable).parent)) or "mpirun"
    command = [launcher, "-np", str(processes), "--oversubscribe", "--bind-to", "none",
               "-x", "PYTHONPATH", "-x", "THREADS"]
    if os.geteuid() == 0: command.append("--allow-run-as-root")
    result = subprocess.run(command + script, capture_output=True, text=True, env=env, timeout=900)
    outputs = [result.stdout]
  else:
    port = str(_free_port())
    procs = [subprocess.Popen(script, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**env, "RANK": str(r), "WORLD_SIZE": str(processes), "MASTER_ADDR": "127.0.0.1",
                                   "MASTER_PORT": port}) for r in range(processes)]
    outputs = [p.communicate(timeout=900)[0] for p in procs]
  lines = [line for output in outputs for line in _bench_lines(output)]
  if not lines: raise RuntimeError(f"{kind} x{processes}: no result")
  return next((line for line in lines if line.get("rank", 0) == 0), lines[0])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--worker", choices=["tinychad", "torch", "sweep"])
  parser.add_argument("--steps", type=int, default=30)
  args = parser.parse_args()
  if args.worker:
    result = sweep_worker() if args.worker == "sweep" else (tinychad_worker if args.worker == "tinychad" else torch_worker)(args.steps)
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
    print("BENCH " + json.dumps({**result, "rank": rank}), flush=True)
    return
  rows = [(kind, processes, run(kind, processes, args.steps)) for kind in ("tinychad", "torch") for processes in (1, 2)]
  base = {kind: r["step_s"] for kind, processes, r in rows if processes == 1}
  print(f"CNN train step, global batch {GLOBAL_BATCH}, Adam; {args.steps} timed steps, median")
  print(f"{'library':10s} {'setup':22s} {'images/s':>10s} {'step ms':>9s} {'all-reduce ms':>14s} {'vs 1 proc':>10s}")
  for kind, processes, r in rows:
    setup = "1 process x 2 threads" if processes == 1 else f"{processes} processes x 1 thread"
    print(f"{kind:10s} {setup:22s} {GLOBAL_BATCH / r['step_s']:10.0f} {r['step_s'] * 1e3:9.2f} "
          f"{r['allreduce_s'] * 1e3:14.3f} {base[kind] / r['step_s']:9.2f}x")
  tiny2 = next(r for k, p, r in rows if k == "tinychad" and p == 2)
  torch2 = next(r for k, p, r in rows if k == "torch" and p == 2)
  print(f"\ngradient bytes per step: {tiny2['grad_bytes']:,}; tinychad 2 processes vs PyTorch DDP: "
        f"{torch2['step_s'] / tiny2['step_s']:.2f}x the speed")
  sweep = run("sweep", 2, 0)["sweep"]
  print("\nall-reduce (sum, float32), 2 ranks, loopback: bytes -> median ms, GB/s of bus traffic (2(N-1)/N x bytes)")
  for nbytes, seconds in sweep.items():
    print(f"{int(nbytes):>10,d} B {seconds * 1e3:9.3f} ms {int(nbytes) / seconds / 1e9:8.2f} GB/s")


if __name__ == "__main__":
  main()
