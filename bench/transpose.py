"""Workload 9: kernels that store along one axis and load along another, in GB/s and ms.

  transpose   x.T.contiguous() of an n x n fp32 matrix (GB/s: the bytes read and written)
  momentum    SGD momentum v = 0.9 v + g over a 512x512x3x3 weight whose gradient g arrives in the
              convolution's channels-last layout (512, 3, 3, 512) and is read through a permutation:
              a ResNet-18 training step does this for each of its widest convolutions (ms)
"""
import sys
from pathlib import Path

if __package__ in (None, ""): sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import Case, bind, main, tinygrad_realize

TITLE = "transposing kernels"
WEIGHT = (512, 512, 3, 3)
GRADIENT = (512, 3, 3, 512)      # (cin, kh, kw, cout): permute(3, 0, 1, 2) is WEIGHT's layout


def tinychad_transpose(n: int):
  from tinychad import Tensor
  x = Tensor.randn(n, n).realize()
  return lambda: x.T.contiguous().realize()


def torch_transpose(n: int):
  import torch
  x = torch.randn(n, n)
  return lambda: x.T.contiguous()


def numpy_transpose(n: int):
  import numpy as np
  x = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
  return lambda: np.ascontiguousarray(x.T)


def tinygrad_transpose(n: int):
  from tinygrad import Tensor
  x = Tensor.randn(n, n).realize()
  return lambda: tinygrad_realize(x.T.contiguous())


def tinychad_momentum():
  from tinychad import Tensor
  v, g = Tensor.randn(*WEIGHT).realize(), Tensor.randn(*GRADIENT).realize()
  return lambda: (v * 0.9 + g.permute(3, 0, 1, 2)).realize()


def torch_momentum():
  import torch
  v, g = torch.randn(*WEIGHT), torch.randn(*GRADIENT)
  return lambda: v * 0.9 + g.permute(3, 0, 1, 2)


def numpy_momentum():
  import numpy as np
  rng = np.random.default_rng(0)
  v, g = rng.standard_normal(WEIGHT, dtype=np.float32), rng.standard_normal(GRADIENT, dtype=np.float32)
  return lambda: v * np.float32(0.9) + g.transpose(3, 0, 1, 2)


def tinygrad_momentum():
  from tinygrad import Tensor
  v, g = Tensor.randn(*WEIGHT).realize(), Tensor.randn(*GRADIENT).realize()
  return lambda: tinygrad_realize(v * 0.9 + g.permute(3, 0, 1, 2))


def cases(quick: bool) -> list[Case]:
  n = 1024 if quick else 2048
  transpose = {"tinychad": tinychad_transpose, "torch": torch_transpose, "numpy": numpy_transpose,
               "tinygrad": tinygrad_transpose}
  momentum = {"tinychad": tinychad_momentum, "torch": torch_momentum, "numpy": numpy_momentum,
              "tinygrad": tinygrad_momentum}
  return [Case(f"transpose {n}x{n} (x.T.contiguous())", "GB/s", 8 * n * n / 1e9, bind(transpose, n)),
          Case("SGD momentum, transposed gradient 512x512x3x3", "ms", 0, bind(momentum))]


if __name__ == "__main__": main([f"bench.{Path(__file__).stem}"])
