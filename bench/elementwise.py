"""Workload 2: the fused elementwise chain exp(relu(a*b + c)) on 16M floats each, in GB/s.

GB/s counts the least memory the chain must touch: three inputs read and one output written
(16 bytes per element). Libraries that materialise intermediates (torch and numpy eager) move more.
"""
import sys
from pathlib import Path

if __package__ in (None, ""): sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import Case, bind, main, tinygrad_realize

TITLE = "elementwise"


def tinychad_chain(n: int):
  from tinychad import Tensor
  a, b, c = (Tensor.rand(n).realize() for _ in range(3))
  return lambda: (a * b + c).relu().exp().realize()


def torch_chain(n: int):
  import torch
  a, b, c = (torch.rand(n) for _ in range(3))
  return lambda: torch.exp(torch.relu(a * b + c))


def numpy_chain(n: int):
  import numpy as np
  rng = np.random.default_rng(0)
  a, b, c = (rng.random(n, dtype=np.float32) for _ in range(3))
  return lambda: np.exp(np.maximum(a * b + c, np.float32(0)))


def tinygrad_chain(n: int):
  from tinygrad import Tensor
  a, b, c = (Tensor.rand(n).realize() for _ in range(3))
  return lambda: tinygrad_realize((a * b + c).relu().exp())


def cases(quick: bool) -> list[Case]:
  n = 1 << 20 if quick else 1 << 24
  libraries = {"tinychad": tinychad_chain, "torch": torch_chain, "numpy": numpy_chain, "tinygrad": tinygrad_chain}
  # a streaming kernel's limit is the triad's bandwidth (reads and a write, like this chain)
  return [Case(f"exp(relu(a*b+c)) {n >> 20}M", "GB/s", 16 * n / 1e9,
               bind(libraries, n), limit=lambda limits: limits.triad_gbs)]


if __name__ == "__main__": main([f"bench.{Path(__file__).stem}"])
