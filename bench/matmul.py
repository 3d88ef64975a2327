"""Workload 1: square fp32 matmul, C = A @ B, in GFLOP/s (2*n^3 flops per call).

Two rows per size: eager (`(a @ b).realize()`: builds the lazy graph and schedules it on every call,
~50 us of Python in tinychad, ~85 us right after a kernel has filled the caches with its matrices: a
tenth of the 512 case on 2 threads) and TinyJit (the same call replayed: the kernels alone, as in a
jitted training step), the latter next to numpy only.
"""
import sys
from pathlib import Path

if __package__ in (None, ""): sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import Case, bind, main, tinygrad_realize

TITLE = "matmul"


def tinychad_matmul(n: int):
  from tinychad import Tensor
  a, b = Tensor.rand(n, n).realize(), Tensor.rand(n, n).realize()
  return lambda: (a @ b).realize()


def tinychad_matmul_jit(n: int):
  from tinychad import Tensor, TinyJit
  a, b = Tensor.rand(n, n).realize(), Tensor.rand(n, n).realize()
  step = TinyJit(lambda x, y: (x @ y).realize())
  return lambda: step(a, b)


def torch_matmul(n: int):
  import torch
  a, b = torch.rand(n, n), torch.rand(n, n)
  return lambda: a @ b


def numpy_matmul(n: int):
  import numpy as np
  rng = np.random.default_rng(0)
  a, b = rng.random((n, n), dtype=np.float32), rng.random((n, n), dtype=np.float32)
  return lambda: a @ b


def tinygrad_matmul(n: int):
  from tinygrad import Tensor
  a, b = Tensor.rand(n, n).realize(), Tensor.rand(n, n).realize()
  return lambda: tinygrad_realize(a @ b)


def cases(quick: bool) -> list[Case]:
  sizes = (256, 512) if quick else (512, 1024, 2048)
  libraries = {"tinychad": tinychad_matmul, "torch": torch_matmul, "numpy": numpy_matmul, "tinygrad": tinygrad_matmul}
  jitted = {"tinychad": tinychad_matmul_jit, "numpy": numpy_matmul}
  # warm-up: TinyJit records on its second call and replays from the third
  return [Case(f"matmul {n}x{n}{suffix}", "GFLOP/s", 2 * n ** 3 / 1e9,
               bind(builds, n),
               repeats=3 if n >= 2048 else 7, warmup=2 if suffix or n < 2048 else 1,
               missing_reason="TinyJit rows: tinychad and numpy only", limit=lambda limits: limits.fma_gflops)
          for suffix, builds in (("", libraries), (" TinyJit", jitted)) for n in sizes]


if __name__ == "__main__": main([f"bench.{Path(__file__).stem}"])
