"""Workload 8: 1000 additions of two 4-element tensors, each realized, in ms for all 1000.

The arithmetic is nothing; this measures the per-op overhead of building, scheduling and launching
one tiny kernel (for tinychad and tinygrad: Python lazy graph + kernel cache lookup + ctypes call).
A second row does the same with gelu (tanh form): ~15 recorded ops fused into one kernel per call, so
it shows what recording an op costs in Python next to launching a kernel.
"""
import sys
from pathlib import Path

if __package__ in (None, ""): sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import Case, main, tinygrad_realize

TITLE = "small ops"
OPS = 1000


def tinychad_adds():
  from tinychad import Tensor
  a, b = Tensor.rand(4).realize(), Tensor.rand(4).realize()

  def adds():
    for _ in range(OPS): (a + b).realize()
  return adds


def torch_adds():
  import torch
  a, b = torch.rand(4), torch.rand(4)

  def adds():
    for _ in range(OPS): a + b
  return adds


def numpy_adds():
  import numpy as np
  a, b = np.random.default_rng(0).random((2, 4), dtype=np.float32)

  def adds():
    for _ in range(OPS): a + b
  return adds


def tinygrad_adds():
  from tinygrad import Tensor
  a, b = Tensor.rand(4).realize(), Tensor.rand(4).realize()

  def adds():
    for _ in range(OPS): tinygrad_realize(a + b)
  return adds


def tinychad_gelus():
  from tinychad import Tensor
  a = Tensor.rand(4).realize()

  def gelus():
    for _ in range(OPS): a.gelu(approximate="tanh").realize()
  return gelus


def torch_gelus():
  import torch
  a = torch.rand(4)

  def gelus():
    for _ in range(OPS): torch.nn.functional.gelu(a, approximate="tanh")
  return gelus


def numpy_gelus():
  import numpy as np
  a = np.random.default_rng(0).random(4, dtype=np.float32)
  scale = np.float32(np.sqrt(2 / np.pi))

  def gelus():
    for _ in range(OPS): 0.5 * a * (1 + np.tanh(scale * (a + np.float32(0.044715) * a * a * a)))
  return gelus


def tinygrad_gelus():
  from tinygrad import Tensor
  a = Tensor.rand(4).realize()

  def gelus():
    for _ in range(OPS): tinygrad_realize(a.gelu())
  return gelus


def cases(quick: bool) -> list[Case]:
  return [Case(f"{OPS} x (a+b), 4 floats", "ms", 0,
               {"tinychad": tinychad_adds, "torch": torch_adds, "numpy": numpy_adds, "tinygrad": tinygrad_adds}, repeats=5, warmup=1),
          Case(f"{OPS} x gelu(a) (tanh form), 4 floats", "ms", 0,
               {"tinychad": tinychad_gelus, "torch": torch_gelus, "numpy": numpy_gelus, "tinygrad": tinygrad_gelus},
               repeats=5, warmup=1)]


if __name__ == "__main__": main([f"bench.{Path(__file__).stem}"])
