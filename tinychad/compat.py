"""The seed's names: where the project's first notes (the seed) looked for things, kept working.

in: nothing (tinychad/__init__.py imports this module)  ->  out: each seed-era name installed where the
seed's code looks for it, as an alias of today's name (or, for get_buffers, a short function over it):
  tinychad.tensor.tensor      Tensor (the seed's lower-case class name: `tensor.randn(3, 28, 28)`)
  tinychad.tensor.Linear      tinychad.nn.Linear (`from tinychad.tensor import tensor, Linear`)
  tinychad.optim              the module tinychad.nn.optim (`from tinychad.optim import SGD`)
  Tensor.exec()               Tensor.realize()
  Tensor.get_buffers()        (role, shape, dtype) of each buffer a realize needs (Tensor.schedule())
  Tensor.NLLLoss(target)      Tensor.nll_loss, the target given as a tensor or any array of class indices
  Tensor.logsoftmax(axis)     Tensor.log_softmax
LAZY=1, the seed's flag, needs nothing here: tinychad is always lazy. Everything else is the PyTorch
vocabulary of tensor.py and nn/.
"""
from __future__ import annotations
import sys
import numpy as np
import tinychad.nn.optim as optim
import tinychad.tensor as tensor_module
from tinychad.nn import Linear
from tinychad.tensor import Tensor


def get_buffers(self: Tensor) -> list[tuple[str, tuple[int, ...], str]]:
  """The buffers a realize needs: (role, shape, dtype) for each input and each buffer computed."""
  out, seen = [], set()
  for item in self.schedule():
    for inp in item.inputs:
      if inp.realized is not None and id(inp) not in seen:
        seen.add(id(inp))
        out.append(("input", inp.shape, inp.dtype.name))
    out.append(("output" if item.output is self.lazydata.base else "intermediate", item.output.shape, item.output.dtype.name))
  return out


def NLLLoss(self: Tensor, target) -> Tensor:  # noqa: N802 -- the seed's name
  """Mean negative log likelihood of `target` class indices under log-probabilities self."""
  return self.nll_loss(target if isinstance(target, Tensor) else Tensor(np.asarray(target)))


tensor_module.tensor = Tensor
tensor_module.Linear = Linear
# a module of another name: `import tinychad.optim` finds it in sys.modules (tinychad/__init__.py binds the attribute)
sys.modules["tinychad.optim"] = optim
Tensor.exec = Tensor.realize
Tensor.get_buffers = get_buffers
Tensor.NLLLoss = NLLLoss
Tensor.logsoftmax = Tensor.log_softmax
