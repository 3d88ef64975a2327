"""Workload 6: one training step of a small CNN on 28x28 images, batch 128, Adam, in ms.

Model: conv5x5 1->32, relu, maxpool 2, conv5x5 32->64, relu, maxpool 2, linear 1024->10, cross-entropy.
One call: forward, loss realized, backward, Adam update of every parameter realized. The first step
(compiling every kernel) is the "1st call" column.
"""
import math
import sys
from pathlib import Path

if __package__ in (None, ""): sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import Case, bind, main, tinygrad_realize

TITLE = "cnn train step"
SHAPES = {"conv1": (32, 1, 5, 5), "conv2": (64, 32, 5, 5), "fc": (10, 1024)}
# PyTorch's default init bound for each weight: uniform in +-1/sqrt(fan_in)
BOUNDS = {name: 1 / math.sqrt(math.prod(shape[1:])) for name, shape in SHAPES.items()}


def tinychad_step(batch: int):
  from tinychad import Tensor, TinyJit
  from tinychad.nn.optim import Adam
  params = {name: Tensor.uniform(*shape, low=-BOUNDS[name], high=BOUNDS[name], requires_grad=True).realize()
            for name, shape in SHAPES.items()}
  x, y = Tensor.randn(batch, 1, 28, 28).realize(), Tensor.randint(0, 10, size=(batch,)).realize()
  opt = Adam(list(params.values()), lr=1e-3)

  # the JIT replays the recorded kernels from the third call on, as a user's training loop would
  @TinyJit
  def step(images, labels):
    h = images.conv2d(params["conv1"]).relu().max_pool2d(2).conv2d(params["conv2"]).relu().max_pool2d(2)
    loss = h.flatten(1).linear(params["fc"].T).cross_entropy(labels)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss
  return lambda: step(x, y).realize()


def torch_step(batch: int):
  import torch
  import torch.nn.functional as F
  params = {name: torch.empty(*shape).uniform_(-BOUNDS[name], BOUNDS[name]).requires_grad_()
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
  from tinygrad import Context, Tensor, TinyJit
  from tinygrad.nn.optim import Adam
  params = {name: Tensor.uniform(*shape, low=-BOUNDS[name], high=BOUNDS[name]).realize()
            for name, shape in SHAPES.items()}
  x, y = Tensor.randn(batch, 1, 28, 28).realize(), Tensor.randint(batch, low=0, high=10).realize()
  opt = Adam(list(params.values()), lr=1e-3)

  @TinyJit
  def step(images, labels):
    with Context(TRAINING=1):  # tinygrad's optimizers refuse to step outside training mode
      h = images.conv2d(params["conv1"]).relu().max_pool2d(2).conv2d(params["conv2"]).relu().max_pool2d(2)
      loss = h.flatten(1).linear(params["fc"].T).sparse_categorical_crossentropy(labels)
      opt.zero_grad()
      loss.backward()
      opt.step()
      return tinygrad_realize(loss, *opt.params)
  return lambda: step(x, y)


def cases(quick: bool) -> list[Case]:
  batch = 16 if quick else 128
  libraries = {"tinychad": tinychad_step, "torch": torch_step, "tinygrad": tinygrad_step}
  return [Case(f"CNN train step b{batch} (Adam)", "ms", 0, bind(libraries, batch),
               repeats=3, warmup=1, missing_reason="numpy has no autograd")]


if __name__ == "__main__": main([f"bench.{Path(__file__).stem}"])
