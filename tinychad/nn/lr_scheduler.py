"""Learning-rate schedules: each step() sets optimizer.lr for the next step, as torch.optim.lr_scheduler does.

in: an Optimizer (its lr at construction is the base lr) and the schedule's settings
out: optimizer.lr updated on every scheduler.step(); get_last_lr() gives [lr] like PyTorch; state_dict() and
load_state_dict() resume a schedule, beside the optimizer's own.
Call optimizer.step() then scheduler.step(), once per epoch (StepLR, CosineAnnealingLR) or per batch (OneCycleLR).
Constructing a scheduler sets the lr for step 0, as in PyTorch.
"""
from __future__ import annotations
import math
from tinychad.nn.optim import Optimizer


class LRScheduler:
  def __init__(self, optimizer: Optimizer):
    self.optimizer = optimizer
    self.base_lr = optimizer.lr
    self.last_epoch = -1
    self.step()

  def get_lr(self) -> float:
    """The lr for step self.last_epoch (subclasses give the formula)."""
    raise NotImplementedError(f"{type(self).__name__} must define get_lr")

  def step(self) -> None:
    self.last_epoch += 1
    self._last_lr = self.get_lr()
    self.optimizer.lr = self._last_lr

  def get_last_lr(self) -> list[float]: return [self._last_lr]

  def state_dict(self) -> dict:
    """Everything but the optimizer (PyTorch's form): the step count, the base lr and the settings."""
    return {name: value for name, value in self.__dict__.items() if name != "optimizer"}

  def load_state_dict(self, state_dict: dict) -> None:
    """Resume: the schedule goes on from the saved step. As in PyTorch the optimizer's lr is not touched (its own
    state dict holds it)."""
    mine = self.state_dict()
    if set(state_dict) != set(mine):
      raise ValueError(f"{type(self).__name__}.load_state_dict: keys {sorted(state_dict)} don't match {sorted(mine)}")
    self.__dict__.update(state_dict)


class StepLR(LRScheduler):
  """lr = base_lr * gamma ** (epoch // step_size)."""
  def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1):
    self.step_size, self.gamma = step_size, gamma
    super().__init__(optimizer)

  def get_lr(self) -> float: return self.base_lr * self.gamma ** (self.last_epoch // self.step_size)


class CosineAnnealingLR(LRScheduler):
  """lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2 (PyTorch's closed form)."""
  def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0):
    self.T_max, self.eta_min = T_max, eta_min
    super().__init__(optimizer)

  def get_lr(self) -> float:
    return self.eta_min + (self.base_lr - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2


class OneCycleLR(LRScheduler):
  """Warm up from max_lr/div_factor to max_lr over pct_start of total_steps, then anneal to
  max_lr/(div_factor*final_div_factor) (cosine or linear). Step it once per batch.
  Unlike PyTorch it does not also cycle the momentum (PyTorch's cycle_momentum=False)."""
  def __init__(self, optimizer: Optimizer, max_lr: float, total_steps: int | None = None, epochs: int | None = None,
               steps_per_epoch: int | None = None, pct_start: float = 0.3, anneal_strategy: str = "cos",
               div_factor: float = 25.0, final_div_factor: float = 1e4, three_phase: bool = False):
    if total_steps is None:
      if epochs is None or steps_per_epoch is None: raise ValueError("OneCycleLR: give total_steps, or epochs and steps_per_epoch")
      total_steps = epochs * steps_per_epoch
    if anneal_strategy not in ("cos", "linear"): raise ValueError(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
    self.total_steps, self.anneal_strategy = total_steps, anneal_strategy
    initial, min_lr = max_lr / div_factor, max_lr / div_factor / final_div_factor
    warm_end = float(pct_start * total_steps) - 1
    # (last step of the phase, lr at its start, lr at its end), as PyTorch lays them out
    if three_phase:
      self.phases = [(warm_end, initial, max_lr), (2 * warm_end, max_lr, initial), (total_steps - 1, initial, min_lr)]
    else:
      self.phases = [(warm_end, initial, max_lr), (total_steps - 1, max_lr, min_lr)]
    super().__init__(optimizer)

  def _anneal(self, start: float, end: float, pct: float) -> float:
    if self.anneal_strategy == "cos": return end + (start - end) / 2 * (math.cos(math.pi * pct) + 1)
    return (end - start) * pct + start

  def get_lr(self) -> float:
    step = self.last_epoch
    # PyTorch allows total_steps calls to step(), so the usual `opt.step(); scheduler.step()` loop runs to its end
    if step > self.total_steps: raise ValueError(f"OneCycleLR: stepped {step} times, more than total_steps {self.total_steps}")
    phase_start = 0.0
    for phase_end, start, end in self.phases[:-1]:
      if step <= phase_end: return self._anneal(start, end, (step - phase_start) / (phase_end - phase_start))
      phase_start = phase_end
    phase_end, start, end = self.phases[-1]
    return self._anneal(start, end, (step - phase_start) / (phase_end - phase_start))
