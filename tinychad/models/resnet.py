"""ResNet-18/34/50 (He et al. 2015), with torchvision's module names so its state dicts load as they are.

in: images (N, in_channels, H, W) float32  ->  out: logits (N, num_classes).
Names follow torchvision.models.resnet: conv1, bn1, layer1.0.conv1, layer1.0.bn1, ..., layer2.0.downsample.0
(the 1x1 conv) and .1 (its batchnorm), fc; a torchvision checkpoint saved with safetensors.torch loads with
`resnet18(weights="resnet18.safetensors")`. The blocks are torchvision's too: BasicBlock (two 3x3 convs) for
18/34, Bottleneck (1x1, 3x3 with the stride, 1x1 to 4x the width: "ResNet v1.5") for 50.

For small images and CPUs: `small_input=True` swaps the 7x7 stride-2 stem and its max pool for one 3x3 stride-1
conv (the CIFAR stem: a 28x28 digit keeps its detail instead of shrinking to 7x7 before layer1), `width` scales
every stage's channels (64 -> width), `in_channels=1` takes grayscale. The names stay torchvision's.
"""
from __future__ import annotations
import math
import os
from tinychad import nn
from tinychad.nn.state import load_weights
from tinychad.tensor import Tensor


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
  return nn.Conv2d(in_planes, out_planes, 3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
  return nn.Conv2d(in_planes, out_planes, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
  """x -> conv3x3 -> bn -> relu -> conv3x3 -> bn, plus x (through downsample when the shape changes) -> relu."""
  expansion = 1

  def __init__(self, in_planes: int, planes: int, stride: int = 1, downsample: nn.Sequential | None = None):
    self.conv1, self.bn1 = conv3x3(in_planes, planes, stride), nn.BatchNorm2d(planes)
    self.conv2, self.bn2 = conv3x3(planes, planes), nn.BatchNorm2d(planes)
    self.downsample = downsample

  def forward(self, x: Tensor) -> Tensor:
    out = self.bn1(self.conv1(x)).relu()
    out = self.bn2(self.conv2(out))
    identity = self.downsample(x) if self.downsample is not None else x
    return (out + identity).relu()


class Bottleneck(nn.Module):
  """x -> 1x1 (narrow) -> 3x3 (strided) -> 1x1 (4x wide), each with bn, relu between; plus x; relu."""
  expansion = 4

  def __init__(self, in_planes: int, planes: int, stride: int = 1, downsample: nn.Sequential | None = None):
    self.conv1, self.bn1 = conv1x1(in_planes, planes), nn.BatchNorm2d(planes)
    self.conv2, self.bn2 = conv3x3(planes, planes, stride), nn.BatchNorm2d(planes)
    self.conv3, self.bn3 = conv1x1(planes, planes * 4), nn.BatchNorm2d(planes * 4)
    self.downsample = downsample

  def forward(self, x: Tensor) -> Tensor:
    out = self.bn1(self.conv1(x)).relu()
    out = self.bn2(self.conv2(out)).relu()
    out = self.bn3(self.conv3(out))
    identity = self.downsample(x) if self.downsample is not None else x
    return (out + identity).relu()


class ResNet(nn.Module):
  """stem -> layer1..layer4 (each `layers[i]` blocks; stages 2-4 halve the resolution) -> global average -> fc."""
  def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: list[int], num_classes: int = 1000,
               in_channels: int = 3, width: int = 64, small_input: bool = False):
    if len(layers) != 4 or not all(isinstance(n, int) and n > 0 for n in layers):
      raise ValueError(f"ResNet: layers must be 4 positive block counts, got {layers!r}")
    for name, value in (("num_classes", num_classes), ("in_channels", in_channels), ("width", width)):
      if not isinstance(value, int) or value <= 0: raise ValueError(f"ResNet: {name} must be a positive int, got {value!r}")
    self.in_planes = width
    if small_input: self.conv1 = nn.Conv2d(in_channels, width, 3, stride=1, padding=1, bias=False)
    else: self.conv1 = nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False)
    self.bn1 = nn.BatchNorm2d(width)
    self.maxpool = nn.Identity() if small_input else nn.MaxPool2d(3, stride=2, padding=1)
    self.layer1 = self._make_layer(block, width, layers[0])
    self.layer2 = self._make_layer(block, width * 2, layers[1], stride=2)
    self.layer3 = self._make_layer(block, width * 4, layers[2], stride=2)
    self.layer4 = self._make_layer(block, width * 8, layers[3], stride=2)
    self.fc = nn.Linear(width * 8 * block.expansion, num_classes)
    self._init_weights()

  def _make_layer(self, block, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
    downsample = None
    if stride != 1 or self.in_planes != planes * block.expansion:
      downsample = nn.Sequential(conv1x1(self.in_planes, planes * block.expansion, stride),
                                 nn.BatchNorm2d(planes * block.expansion))
    out = [block(self.in_planes, planes, stride, downsample)]
    self.in_planes = planes * block.expansion
    out += [block(self.in_planes, planes) for _ in range(1, blocks)]
    return nn.Sequential(*out)

  def _init_weights(self) -> None:
    # torchvision's: convs kaiming-normal over fan_out for relu (std sqrt(2 / fan_out)); batchnorms start at
    # the identity (their default); fc keeps Linear's uniform init
    for module in self.modules():
      if isinstance(module, nn.Conv2d):
        out_channels, _, kh, kw = module.weight.shape
        module.weight.assign(Tensor.normal(*module.weight.shape, std=math.sqrt(2 / (out_channels * kh * kw)))).realize()

  def forward(self, x: Tensor) -> Tensor:
    if x.ndim != 4 or x.shape[1] != self.conv1.weight.shape[1]:
      raise ValueError(f"ResNet: expected images (N, {self.conv1.weight.shape[1]}, H, W), got shape {tuple(x.shape)}")
    x = self.maxpool(self.bn1(self.conv1(x)).relu())
    x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
    return self.fc(x.mean((2, 3)))   # global average pool (torchvision's AdaptiveAvgPool2d(1) + flatten)


def _build(block, layers: list[int], weights: str | os.PathLike | dict | None, **kwargs) -> ResNet:
  model = ResNet(block, layers, **kwargs)
  if weights is not None: load_weights(model, weights)
  return model


def resnet18(weights: str | os.PathLike | dict | None = None, **kwargs) -> ResNet:
  """ResNet-18 (BasicBlock, [2, 2, 2, 2]). weights: a .safetensors file or a state dict with torchvision's names,
  loaded strictly (nn.state.load_weights).
  kwargs: num_classes, in_channels, width, small_input (see ResNet)."""
  return _build(BasicBlock, [2, 2, 2, 2], weights, **kwargs)


def resnet34(weights: str | os.PathLike | dict | None = None, **kwargs) -> ResNet:
  """ResNet-34 (BasicBlock, [3, 4, 6, 3]); arguments as resnet18's."""
  return _build(BasicBlock, [3, 4, 6, 3], weights, **kwargs)


def resnet50(weights: str | os.PathLike | dict | None = None, **kwargs) -> ResNet:
  """ResNet-50 (Bottleneck, [3, 4, 6, 3]); arguments as resnet18's."""
  return _build(Bottleneck, [3, 4, 6, 3], weights, **kwargs)
