"""Workload 1: square fp32 matmul, C = A @ B, in GFLOP/s (2*n^3 flops per call)."""
import sys
from pathlib import Path

if __package__ in (None, ""): sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import Case, main, tinygrad_realize

TITLE = "matmul"


def tinychad_matmul(n: int):
  from tinychad import Tensor
  a, b = Tensor.rand(n, n).realize(), Tensor.rand(n, n).realize()
  return lambda: (a @ b).realize()


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
  return [Case(f"matmul {n}x{n}", "GFLOP/s", 2 * n ** 3 / 1e9,
               {name: (lambda build=build, n=n: build(n)) for name, build in libraries.items()},
               repeats=3 if n >= 2048 else 7, warmup=1 if n >= 2048 else 2)
          for n in sizes]


if __name__ == "__main__": main([f"bench.{Path(__file__).stem}"])
