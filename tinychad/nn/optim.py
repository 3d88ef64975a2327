"""Optimizers: they read each parameter's .grad and assign its new value; and gradient clipping.

in: a list of Tensors with requires_grad  ->  out: the same Tensors, updated in place by step().
The update rules are PyTorch's (torch.optim), step for step. Anything that changes between steps (the
learning rate a scheduler sets, Adam's bias corrections) lives in a Tensor, not in a Python number: numbers
are compiled into the kernels as constants, so a changing number would compile new kernels every step.
Each step ends in one realize of the parameters and the optimizer state, so no graph grows across steps.
"""
from __future__ import annotations
import math
import numpy as np
from tinychad.tensor import Tensor


class Optimizer:
  def __init__(self, params: list[Tensor], lr: float):
    # frozen tensors (requires_grad=False) are skipped, so freezing a trunk is just a flag
    self.params = [p for p in params if p.requires_grad is not False]
    for p in self.params: p.requires_grad = True
    if not self.params: raise ValueError(f"{type(self).__name__}: got no parameters to optimize")
    if lr < 0: raise ValueError(f"{type(self).__name__}: invalid learning rate {lr}")
    self._lr = self._scalar(lr)

  def _scalar(self, value: float) -> Tensor:
    """A 0-d float tensor in a buffer on the parameters' device (a buffer, not a constant: see the module doc)."""
    return Tensor(np.array(value, dtype=np.float32), device=self.params[0].device)

  @property
  def lr(self) -> float: return float(self._lr.item())

  @lr.setter
  def lr(self, value: float) -> None: self._lr.assign(self._scalar(value))

  def _zeros(self) -> list[Tensor]:
    """A zero buffer per parameter (its shape, dtype and device): optimizer state that step() assigns to."""
    return [Tensor.zeros(p.shape, dtype=p.dtype, device=p.device).contiguous() for p in self.params]

  def zero_grad(self) -> None:
    for p in self.params: p.grad = None

  def _grads(self, weight_decay: float = 0.0):
    """(index, parameter, gradient) for each parameter that has a gradient, with L2 weight decay folded in."""
    for i, p in enumerate(self.params):
      if p.grad is None: continue
      g = p.grad.detach()
      yield i, p, (g + weight_decay * p.detach() if weight_decay else g)

  def _realize(self, *extra: Tensor) -> None:
    Tensor.realize(*self.params, *extra)


class SGD(Optimizer):
  """PyTorch's SGD: v = momentum*v + (1-dampening)*g (v = g on the first step); step along g + momentum*v if nesterov else v."""
  def __init__(self, params: list[Tensor], lr: float = 0.001, momentum: float = 0.0, weight_decay: float = 0.0,
               dampening: float = 0.0, nesterov: bool = False):
    super().__init__(params, lr)
    if nesterov and (momentum <= 0 or dampening != 0): raise ValueError("SGD: nesterov needs momentum > 0 and dampening 0")
    self.momentum, self.weight_decay, self.dampening, self.nesterov = momentum, weight_decay, dampening, nesterov
    self.velocity: list[Tensor | None] = [None] * len(self.params)

  def step(self) -> None:
    for i, p, g in self._grads(self.weight_decay):
      if self.momentum:
        v = self.velocity[i]
        if v is None: v = self.velocity[i] = g.contiguous()
        else: v.assign(self.momentum * v + (1 - self.dampening) * g)
        g = g + self.momentum * v if self.nesterov else v
      p.assign(p.detach() - self._lr * g)
    self._realize(*[v for v in self.velocity if v is not None])


class Adam(Optimizer):
  """PyTorch's Adam: m, v moving averages of g and g^2; p -= lr * m_hat / (sqrt(v_hat) + eps).
  weight_decay is L2 (added to the gradient); AdamW decouples it."""
  decoupled = False

  def __init__(self, params: list[Tensor], lr: float = 0.001, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
               weight_decay: float = 0.0):
    super().__init__(params, lr)
    if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1): raise ValueError(f"{type(self).__name__}: invalid betas {betas}")
    self.betas, self.eps, self.weight_decay = betas, eps, weight_decay
    self.m, self.v = self._zeros(), self._zeros()
    # beta1**t and beta2**t, kept as tensors and multiplied once per step
    self.b1_t, self.b2_t = self._scalar(1.0), self._scalar(1.0)

  def step(self) -> None:
    b1, b2 = self.betas
    self.b1_t.assign(self.b1_t * b1)
    self.b2_t.assign(self.b2_t * b2)
    for i, p, g in self._grads(0.0 if self.decoupled else self.weight_decay):
      if self.decoupled and self.weight_decay: p.assign(p.detach() * (1 - self._lr * self.weight_decay))
      self.m[i].assign(b1 * self.m[i] + (1 - b1) * g)
      self.v[i].assign(b2 * self.v[i] + (1 - b2) * g * g)
      denom = self.v[i].sqrt() / (1 - self.b2_t).sqrt() + self.eps
      p.assign(p.detach() - (self._lr / (1 - self.b1_t)) * self.m[i] / denom)
    self._realize(*self.m, *self.v, self.b1_t, self.b2_t)


class AdamW(Adam):
  """Adam with decoupled weight decay: p *= 1 - lr*weight_decay before the Adam step (PyTorch's default 0.01)."""
  decoupled = True

  def __init__(self, params: list[Tensor], lr: float = 0.001, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
               weight_decay: float = 0.01):
    super().__init__(params, lr, betas, eps, weight_decay)


class RMSprop(Optimizer):
  """PyTorch's RMSprop: s = alpha*s + (1-alpha)*g^2; p -= lr * g / (sqrt(s) + eps), with optional momentum buffer
  and `centered` (divide by the estimated standard deviation: s - mean(g)^2)."""
  def __init__(self, params: list[Tensor], lr: float = 0.01, alpha: float = 0.99, eps: float = 1e-8, weight_decay: float = 0.0,
               momentum: float = 0.0, centered: bool = False):
    super().__init__(params, lr)
    self.alpha, self.eps, self.weight_decay, self.momentum, self.centered = alpha, eps, weight_decay, momentum, centered
    self.square_avg = self._zeros()
    self.grad_avg = self._zeros() if centered else []
    self.momentum_buffer = self._zeros() if momentum else []

  def step(self) -> None:
    for i, p, g in self._grads(self.weight_decay):
      s = self.square_avg[i].assign(self.alpha * self.square_avg[i] + (1 - self.alpha) * g * g)
      if self.centered:
        mean = self.grad_avg[i].assign(self.alpha * self.grad_avg[i] + (1 - self.alpha) * g)
        avg = (s - mean * mean).sqrt() + self.eps
      else:
        avg = s.sqrt() + self.eps
      if self.momentum:
        buf = self.momentum_buffer[i].assign(self.momentum * self.momentum_buffer[i] + g / avg)
        p.assign(p.detach() - self._lr * buf)
      else:
        p.assign(p.detach() - self._lr * g / avg)
    self._realize(*self.square_avg, *self.grad_avg, *self.momentum_buffer)


def clip_grad_norm_(params: list[Tensor], max_norm: float, norm_type: float = 2.0) -> Tensor:
  """Scale all gradients together so their joint norm is at most max_norm (PyTorch's torch.nn.utils.clip_grad_norm_).

  Returns the total norm before clipping. The scale is computed as a tensor, so no sync with the host is needed.
  """
  grads = [p.grad for p in params if p.grad is not None]
  if not grads: return Tensor(0.0)
  if norm_type == math.inf:
    total = Tensor.stack(*[g.abs().max() for g in grads]).max()
  else:
    total = Tensor.stack(*[(g.abs() ** norm_type).sum() for g in grads]).sum() ** (1 / norm_type)
  scale = (max_norm / (total + 1e-6)).minimum(1.0)
  for p in params:
    if p.grad is not None: p.grad = (p.grad * scale).realize()
  return total.realize()
