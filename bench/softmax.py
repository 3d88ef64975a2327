"""Workload 4: softmax over the rows of a 4096x4096 fp32 matrix, in ms."""
import sys
from pathlib import Path

if __package__ in (None, ""): sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import Case, bind, main, tinygrad_realize

TITLE = "softmax"


def tinychad_softmax(n: int):
  from tinychad import Tensor
  x = Tensor.randn(n, n).realize()
  return lambda: x.softmax(1).realize()


def torch_softmax(n: int):
  import torch
  x = torch.randn(n, n)
  return lambda: torch.softmax(x, 1)


def numpy_softmax(n: int):
  import numpy as np
  x = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)

  def softmax():
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)
  return softmax


def tinygrad_softmax(n: int):
  from tinygrad import Tensor
  x = Tensor.randn(n, n).realize()
  return lambda: tinygrad_realize(x.softmax(1))


def cases(quick: bool) -> list[Case]:
  n = 1024 if quick else 4096
  libraries = {"tinychad": tinychad_softmax, "torch": torch_softmax, "numpy": numpy_softmax, "tinygrad": tinygrad_softmax}
  # the ideal: read the matrix once and write the result once, at the triad's bandwidth
  ideal_ms = lambda limits: 8 * n * n / 1e9 / limits.triad_gbs * 1e3
  return [Case(f"softmax rows {n}x{n}", "ms", 0, bind(libraries, n),
               limit=ideal_ms)]


if __name__ == "__main__": main([f"bench.{Path(__file__).stem}"])
