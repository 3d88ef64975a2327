"""tinychad.models.resnet against a PyTorch twin written here in plain torch.nn with torchvision's structure and
names (torchvision isn't installed): a checkpoint the twin saves with safetensors.torch loads by name, then
logits (train and eval mode), loss, every parameter's gradient, batchnorm's running statistics and three SGD
steps' losses agree. Small widths and 32x32 images keep it to seconds.
"""
from __future__ import annotations
import numpy as np
import pytest
import torch
import torch.nn as tnn
import torch.nn.functional as tF
from safetensors.torch import save_file
from tinychad import Tensor
from tinychad.models import ResNet, resnet18, resnet34, resnet50
from tinychad.nn.optim import SGD
from model_reference import assert_close, assert_same_grads, assert_same_training, load_twin, to_torch


# ---- the twin: torchvision.models.resnet, trimmed to what the tests need ----
class TBasicBlock(tnn.Module):
  expansion = 1

  def __init__(self, inplanes, planes, stride=1, downsample=None):
    super().__init__()
    self.conv1 = tnn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
    self.bn1 = tnn.BatchNorm2d(planes)
    self.conv2 = tnn.Conv2d(planes, planes, 3, 1, 1, bias=False)
    self.bn2 = tnn.BatchNorm2d(planes)
    self.downsample = downsample

  def forward(self, x):
    out = tF.relu(self.bn1(self.conv1(x)))
    out = self.bn2(self.conv2(out))
    return tF.relu(out + (self.downsample(x) if self.downsample is not None else x))


class TBottleneck(tnn.Module):
  expansion = 4

  def __init__(self, inplanes, planes, stride=1, downsample=None):
    super().__init__()
    self.conv1, self.bn1 = tnn.Conv2d(inplanes, planes, 1, bias=False), tnn.BatchNorm2d(planes)
    self.conv2, self.bn2 = tnn.Conv2d(planes, planes, 3, stride, 1, bias=False), tnn.BatchNorm2d(planes)
    self.conv3, self.bn3 = tnn.Conv2d(planes, planes * 4, 1, bias=False), tnn.BatchNorm2d(planes * 4)
    self.downsample = downsample

  def forward(self, x):
    out = tF.relu(self.bn1(self.conv1(x)))
    out = tF.relu(self.bn2(self.conv2(out)))
    out = self.bn3(self.conv3(out))
    return tF.relu(out + (self.downsample(x) if self.downsample is not None else x))


class TResNet(tnn.Module):
  def __init__(self, block, layers, num_classes=1000, in_channels=3, width=64, small_input=False):
    super().__init__()
    self.inplanes = width
    kernel, stride, padding = (3, 1, 1) if small_input else (7, 2, 3)
    self.conv1 = tnn.Conv2d(in_channels, width, kernel, stride, padding, bias=False)
    self.bn1 = tnn.BatchNorm2d(width)
    self.maxpool = tnn.Identity() if small_input else tnn.MaxPool2d(3, 2, 1)
    self.layer1 = self._make_layer(block, width, layers[0])
    self.layer2 = self._make_layer(block, width * 2, layers[1], 2)
    self.layer3 = self._make_layer(block, width * 4, layers[2], 2)
    self.layer4 = self._make_layer(block, width * 8, layers[3], 2)
    self.avgpool = tnn.AdaptiveAvgPool2d(1)
    self.fc = tnn.Linear(width * 8 * block.expansion, num_classes)

  def _make_layer(self, block, planes, blocks, stride=1):
    downsample = None
    if stride != 1 or self.inplanes != planes * block.expansion:
      downsample = tnn.Sequential(tnn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                                  tnn.BatchNorm2d(planes * block.expansion))
    layers = [block(self.inplanes, planes, stride, downsample)]
    self.inplanes = planes * block.expansion
    layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
    return tnn.Sequential(*layers)

  def forward(self, x):
    x = self.maxpool(tF.relu(self.bn1(self.conv1(x))))
    x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
    return self.fc(torch.flatten(self.avgpool(x), 1))


def twin_pair(tmp_path, depth: int, **kwargs) -> tuple[ResNet, TResNet]:
  torch.manual_seed(0)
  block, layers = {18: (TBasicBlock, [2, 2, 2, 2]), 34: (TBasicBlock, [3, 4, 6, 3]), 50: (TBottleneck, [3, 4, 6, 3])}[depth]
  twin = TResNet(block, layers, **kwargs)
  # non-trivial batchnorm affine parameters and running statistics, so loading them is checked too
  with torch.no_grad():
    for m in twin.modules():
      if isinstance(m, tnn.BatchNorm2d):
        m.weight.uniform_(0.5, 1.5), m.bias.uniform_(-0.2, 0.2)
        m.running_mean.uniform_(-0.1, 0.1), m.running_var.uniform_(0.5, 2)
  build = {18: resnet18, 34: resnet34, 50: resnet50}[depth]
  path = tmp_path / f"resnet{depth}.safetensors"
  save_file({k: v.contiguous() for k, v in twin.state_dict().items()}, str(path))
  return build(weights=path, **kwargs), twin


def test_torchvision_names_and_shapes():
  model, twin = resnet18(), TResNet(TBasicBlock, [2, 2, 2, 2])
  ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
  assert ours == {k: tuple(v.shape) for k, v in twin.state_dict().items()}
  assert "layer2.0.downsample.0.weight" in ours and "layer2.0.downsample.1.running_var" in ours and "fc.bias" in ours
  assert len(ours) == 122   # torchvision's resnet18().state_dict() has 122 entries
  buffers = ("running_mean", "running_var", "num_batches_tracked")
  assert sum(int(np.prod(s)) for k, s in ours.items() if not k.endswith(buffers)) == 11_689_512
  assert sum(p.numel() for p in resnet50().parameters()) == 25_557_032   # torchvision's ResNet-50
  assert sum(p.numel() for p in resnet34().parameters()) == 21_797_672   # and ResNet-34


# 64x64 with the ImageNet stem leaves layer4 2x2, so batch 2 gives train-mode batchnorm 8 values per channel
# (at 1x1, two values normalise to +-1 and float32 rounding is amplified past any fair tolerance)
@pytest.mark.parametrize("depth,size,kwargs", [(18, 64, dict(width=16, num_classes=10)),
                                               (50, 16, dict(width=8, num_classes=7, in_channels=1, small_input=True))])
def test_matches_pytorch_twin(tmp_path, depth, size, kwargs):
  model, twin = twin_pair(tmp_path, depth, **kwargs)
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, kwargs.get("in_channels", 3), size, size)).astype(np.float32)
  y = rng.integers(0, kwargs["num_classes"], 2)
  # eval: the loaded running statistics
  model.eval(), twin.eval()
  with torch.no_grad(): expected = twin(to_torch(x)).numpy()
  assert_close(model(Tensor(x)).numpy(), expected, "eval logits", rtol=1e-4, atol_scale=1e-5)
  # train: batch statistics, loss and every gradient
  model.train(), twin.train()
  out, torch_out = model(Tensor(x)), twin(to_torch(x))
  assert_close(out.numpy(), torch_out.detach().numpy(), "train logits", rtol=1e-4, atol_scale=1e-5)
  loss, torch_loss = out.cross_entropy(Tensor(y)), tF.cross_entropy(torch_out, torch.from_numpy(y))
  np.testing.assert_allclose(loss.item(), torch_loss.item(), rtol=1e-5)
  loss.backward(), torch_loss.backward()
  assert assert_same_grads(model, twin) == sum(1 for _ in twin.parameters())
  # batchnorm's running statistics followed the same update
  theirs = twin.state_dict()
  for name, t in model.state_dict().items():
    if name.endswith(("running_mean", "running_var")):
      assert_close(t.numpy(), theirs[name].numpy(), name, rtol=1e-4, atol_scale=1e-5)


def test_sgd_steps_match_pytorch(tmp_path):
  model, twin = twin_pair(tmp_path, 18, width=8, num_classes=10, in_channels=1, small_input=True)
  rng = np.random.default_rng(1)
  x = rng.standard_normal((4, 1, 16, 16)).astype(np.float32)
  y = rng.integers(0, 10, 4)
  model.train(), twin.train()
  losses = assert_same_training(model, twin, lambda m: m(Tensor(x)).cross_entropy(Tensor(y)),
                                lambda t: tF.cross_entropy(t(to_torch(x)), torch.from_numpy(y)),
                                lambda m: SGD(m.parameters(), lr=0.05, momentum=0.9),
                                lambda t: torch.optim.SGD(t.parameters(), lr=0.05, momentum=0.9))
  assert losses[-1] < losses[0]


def test_load_errors_name_every_problem(tmp_path):
  twin = TResNet(TBasicBlock, [2, 2, 2, 2], num_classes=10, width=8)
  state = twin.state_dict()
  state["extra.weight"] = torch.zeros(3)
  del state["fc.bias"]
  path = tmp_path / "bad.safetensors"
  save_file({k: v.contiguous() for k, v in state.items()}, str(path))
  with pytest.raises(RuntimeError) as e: resnet18(weights=path, num_classes=5, width=8)
  message = str(e.value)
  assert str(path) in message and "fc.weight" in message and "(10, 64)" in message and "(5, 64)" in message
  assert "missing keys" in message and "fc.bias" in message and "unexpected keys" in message and "extra.weight" in message
  torch.save(twin.state_dict(), tmp_path / "model.pt")
  with pytest.raises(ValueError, match="pickle"): resnet18(weights=tmp_path / "model.pt", num_classes=10, width=8)


def test_bad_input_is_a_clear_error():
  model = resnet18(num_classes=10, in_channels=1, width=8, small_input=True)
  with pytest.raises(ValueError, match=r"ResNet: expected images \(N, 1, H, W\), got shape \(2, 3, 8, 8\)"):
    model(Tensor.zeros(2, 3, 8, 8))
  with pytest.raises(ValueError, match="layers must be 4"): ResNet(None, [2, 2])


def test_weights_from_a_state_dict():
  """weights= also takes an in-memory state dict (numpy arrays here, as torch's tensors turned .numpy())."""
  torch.manual_seed(0)
  twin = TResNet(TBasicBlock, [2, 2, 2, 2], num_classes=10, in_channels=1, width=8, small_input=True).eval()
  model = resnet18(weights={k: v.numpy() for k, v in twin.state_dict().items()}, num_classes=10, in_channels=1, width=8,
                   small_input=True).eval()
  x = np.random.default_rng(0).standard_normal((2, 1, 12, 12)).astype(np.float32)
  with torch.no_grad(): expected = twin(to_torch(x)).numpy()
  assert_close(model(Tensor(x)).numpy(), expected, "logits", rtol=1e-4, atol_scale=1e-5)
  with pytest.raises(TypeError, match="weights must be a .safetensors path or a state dict, got int"): resnet18(weights=3)
