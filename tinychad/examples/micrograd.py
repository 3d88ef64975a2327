"""Where tinychad starts: reverse-mode autograd on scalars, and a tiny MLP trained with it.

in: nothing (a toy data set is made here)  ->  out: the training loss, printed as it falls.
Run `python -m tinychad.examples.micrograd`. docs/from-micrograd.md grows this, idea by idea, into
tinychad: scalars -> tensors, eager -> lazy, ops -> fused kernels, Python loops -> generated C.
Every Value remembers its parents and, computed on the way forward, the derivative of itself with
respect to each of them; backward() walks the graph once, outputs before inputs, applying the chain rule.
"""
from __future__ import annotations
import math
import random


class Value:
  """One number, the Values it was computed from, and (after backward) d(output)/d(this number)."""
  def __init__(self, data: float, parents: tuple[Value, ...] = (), local_grads: tuple[float, ...] = ()):
    self.data, self.grad = float(data), 0.0
    self.parents, self.local_grads = parents, local_grads   # local_grads[i] = d(self)/d(parents[i])

  def __repr__(self) -> str: return f"Value({self.data:.6g}, grad={self.grad:.6g})"

  def __add__(self, other) -> Value:
    other = other if isinstance(other, Value) else Value(other)
    return Value(self.data + other.data, (self, other), (1.0, 1.0))

  def __mul__(self, other) -> Value:
    other = other if isinstance(other, Value) else Value(other)
    return Value(self.data * other.data, (self, other), (other.data, self.data))

  def __pow__(self, k: float) -> Value: return Value(self.data ** k, (self,), (k * self.data ** (k - 1),))
  def relu(self) -> Value: return Value(max(self.data, 0.0), (self,), (float(self.data > 0),))

  def tanh(self) -> Value:
    t = math.tanh(self.data)
    return Value(t, (self,), (1 - t * t,))

  # the rest is composed from the ops above, as tinychad's Tensor composes its ops from a few Functions
  def __neg__(self) -> Value: return self * -1.0
  def __sub__(self, other) -> Value: return self + (-other)
  def __truediv__(self, other) -> Value: return self * other ** -1.0
  def __radd__(self, other) -> Value: return self + other
  def __rmul__(self, other) -> Value: return self * other
  def __rsub__(self, other) -> Value: return (-self) + other

  def backward(self) -> None:
    """Fill .grad of every Value this one depends on with d(self)/d(it)."""
    order, seen, stack = [], {id(self)}, [(self, iter(self.parents))]
    while stack:   # depth first, each node after all of its parents: a topological order
      node, pending = stack[-1]
      parent = next((p for p in pending if id(p) not in seen), None)
      if parent is None:
        order.append(stack.pop()[0])
      else:
        seen.add(id(parent))
        stack.append((parent, iter(parent.parents)))
    self.grad = 1.0
    for node in reversed(order):   # outputs first: a node's grad is complete before it passes it on
      for parent, local in zip(node.parents, node.local_grads): parent.grad += local * node.grad


class Neuron:
  def __init__(self, inputs: int, rng: random.Random, nonlinear: bool = True):
    # uniform on [-a, a] has variance a^2 / 3: this a gives each weight variance 1 / inputs, so a
    # neuron's output is about as large as its inputs, however many there are
    self.w = [Value(rng.uniform(-1, 1) * math.sqrt(3 / inputs)) for _ in range(inputs)]
    self.b, self.nonlinear = Value(0.0), nonlinear

  def __call__(self, x: list) -> Value:
    out = sum((wi * xi for wi, xi in zip(self.w, x)), self.b)
    return out.relu() if self.nonlinear else out

  def parameters(self) -> list[Value]: return self.w + [self.b]


class MLP:
  """Fully connected layers of `sizes` (inputs first), ReLU between them, a linear last layer."""
  def __init__(self, sizes: list[int], seed: int = 0):
    rng = random.Random(seed)
    self.layers = [[Neuron(n_in, rng, nonlinear=i < len(sizes) - 2) for _ in range(n_out)]
                   for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:]))]

  def __call__(self, x: list) -> list[Value]:
    for layer in self.layers: x = [neuron(x) for neuron in layer]
    return x

  def parameters(self) -> list[Value]: return [p for layer in self.layers for n in layer for p in n.parameters()]


def toy_data(n: int = 30, seed: int = 1) -> tuple[list[list[float]], list[float]]:
  """Points of the square [-1, 1]^2, labelled +1 inside the circle of radius 0.7 and -1 outside."""
  rng = random.Random(seed)
  xs = [[rng.uniform(-1, 1), rng.uniform(-1, 1)] for _ in range(n)]
  return xs, [1.0 if x * x + y * y < 0.49 else -1.0 for x, y in xs]


def mse(model: MLP, xs: list, ys: list[float]) -> Value:
  return sum(((model(x)[0] - y) ** 2 for x, y in zip(xs, ys)), Value(0.0)) / len(xs)


def train(steps: int = 60, lr: float = 0.2, verbose: bool = True) -> list[float]:
  """Full-batch gradient descent on the toy data; the loss before each step."""
  xs, ys = toy_data()
  model, losses = MLP([2, 16, 1]), []
  for step in range(steps):
    loss = mse(model, xs, ys)
    for p in model.parameters(): p.grad = 0.0
    loss.backward()
    for p in model.parameters(): p.data -= lr * p.grad
    losses.append(loss.data)
    if verbose and (step % 10 == 0 or step == steps - 1): print(f"step {step:3d}  loss {loss.data:.4f}")
  if verbose:
    right = sum((model(x)[0].data > 0) == (y > 0) for x, y in zip(xs, ys))
    print(f"{right}/{len(ys)} points on the right side of the circle")
  return losses


if __name__ == "__main__":
  train()
