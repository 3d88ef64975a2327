"""Workload 3: sum of 16M floats to one number, in GB/s (4 bytes read per element)."""
import sys
from pathlib import Path

if __package__ in (None, ""): sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import Case, bind, main, tinygrad_realize

TITLE = "sum"


def tinychad_sum(n: int):
  from tinychad import Tensor
  a = Tensor.rand(n).realize()
  return lambda: a.sum().realize()


def torch_sum(n: int):
  import torch
  a = torch.rand(n)
  return lambda: a.sum()


def numpy_sum(n: int):
  import numpy as np
  a = np.random.default_rng(0).random(n, dtype=np.float32)
  return lambda: a.sum()


def tinygrad_sum(n: int):
  from tinygrad import Tensor
  a = Tensor.rand(n).realize()
  return lambda: tinygrad_realize(a.sum())


def cases(quick: bool) -> list[Case]:
  n = 1 << 20 if quick else 1 << 24
  libraries = {"tinychad": tinychad_sum, "torch": torch_sum, "numpy": numpy_sum, "tinygrad": tinygrad_sum}
  return [Case(f"sum {n >> 20}M", "GB/s", 4 * n / 1e9, bind(libraries, n),
               limit=lambda limits: limits.sum_gbs)]


if __name__ == "__main__": main([f"bench.{Path(__file__).stem}"])
