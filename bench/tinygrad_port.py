"""torch.nn's names for tinygrad: what a user porting bench/models.py's ResNet-18 and GPT to tinygrad 0.14 writes.

in: the model code of bench/models.py's `define(lib)`, written once against torch.nn
out: `library()`, the same namespace bench/models.py's `library(name)` gives for torch and tinychad, with tinygrad's
     own layers where it has them (Conv2d, BatchNorm2d, Linear, Embedding, LayerNorm, its optimizers) and a few lines
     each where it doesn't: a Module base class (`forward` through `__call__`, `train`/`eval`, `parameters`),
     Sequential, ModuleList, MaxPool2d, AdaptiveAvgPool2d to 1x1, GELU, relu, cross_entropy. tinygrad has no LSTM
     (LSTMCell only) and no TransformerEncoderLayer, so the LSTM and ViT rows stay unported.
bench/models.py runs these under tinygrad's TinyJit. tinygrad trains where its TRAINING variable is set (its BatchNorm
updates running statistics, as torch's train mode does): `train()` sets it, `eval()` clears it. Its GELU is the tanh
approximation where torch's default is exact: the same work per element, so a timing is still like for like (only
tinychad's outputs are checked against torch).
"""
from __future__ import annotations
import contextlib
from types import SimpleNamespace


def library() -> SimpleNamespace:
  from tinygrad import Tensor
  from tinygrad import nn as tnn
  from tinygrad.helpers import TRAINING
  from tinygrad.nn.state import get_parameters

  class Module:
    def __init__(self): pass
    def __call__(self, *args, **kwargs): return self.forward(*args, **kwargs)
    def parameters(self) -> list[Tensor]: return get_parameters(self)
    def train(self, mode: bool = True):
      TRAINING.value = int(mode)
      return self
    def eval(self): return self.train(False)

  class Sequential(Module):
    def __init__(self, *layers):
      self.layers = list(layers)
    def forward(self, x):
      for layer in self.layers: x = layer(x)
      return x

  class ModuleList(list):
    pass

  class GELU(Module):
    def forward(self, x): return x.gelu()

  class MaxPool2d(Module):
    def __init__(self, kernel_size: int, stride: int | None = None, padding: int = 0):
      self.kernel_size, self.stride, self.padding = kernel_size, stride or kernel_size, padding
    def forward(self, x):
      return x.max_pool2d((self.kernel_size, self.kernel_size), self.stride, padding=self.padding)

  class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size):
      if output_size not in (1, (1, 1)): raise NotImplementedError("the port pools to 1x1 only, as ResNet does")
    def forward(self, x): return x.mean((2, 3), keepdim=True)

  def linear(cin: int, cout: int, bias: bool = True): return tnn.Linear(cin, cout, bias=bias)

  nn = SimpleNamespace(Module=Module, Sequential=Sequential, ModuleList=ModuleList, GELU=GELU,
                       MaxPool2d=MaxPool2d, AdaptiveAvgPool2d=AdaptiveAvgPool2d, Conv2d=tnn.Conv2d,
                       BatchNorm2d=tnn.BatchNorm2d, Linear=linear, Embedding=tnn.Embedding, LayerNorm=tnn.LayerNorm)
  F = SimpleNamespace(relu=lambda x: x.relu(),
                      cross_entropy=lambda logits, labels: logits.sparse_categorical_crossentropy(labels),
                      scaled_dot_product_attention=lambda q, k, v, is_causal=False: q.scaled_dot_product_attention(
                        k, v, is_causal=is_causal))
  return SimpleNamespace(name="tinygrad", nn=nn, F=F, optim=tnn.optim, cat=lambda ts, dim: ts[0].cat(*ts[1:], dim=dim),
                         arange=Tensor.arange, no_grad=contextlib.nullcontext)
