"""Optimizers: they read each parameter's .grad and assign its new value; and gradient clipping.

in: a list of Tensors with requires_grad, or of parameter groups  ->  out: the same Tensors, updated in place by step().
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
  """Parameters come as a list of tensors or, as in PyTorch, a list of parameter groups: dicts with "params" and
  their own settings (lr, weight_decay, ...), the optimizer's arguments filling in the rest (nanoGPT's decay and
  no-decay groups). `param_groups[i]["lr"] = x` takes effect at the next step; `opt.lr` (what the schedulers set)
  reads group 0's lr, and setting it moves every group's lr by the same factor, keeping their ratios."""
  def __init__(self, params, **defaults):
    params = list(params)
    groups = params if params and isinstance(params[0], dict) else [{"params": params}]
    self.defaults, self.param_groups = defaults, []
    for group in groups:
      if "params" not in group: raise ValueError(f"{type(self).__name__}: a parameter group needs 'params', got keys {sorted(group)}")
      unknown = sorted(set(group) - set(defaults) - {"params"})
      if unknown: raise ValueError(f"{type(self).__name__}: unknown settings {unknown} in a parameter group (known: {sorted(defaults)})")
      tensors = [group["params"]] if isinstance(group["params"], Tensor) else list(group["params"])
      # frozen tensors (requires_grad=False) are skipped, so freezing a trunk is just a flag
      self.param_groups.append({**defaults, **group, "params": [p for p in tensors if p.requires_grad is not False]})
    self.params = [p for group in self.param_groups for p in group["params"]]
    if not self.params: raise ValueError(f"{type(self).__name__}: got no parameters to optimize")
    if len({id(p) for p in self.params}) != len(self.params): raise ValueError(f"{type(self).__name__}: a parameter appears twice")
    for group in self.param_groups:
      if group["lr"] < 0: raise ValueError(f"{type(self).__name__}: invalid learning rate {group['lr']}")
    for p in self.params: p.requires_grad = True
    self.groups = [group for group in self.param_groups for _ in group["params"]]   # each parameter's group
    self._lrs = {id(group): self._scalar(group["lr"]) for group in self.param_groups}
    self._lr_set = {id(group): group["lr"] for group in self.param_groups}

  def _scalar(self, value: float) -> Tensor:
    """A 0-d float64 tensor in a buffer on the parameters' device (a buffer, not a constant: see the module doc).
    float64 as Python's own float: a float64 parameter steps by exactly lr, and a 0-d tensor takes the dtype of the
    parameter it multiplies (float32 for float32 parameters, rounded once, as PyTorch rounds its Python float lr)."""
    return Tensor(np.array(value, dtype=np.float64), device=self.params[0].device, requires_grad=False)

  @property
  def lr(self) -> float: return float(self.param_groups[0]["lr"])

  @lr.setter
  def lr(self, value: float) -> None:
    # assigned now, outside the step: a TinyJit replaying the step runs none of its Python, only its kernels
    first = self.param_groups[0]["lr"]
    for group in self.param_groups:
      group["lr"] = value if group["lr"] == first else group["lr"] * value / first
      self._lr(group)

  def _lr(self, group: dict) -> Tensor:
    """The group's lr tensor, updated (an assign, not a new kernel) when its lr was changed since the last step.
    A `param_groups[i]["lr"] = x` is seen at the next step() that runs its Python: not by a TinyJit replay, which
    sees opt.lr = x (what the schedulers set) instead."""
    lr = self._lrs[id(group)]
    if self._lr_set[id(group)] != group["lr"]:
      lr.assign(self._scalar(group["lr"]))
      self._lr_set[id(group)] = group["lr"]
    return lr

  def zero_grad(self) -> None:
    for p in self.params: p.grad = None

  def _grads(self, weight_decay: str | None = "weight_decay"):
    """(index, parameter, gradient, group) for each parameter that has a gradient, with the group's L2 weight decay
    folded in (none when weight_decay is None)."""
    for i, p in enumerate(self.params):
      if p.grad is None: continue
      g, group = p.grad.detach(), self.groups[i]
      decay = group[weight_decay] if weight_decay else 0.0
      yield i, p, (g + decay * p.detach() if decay else g), group

  def _state(self) -> dict[str, list[Tensor | None]]:
    """The optimizer's per-parameter state tensors by name (subclasses list theirs)."""
    return {}

  def state_dict(self) -> dict:
    """{"state": {name: [tensor per parameter]}, "param_groups": [settings without the tensors]}, for resuming."""
    return {"state": {name: [None if t is None else t.detach() for t in tensors] for name, tensors in self._state().items()},
            "param_groups": [{k: v for k, v in group.items() if k != "params"} for group in self.param_groups]}

  def load_state_dict(self, state_dict: dict) -> None:
    groups = state_dict["param_groups"]
    if len(groups) != len(self.param_groups): raise ValueError(f"{type(self).__name__}.load_state_dict: {len(groups)} groups, expected {len(self.param_groups)}")
    for group, saved in zip(self.param_groups, groups): group.update(saved)
    own = self._state()
    for name, tensors in state_dict["state"].items():
      if name not in own or len(own[name]) != len(tensors):
        raise ValueError(f"{type(self).__name__}.load_state_dict: state {name!r} does not fit this optimizer")
      for i, value in enumerate(tensors):
        if value is None: continue
        if own[name][i] is None: own[name][i] = value.detach().contiguous()
        else: own[name][i].assign(value.detach().cast(own[name][i].dtype))
    self._realize(*[t for tensors in own.values() for t in tensors if t is not None])

  def _realize(self, *extra: Tensor) -> None:
    Tensor.realize(*self.params, *extra)


def _zeros_like(params: list[Tensor]) -> list[Tensor]:
  return [Tensor.zeros(p.shape, dtype=p.dtype, device=p.device).contiguous() for p in params]


class SGD(Optimizer):
  """PyTorch's SGD: v = momentum*v + (1-dampening)*g (v = g on the first step); step along g + momentum*v if nesterov else v."""
  def __init__(self, params, lr: float = 0.001, momentum: float = 0.0, weight_decay: float = 0.0,
               dampening: float = 0.0, nesterov: bool = False):
    super().__init__(params, lr=lr, momentum=momentum, weight_decay=weight_decay, dampening=dampening, nesterov=nesterov)
    for group in self.param_groups:
      if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
        raise ValueError("SGD: nesterov needs momentum > 0 and dampening 0")
    self.momentum, self.weight_decay, self.dampening, self.nesterov = momentum, weight_decay, dampening, nesterov
    self.velocity: list[Tensor | None] = [None] * len(self.params)

  def _state(self) -> dict[str, list[Tensor | None]]: return {"velocity": self.velocity}

  def step(self) -> None:
    lrs = {}   # each group's lr cast to each parameter dtype once per step, not once per parameter
    for i, p, g, group in self._grads():
      momentum = group["momentum"]
      if momentum:
        v = self.velocity[i]
        if v is None: v = self.velocity[i] = g.contiguous()
        else: v.assign(momentum * v + (1 - group["dampening"]) * g)
        g = g + momentum * v if group["nesterov"] else v
      if (id(group), g.dtype) not in lrs: lrs[(id(group), g.dtype)] = self._lr(group).cast(g.dtype)
      p.assign(p.detach() - lrs[(id(group), g.dtype)] * g)
    self._realize(*[v for v in self.velocity if v is not None])


class Adam(Optimizer):
  """PyTorch's Adam: m, v moving averages of g and g^2; p -= lr * m_hat / (sqrt(v_hat) + eps).
  weight_decay is L2 (added to the gradient); AdamW decouples it."""
  decoupled = False

  def __init__(self, params, lr: float = 0.001, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
               weight_decay: float = 0.0):
    super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    for group in self.param_groups:
      b1, b2 = group["betas"]
      if not (0 <= b1 < 1 and 0 <= b2 < 1): raise ValueError(f"{type(self).__name__}: invalid betas {group['betas']}")
    self.betas, self.eps, self.weight_decay = betas, eps, weight_decay
    self.m, self.v = _zeros_like(self.params), _zeros_like(self.params)
    # beta1**t and beta2**t of each group, kept as tensors and multiplied once per step
    self.powers = [self._scalar(1.0) for _ in range(2 * len(self.param_groups))]
    self.b1_t, self.b2_t = self.powers[0], self.powers[1]

  def _state(self) -> dict[str, list[Tensor | None]]: return {"m": self.m, "v": self.v, "powers": self.powers}

  def step(self) -> None:
    for k, group in enumerate(self.param_groups):
      for power, beta in zip(self.powers[2 * k:2 * k + 2], group["betas"]): power.assign(power * beta)
    # a group's 0-d factors, recorded once per step and cast once per parameter dtype, rather than both once per
    # parameter (eager, each is a few recorded ops; the cast is the one each product with a parameter would make)
    factors, cast = {}, {}
    for k, group in enumerate(self.param_groups):
      lr, b1_t, b2_t = self._lr(group), self.powers[2 * k], self.powers[2 * k + 1]
      decay = 1 - lr * group["weight_decay"] if self.decoupled and group["weight_decay"] else None
      factors[id(group)] = (decay, lr / (1 - b1_t), (1 - b2_t).sqrt())
    for i, p, g, group in self._grads(None if self.decoupled else "weight_decay"):
      if (id(group), p.dtype) not in cast:
        cast[(id(group), p.dtype)] = tuple(None if f is None else f.cast(p.dtype) for f in factors[id(group)])
      (b1, b2), (decay, step_size, bias2) = group["betas"], cast[(id(group), p.dtype)]
      if decay is not None: p.assign(p.detach() * decay)
      self.m[i].assign(b1 * self.m[i] + (1 - b1) * g)
      self.v[i].assign(b2 * self.v[i] + (1 - b2) * g * g)
      denom = self.v[i].sqrt() / bias2 + group["eps"]
      p.assign(p.detach() - step_size * self.m[i] / denom)
    self._realize(*self.m, *self.v, *self.powers)


class AdamW(Adam):
  """Adam with decoupled weight decay: p *= 1 - lr*weight_decay before the Adam step (PyTorch's default 0.01)."""
  decoupled = True

  def __init__(self, params, lr: float = 0.001, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
               weight_decay: float = 0.01):
    super().__init__(params, lr, betas, eps, weight_decay)


class RMSprop(Optimizer):
  """PyTorch's RMSprop: s = alpha*s + (1-alpha)*g^2; p -= lr * g / (sqrt(s) + eps), with optional momentum buffer
  and `centered` (divide by the estimated standard deviation: s - mean(g)^2)."""
  def __init__(self, params, lr: float = 0.01, alpha: float = 0.99, eps: float = 1e-8, weight_decay: float = 0.0,
               momentum: float = 0.0, centered: bool = False):
    super().__init__(params, lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum, centered=centered)
    self.alpha, self.eps, self.weight_decay, self.momentum, self.centered = alpha, eps, weight_decay, momentum, centered
    self.square_avg = _zeros_like(self.params)
    self.grad_avg = _zeros_like(self.params) if any(g["centered"] for g in self.param_groups) else []
    self.momentum_buffer = _zeros_like(self.params) if any(g["momentum"] for g in self.param_groups) else []

  def _state(self) -> dict[str, list[Tensor | None]]:
    return {"square_avg": self.square_avg, "grad_avg": self.grad_avg, "momentum_buffer": self.momentum_buffer}

  def step(self) -> None:
    for i, p, g, group in self._grads():
      alpha, momentum, lr = group["alpha"], group["momentum"], self._lr(group)
      s = self.square_avg[i].assign(alpha * self.square_avg[i] + (1 - alpha) * g * g)
      if group["centered"]:
        mean = self.grad_avg[i].assign(alpha * self.grad_avg[i] + (1 - alpha) * g)
        avg = (s - mean * mean).sqrt() + group["eps"]
      else:
        avg = s.sqrt() + group["eps"]
      if momentum:
        buf = self.momentum_buffer[i].assign(momentum * self.momentum_buffer[i] + g / avg)
        p.assign(p.detach() - lr * buf)
      else:
        p.assign(p.detach() - lr * g / avg)
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
