"""Workload 6: one training step of a small CNN on 28x28 images, batch 128, Adam, in ms.

Model: conv5x5 1->32, relu, maxpool 2, conv5x5 32->64, relu, maxpool 2, linear 1024->10, cross-entropy.
One call: forward, loss realized, backward, Adam update of every parameter realized. The first step
(compiling every kernel) is the "1st call" column.
"""
import math
import sys
from pathlib import Path

if __package__ in (None, ""): sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import Case, main, tinygrad_realize

TITLE = "cnn train step"
SHAPES = {"conv1": (32, 1, 5, 5), "conv2": (64, 32, 5, 5), "fc": (10, 1024)}


def tinychad_adam(params: list):
  """tinychad.nn.optim.Adam, or until it lands, the same update (PyTorch's Adam defaults) written here."""
  from tinychad import Tensor
  from tinychad.nn import optim
  if hasattr(optim, "Adam"): return optim.Adam(params, lr=1e-3)

  class Adam:
    def __init__(self, params: list, lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8):
      self.params, self.lr, self.beta1, self.beta2, self.eps, self.t = params, lr, beta1, beta2, eps, 0
      # left lazy: realizing a bare Tensor.zeros fails in tinychad today (see bench/README.md)
      self.m, self.v = [Tensor.zeros(*p.shape) for p in params], [Tensor.zeros(*p.shape) for p in params]

    def zero_grad(self) -> None:
      for p in self.params: p.grad = None

    def step(self) -> None:
      self.t += 1
      for i, p in enumerate(self.params):
        g = p.grad.detach()
        self.m[i] = self.beta1 * self.m[i] + (1 - self.beta1) * g
        self.v[i] = self.beta2 * self.v[i] + (1 - self.beta2) * g * g
        m_hat, v_hat = self.m[i] / (1 - self.beta1 ** self.t), self.v[i] / (1 - self.beta2 ** self.t)
        p.assign(p.detach() - self.lr * m_hat / (v_hat.sqrt() + self.eps))
      Tensor.realize(*self.params, *self.m, *self.v)
  return Adam(params, lr=1e-3)


def tinychad_step(batch: int):
  from tinychad import Tensor
  params = {name: Tensor.uniform(*shape, low=-1 / math.sqrt(math.prod(shape[1:])), high=1 / math.sqrt(math.prod(shape[1:])),
                                 requires_grad=True).realize() for name, shape in SHAPES.items()}
  x, y = Tensor.randn(batch, 1, 28, 28).realize(), Tensor.randint(0, 10, size=(batch,)).realize()
  opt = tinychad_adam(list(params.values()))

  def step():
    h = x.conv2d(params["conv1"]).relu().max_pool2d(2).conv2d(params["conv2"]).relu().max_pool2d(2)
    loss = h.flatten(1).linear(params["fc"]).cross_entropy(y).realize()
    opt.zero_grad()
    loss.backward()
    opt.step()
  return step


def torch_step(batch: int):
  import torch
  import torch.nn.functional as F
  params = {name: torch.empty(*shape).uniform_(-1 / math.sqrt(math.prod(shape[1:])), 1 / math.sqrt(math.prod(shape[1:]))).requires_grad_()
            for name, shape in SHAPES.items()}
  x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
  opt = torch.optim.Adam(list(params.values()), lr=1e-3)

  def step():
    h = F.max_pool2d(F.relu(F.conv2d(F.max_pool2d(F.relu(F.conv2d(x, params["conv1"])), 2), params["conv2"])), 2)
    loss = F.cross_entropy(F.linear(h.flatten(1), params["fc"]), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
  return step


def tinygrad_step(batch: int):
  from tinygrad import Context, Tensor
  from tinygrad.nn.optim import Adam
  params = {name: Tensor.uniform(*shape, low=-1 / math.sqrt(math.prod(shape[1:])), high=1 / math.sqrt(math.prod(shape[1:]))).realize()
            for name, shape in SHAPES.items()}
  x, y = Tensor.randn(batch, 1, 28, 28).realize(), Tensor.randint(batch, low=0, high=10).realize()
  opt = Adam(list(params.values()), lr=1e-3)

  def step():
    with Context(TRAINING=1):  # tinygrad's optimizers refuse to step outside training mode
      h = x.conv2d(params["conv1"]).relu().max_pool2d(2).conv2d(params["conv2"]).relu().max_pool2d(2)
      loss = h.flatten(1).linear(params["fc"].T).sparse_categorical_crossentropy(y)
      tinygrad_realize(loss)
      opt.zero_grad()
      loss.backward()
      opt.step()
      tinygrad_realize(*opt.params)
  return step


def cases(quick: bool) -> list[Case]:
  batch = 16 if quick else 128
  libraries = {"tinychad": tinychad_step, "torch": torch_step, "tinygrad": tinygrad_step}
  return [Case(f"CNN train step b{batch} (Adam)", "ms", 0, {name: (lambda build=build: build(batch)) for name, build in libraries.items()},
               repeats=3, warmup=1, missing_reason="numpy has no autograd")]


if __name__ == "__main__": main([f"bench.{Path(__file__).stem}"])
