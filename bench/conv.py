"""Workload 5: conv 1->32 3x3 -> relu -> conv 32->64 3x3, forward and backward, batch 64 of 28x28, in ms.

One call: forward, sum as the loss, backward, both weight gradients realized.
"""
import sys
from pathlib import Path

if __package__ in (None, ""): sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import Case, bind, main, tinygrad_realize

TITLE = "conv"


def tinychad_convs(batch: int):
  from tinychad import Tensor
  x = Tensor.randn(batch, 1, 28, 28).realize()
  w1, w2 = Tensor.randn(32, 1, 3, 3, requires_grad=True).realize(), Tensor.randn(64, 32, 3, 3, requires_grad=True).realize()

  def step():
    w1.grad = w2.grad = None
    x.conv2d(w1).relu().conv2d(w2).sum().backward()
    Tensor.realize(w1.grad, w2.grad)
  return step


def torch_convs(batch: int):
  import torch
  import torch.nn.functional as F
  x = torch.randn(batch, 1, 28, 28)
  w1, w2 = torch.randn(32, 1, 3, 3, requires_grad=True), torch.randn(64, 32, 3, 3, requires_grad=True)

  def step():
    w1.grad = w2.grad = None
    F.conv2d(F.relu(F.conv2d(x, w1)), w2).sum().backward()
  return step


def tinygrad_convs(batch: int):
  from tinygrad import Tensor
  x = Tensor.randn(batch, 1, 28, 28).realize()
  # tinygrad 0.14 has no requires_grad: backward() differentiates with respect to every tensor
  w1, w2 = Tensor.randn(32, 1, 3, 3).realize(), Tensor.randn(64, 32, 3, 3).realize()

  def step():
    w1.grad = w2.grad = None
    x.conv2d(w1).relu().conv2d(w2).sum().backward()
    tinygrad_realize(w1.grad, w2.grad)
  return step


def cases(quick: bool) -> list[Case]:
  batch = 8 if quick else 64
  libraries = {"tinychad": tinychad_convs, "torch": torch_convs, "tinygrad": tinygrad_convs}
  return [Case(f"conv3x3 x2 fwd+bwd b{batch}", "ms", 0, bind(libraries, batch),
               repeats=5, warmup=1, missing_reason="numpy has no autograd")]


if __name__ == "__main__": main([f"bench.{Path(__file__).stem}"])
