"""tinychad.distributed: a world of one in this process, and real 2-rank jobs under mpirun (loopback).

in: the scenarios of test/distributed_worker.py, each launched as `mpirun -np 2`
out: each rank checks its own results (collectives on several dtypes and shapes; K data-parallel training
steps of an MLP and of a CNN with SyncBatchNorm, eager and under TinyJit, equal to one process training on
the doubled batch to 1e-5) and exits 0; a rank that raises, or hangs past the deadline, ends the job
non-zero within seconds.
"""
from __future__ import annotations
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
import numpy as np
import pytest
from tinychad import Tensor, nn
from tinychad import distributed as dist
from tinychad.data import DataLoader, DistributedSampler

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "distributed_worker.py"


def mpirun(*args: str, timeout: float = 240, script: list[str] | None = None) -> tuple[subprocess.CompletedProcess, float]:
  # Open MPI's wheel puts mpirun beside the Python that installed it, which may not be on PATH
  launcher = shutil.which("mpirun") or shutil.which("mpirun", path=str(Path(sys.executable).parent))
  assert launcher is not None, "mpirun not found: pip install 'tinychad[distributed]' (Open MPI's wheel provides it)"
  command = [launcher, "-np", "2", "--oversubscribe", "--bind-to", "none"]
  if os.geteuid() == 0: command.append("--allow-run-as-root")     # CI runs as root; Open MPI refuses it unless told
  env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "THREADS": "1"}
  command += ["-x", "PYTHONPATH", "-x", "THREADS", sys.executable, *(script or [str(WORKER)]), *args]
  start = time.monotonic()
  result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
  return result, time.monotonic() - start


@pytest.mark.parametrize("scenario", ["collectives", "train-mlp", "train-cnn"])
def test_two_ranks(scenario):
  result, _ = mpirun(scenario)
  assert result.returncode == 0, result.stdout + result.stderr
  assert sorted(line for line in result.stdout.splitlines() if line.startswith("ok")) == \
    [f"ok {scenario} rank 0", f"ok {scenario} rank 1"]


def test_a_rank_raising_stops_the_job():
  result, seconds = mpirun("raise", "60")
  assert result.returncode != 0
  assert "rank 1 fails on purpose" in result.stderr and "rank 1 of 2 failed, aborting" in result.stderr
  assert seconds < 45, f"the job took {seconds:.0f} s to stop"


def test_a_hanging_rank_times_out():
  result, seconds = mpirun("hang", "3")
  assert result.returncode != 0
  assert "DistributedTimeout" in result.stderr and "barrier on rank 0" in result.stderr
  assert seconds < 45, f"the job took {seconds:.0f} s to stop"


def test_mnist_main_job_on_two_ranks_trains_like_one_process(tmp_path):
  """The main job under mpirun: the same batches, batchnorm over the whole batch, averaged gradients. Exact
  equality is the training scenarios' business (above); here the recipe's Adam turns rounding noise in the
  conv biases (which batchnorm cancels, leaving them gradients of ~0) into full steps, so the check is on
  what a user compares: the accuracy, and the weights that matter, to a loose tolerance."""
  folder = os.environ.get("TINYCHAD_DATA")
  assert folder, "TINYCHAD_DATA is unset: test/conftest.py sets it when ../shared/datasets/mnist exists"
  flags = ["--limit", "1024", "--epochs", "1", "--batch-size", "64", "--test-sample", "500", "--data", folder]
  result, _ = mpirun(*flags, "--save", str(tmp_path / "two.safetensors"), script=["-m", "tinychad.examples.mnist"], timeout=400)
  assert result.returncode == 0, result.stdout + result.stderr
  assert "on 2 ranks" in result.stdout and result.stdout.count("test accuracy") == 1      # rank 0 alone reports
  from tinychad.examples import mnist
  from tinychad.nn.state import safe_load
  one_accuracy = mnist.main([*flags, "--save", str(tmp_path / "one.safetensors")])
  two_accuracy = float(result.stdout.split("test accuracy ")[1].split("%")[0]) / 100
  assert abs(two_accuracy - one_accuracy) <= 0.02, (one_accuracy, two_accuracy)
  two, one = safe_load(str(tmp_path / "two.safetensors")), safe_load(str(tmp_path / "one.safetensors"))
  assert sorted(two) == sorted(one)
  for name in ("head.weight", "trunk.1.weight", "trunk.5.weight"):
    assert np.allclose(two[name].numpy(), one[name].numpy(), atol=2e-2), name


# ---- a world of one: no launcher, nothing MPI ----
def test_world_of_one_is_a_no_op():
  assert not dist.launched() and dist.world_size() == 1 and dist.rank() == 0 and dist.is_main()
  x = Tensor([1.0, 2.0])
  assert dist.all_reduce(x, "mean") is x and np.array_equal(x.numpy(), [1, 2])
  assert dist.broadcast(x) is x
  assert dist.all_gather(x).shape == (1, 2)
  dist.barrier()
  with pytest.raises(ValueError, match="all_reduce: op must be one of"): dist.all_reduce(x, "avg")
  with pytest.raises(ValueError, match="broadcast: src 1 is not a rank"): dist.broadcast(x, src=1)


def test_sync_batchnorm_is_batchnorm_in_a_world_of_one():
  import torch
  model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3)).train()
  sync = nn.SyncBatchNorm.convert_sync_batchnorm(model)
  assert type(sync[1]) is nn.SyncBatchNorm and sync[1].weight is model[1].weight
  x = np.random.default_rng(0).standard_normal((4, 2, 6, 6)).astype(np.float32)
  ref = torch.nn.BatchNorm2d(3).train()
  with torch.no_grad():
    out = ref(torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(model[0].weight.numpy()), torch.tensor(model[0].bias.numpy())))
  assert np.allclose(sync(Tensor(x)).numpy(), out.numpy(), atol=1e-5)
  assert np.allclose(sync[1].running_mean.numpy(), ref.running_mean.numpy(), atol=1e-6)
  assert np.allclose(sync[1].running_var.numpy(), ref.running_var.numpy(), atol=1e-6)


def test_distributed_sampler_shards_each_epoch():
  shards = [DistributedSampler(10, 3, r, seed=4) for r in range(3)]
  first = [s.indices() for s in shards]
  assert all(len(s) == 4 for s in shards) and all(len(f) == 4 for f in first)
  # padded by repeating the start, so every sample appears and 2 appear twice
  assert sorted(set(np.concatenate(first).tolist())) == list(range(10))
  for s in shards: s.set_epoch(1)
  assert any(not np.array_equal(a, s.indices()) for a, s in zip(first, shards))
  assert np.array_equal(DistributedSampler(10, 3, 0, seed=4).indices(), first[0])     # same seed, same epoch, same order
  cut = [DistributedSampler(10, 3, r, drop_last=True, shuffle=False).indices() for r in range(3)]
  assert [c.tolist() for c in cut] == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
  X = np.arange(10)
  batches = [b[0].tolist() for b in DataLoader(X, batch_size=2, to_tensor=False, sampler=shards[0])]
  assert sum(batches, []) == shards[0].indices().tolist()
  with pytest.raises(ValueError, match="rank 3 is not in a world of 3"): DistributedSampler(10, 3, 3)
  with pytest.raises(ValueError, match="shuffle=True with a sampler"): DataLoader(X, shuffle=True, sampler=shards[0])
