"""A short MLP trained with SGD lowers its loss, and matches PyTorch step for step."""
from __future__ import annotations
import numpy as np
import pytest
import torch
from tinychad import Tensor
from tinychad.nn import Linear
from tinychad.nn.optim import SGD

pytestmark = pytest.mark.usefixtures("train_device")     # conftest: the default device, then OPENCL


def test_mlp_matches_pytorch_for_five_steps():
  rng = np.random.default_rng(0)
  images = rng.standard_normal((32, 784)).astype(np.float32)
  labels = rng.integers(0, 10, 32)
  ours_1, ours_2 = Linear(784, 128), Linear(128, 10)
  theirs = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
  with torch.no_grad():
    for layer, ref in ((ours_1, theirs[0]), (ours_2, theirs[2])):
      ref.weight.copy_(torch.tensor(layer.weight.numpy()))
      ref.bias.copy_(torch.tensor(layer.bias.numpy()))
  params = [ours_1.weight, ours_1.bias, ours_2.weight, ours_2.bias]
  ours_opt, theirs_opt = SGD(params, lr=0.05, momentum=0.9), torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=0.9)
  x, y = Tensor(images), Tensor(labels)
  ours_losses, theirs_losses = [], []
  for _ in range(5):
    loss = ours_2(ours_1(x).relu()).cross_entropy(y)
    ours_opt.zero_grad()
    loss.backward()
    ours_opt.step()
    ours_losses.append(loss.item())
    ref_loss = torch.nn.functional.cross_entropy(theirs(torch.tensor(images)), torch.tensor(labels))
    theirs_opt.zero_grad()
    ref_loss.backward()
    theirs_opt.step()
    theirs_losses.append(ref_loss.item())
  np.testing.assert_allclose(ours_losses, theirs_losses, atol=1e-4)
  assert ours_losses[-1] < ours_losses[0]
