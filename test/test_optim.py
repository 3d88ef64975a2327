"""Optimizers, schedulers and gradient clipping against torch.optim: same start, same gradients -> same numbers."""
from __future__ import annotations
import math
import numpy as np
import pytest
import torch
from tinychad import Tensor
from tinychad.nn.lr_scheduler import CosineAnnealingLR, OneCycleLR, StepLR
from tinychad.nn.optim import SGD, Adam, AdamW, RMSprop, clip_grad_norm_

W0 = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
B0 = np.random.default_rng(1).standard_normal(3).astype(np.float32)
X = np.random.default_rng(2).standard_normal((5, 4)).astype(np.float32)


def run_ours(make, steps: int = 5) -> list[np.ndarray]:
  w, b = Tensor(W0, requires_grad=True), Tensor(B0, requires_grad=True)
  opt = make([w, b])
  for _ in range(steps):
    opt.zero_grad()
    ((Tensor(X) @ w + b).tanh().square().sum() + w.abs().sum()).backward()
    opt.step()
  return [w.numpy(), b.numpy()]


def run_torch(make, steps: int = 5) -> list[np.ndarray]:
  w, b = torch.tensor(W0, requires_grad=True), torch.tensor(B0, requires_grad=True)
  opt = make([w, b])
  for _ in range(steps):
    opt.zero_grad()
    ((torch.tensor(X) @ w + b).tanh().square().sum() + w.abs().sum()).backward()
    opt.step()
  return [w.detach().numpy(), b.detach().numpy()]


CASES = [
  (SGD, torch.optim.SGD, {"lr": 0.05}),
  (SGD, torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
  (SGD, torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "dampening": 0.3, "weight_decay": 0.1}),
  (SGD, torch.optim.SGD, {"lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 0.01}),
  (Adam, torch.optim.Adam, {"lr": 0.02}),
  (Adam, torch.optim.Adam, {"lr": 0.02, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1}),
  (AdamW, torch.optim.AdamW, {"lr": 0.02}),
  (AdamW, torch.optim.AdamW, {"lr": 0.02, "weight_decay": 0.5, "betas": (0.5, 0.9)}),
  (RMSprop, torch.optim.RMSprop, {"lr": 0.01}),
  (RMSprop, torch.optim.RMSprop, {"lr": 0.01, "alpha": 0.9, "momentum": 0.5, "weight_decay": 0.1}),
  (RMSprop, torch.optim.RMSprop, {"lr": 0.01, "centered": True, "momentum": 0.3}),
]


@pytest.mark.parametrize("ours,theirs,kwargs", CASES, ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)])
def test_five_steps_match_torch(ours, theirs, kwargs):
  for a, b in zip(run_ours(lambda p: ours(p, **kwargs)), run_torch(lambda p: theirs(p, **kwargs))):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_step_keeps_graphs_and_kernels_flat():
  """After step() the parameters and the state are realized buffers: nothing of the step's graph is kept."""
  w = Tensor(W0, requires_grad=True)
  opt = Adam([w], lr=0.1)
  for _ in range(3):
    opt.zero_grad()
    (w * w).sum().backward()
    opt.step()
  for t in (w, *opt.m, *opt.v, opt.b1_t, opt.b2_t):
    assert t.lazydata.is_realized, "optimizer state left unrealized: graphs would grow step after step"


def test_frozen_and_gradless_parameters_are_left_alone():
  frozen = Tensor(W0, requires_grad=False)
  unused = Tensor(B0, requires_grad=True)
  w = Tensor(W0, requires_grad=True)
  opt = SGD([frozen, unused, w], lr=0.1, momentum=0.9)
  assert all(p is not frozen for p in opt.params)
  (w.sum() * 2).backward()
  opt.step()
  np.testing.assert_array_equal(unused.numpy(), B0)
  np.testing.assert_allclose(w.numpy(), W0 - 0.2, rtol=1e-6)
  with pytest.raises(ValueError, match="no parameters"): SGD([frozen])
  with pytest.raises(ValueError, match="nesterov"): SGD([w], nesterov=True)


def lr_sequence(scheduler, opt, steps: int) -> list[float]:
  """The lr of each of `steps` optimizer steps (the scheduler steps between them; OneCycleLR allows no more)."""
  out = []
  for i in range(steps):
    out.append(opt.lr if not isinstance(opt, torch.optim.Optimizer) else opt.param_groups[0]["lr"])
    opt.step()
    if i < steps - 1: scheduler.step()
  return out


@pytest.mark.parametrize("ours,theirs,kwargs,steps", [
  (StepLR, torch.optim.lr_scheduler.StepLR, {"step_size": 3, "gamma": 0.5}, 10),
  (CosineAnnealingLR, torch.optim.lr_scheduler.CosineAnnealingLR, {"T_max": 7, "eta_min": 0.001}, 12),
  (OneCycleLR, torch.optim.lr_scheduler.OneCycleLR, {"max_lr": 0.5, "total_steps": 20}, 20),
  (OneCycleLR, torch.optim.lr_scheduler.OneCycleLR, {"max_lr": 0.5, "epochs": 3, "steps_per_epoch": 5,
                                                     "anneal_strategy": "linear", "pct_start": 0.2}, 15),
  (OneCycleLR, torch.optim.lr_scheduler.OneCycleLR, {"max_lr": 0.3, "total_steps": 17, "three_phase": True}, 17),
])
def test_scheduler_lr_sequence_matches_torch(ours, theirs, kwargs, steps):
  opt = SGD([Tensor(W0, requires_grad=True)], lr=0.1)
  topt = torch.optim.SGD([torch.tensor(W0, requires_grad=True)], lr=0.1)
  # PyTorch's OneCycleLR also cycles momentum by default; ours schedules the lr only
  extra = {"cycle_momentum": False} if ours is OneCycleLR else {}
  ours_lrs = lr_sequence(ours(opt, **kwargs), opt, steps)
  theirs_lrs = lr_sequence(theirs(topt, **kwargs, **extra), topt, steps)
  np.testing.assert_allclose(ours_lrs, theirs_lrs, rtol=1e-5, atol=1e-8)


def test_scheduler_drives_training_like_torch():
  """lr changes reach the update (the lr lives in a tensor, so the compiled step picks up the new value)."""
  def ours(p):
    opt = SGD(p, lr=0.1, momentum=0.9)
    sched = StepLR(opt, step_size=2, gamma=0.3)
    return _stepping(opt, sched)

  def theirs(p):
    opt = torch.optim.SGD(p, lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.3)
    return _stepping(opt, sched)
  for a, b in zip(run_ours(ours, 6), run_torch(theirs, 6)): np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


class _stepping:
  """An optimizer whose step() also steps its scheduler, so run_ours/run_torch can drive both."""
  def __init__(self, opt, sched): self.opt, self.sched = opt, sched
  def zero_grad(self): self.opt.zero_grad()
  def step(self):
    self.opt.step()
    self.sched.step()


def test_onecycle_steps_after_every_batch_like_torch():
  # the usual loop steps the scheduler after each of the total_steps batches, the last one too; one more is an error
  opt = SGD([Tensor(W0, requires_grad=True)], lr=0.1)
  topt = torch.optim.SGD([torch.tensor(W0, requires_grad=True)], lr=0.1)
  ours, theirs = OneCycleLR(opt, max_lr=0.5, total_steps=4), torch.optim.lr_scheduler.OneCycleLR(topt, max_lr=0.5, total_steps=4, cycle_momentum=False)
  for _ in range(4):
    opt.step()
    ours.step()
    topt.step()
    theirs.step()
  np.testing.assert_allclose(ours.get_last_lr(), theirs.get_last_lr(), rtol=1e-5)
  with pytest.raises(ValueError, match="total_steps"): ours.step()


def test_onecycle_needs_a_length():
  with pytest.raises(ValueError, match="total_steps"): OneCycleLR(SGD([Tensor(W0, requires_grad=True)]), max_lr=1.0)


@pytest.mark.parametrize("max_norm,norm_type", [(1.0, 2.0), (100.0, 2.0), (0.5, math.inf), (2.0, 1.0)])
def test_clip_grad_norm_matches_torch(max_norm, norm_type):
  grads = [np.random.default_rng(i).standard_normal(s).astype(np.float32) for i, s in enumerate([(4, 3), (3,), (2, 2)])]
  ours = [Tensor(np.zeros_like(g), requires_grad=True) for g in grads]
  theirs = [torch.zeros(g.shape, requires_grad=True) for g in grads]
  for p, q, g in zip(ours, theirs, grads):
    p.grad, q.grad = Tensor(g), torch.tensor(g)
  total = clip_grad_norm_(ours, max_norm, norm_type)
  total_t = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type)
  np.testing.assert_allclose(total.item(), total_t.item(), rtol=1e-5)
  for p, q in zip(ours, theirs): np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, atol=1e-7)


# ---- issue 23: lr in the parameter's dtype; buffers and plain tensor attributes never trained ----
@pytest.mark.parametrize("make", [lambda p: SGD(p, lr=0.1), lambda p: SGD(p, lr=0.1, momentum=0.9), lambda p: RMSprop(p, lr=0.1)])
def test_float64_parameters_step_like_torch_float64(make):
  w = Tensor(np.array([1.0, -2.0, 3.0]), requires_grad=True)
  tw = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64, requires_grad=True)
  theirs = {SGD: torch.optim.SGD, RMSprop: torch.optim.RMSprop}
  opt = make([w])
  topt = theirs[type(opt)]([tw], lr=0.1, **({"momentum": opt.momentum} if isinstance(opt, SGD) else {}))
  for _ in range(3):
    opt.zero_grad()
    topt.zero_grad()
    (w * w).sum().backward()
    (tw * tw).sum().backward()
    opt.step()
    topt.step()
  np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-15, atol=0)


def test_float64_sgd_steps_by_exactly_lr():
  w = Tensor(np.array([1.0]), requires_grad=True)
  opt = SGD([w], lr=0.1)
  w.sum().backward()
  opt.step()
  assert w.numpy()[0] == 1.0 - 0.1  # 0.10000000149 when lr was kept in float32
  assert opt.lr == 0.1


def test_buffers_and_plain_tensor_attributes_are_never_trained():
  from tinychad import nn
  class Rotary(nn.Module):
    def __init__(self):
      super().__init__()
      self.proj = nn.Linear(4, 4)
      self.table = Tensor(np.linspace(0, 1, 4, dtype=np.float32))         # a plain attribute: PyTorch's rule, not state
      self.register_buffer("mask", Tensor.ones(4))                         # a buffer: saved, never trained
      self.register_buffer("cache", Tensor.zeros(4), persistent=False)     # neither saved nor trained
    def forward(self, x): return self.proj(x * self.table * self.mask + self.cache)
  model = Rotary()
  table, mask = model.table.numpy().copy(), model.mask.numpy().copy()
  opt = SGD(model.parameters(), lr=0.5)
  assert len(opt.params) == 2
  for _ in range(3):
    opt.zero_grad()
    model(Tensor.ones(2, 4)).square().sum().backward()
    opt.step()
  np.testing.assert_array_equal(model.table.numpy(), table)
  np.testing.assert_array_equal(model.mask.numpy(), mask)
  np.testing.assert_array_equal(model.cache.numpy(), np.zeros(4))
  assert model.mask.grad is None and model.cache.grad is None


def test_param_groups_match_torch():
  """nanoGPT's split: weights decay, biases don't, each group with its own lr; plus a scheduler over both groups."""
  def groups(w, b): return [{"params": [w], "weight_decay": 0.1}, {"params": [b], "weight_decay": 0.0, "lr": 0.01}]
  for ours, theirs, kwargs in [(AdamW, torch.optim.AdamW, {"lr": 0.05, "betas": (0.8, 0.9)}),
                               (SGD, torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
                               (RMSprop, torch.optim.RMSprop, {"lr": 0.05})]:
    got = run_ours(lambda p: ours(groups(*p), **kwargs))
    want = run_torch(lambda p: theirs(groups(*p), **kwargs))
    for a, b in zip(got, want): np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5, err_msg=ours.__name__)
  with pytest.raises(ValueError, match="unknown settings"): SGD([{"params": [Tensor.ones(1)], "betas": (0.9, 0.9)}])
  with pytest.raises(ValueError, match="twice"):
    w = Tensor.ones(1, requires_grad=True)
    SGD([{"params": [w]}, {"params": [w]}])


def test_group_lr_edit_and_scheduler_keep_ratios():
  w, b = Tensor(W0, requires_grad=True), Tensor(B0, requires_grad=True)
  opt = SGD([{"params": [w]}, {"params": [b], "lr": 0.01}], lr=0.1)
  StepLR(opt, step_size=1, gamma=0.5).step()
  assert [g["lr"] for g in opt.param_groups] == [0.05, 0.005]
  opt.param_groups[1]["lr"] = 1.0   # PyTorch's habit: takes effect at the next step
  b0 = b.numpy().copy()
  b.sum().backward()
  opt.step()
  np.testing.assert_allclose(b.numpy(), b0 - 1.0, rtol=1e-6)


def test_optimizer_state_dict_resumes():
  def train(opt, w, b, steps):
    for _ in range(steps):
      opt.zero_grad()
      ((Tensor(X) @ w + b).tanh().square().sum()).backward()
      opt.step()
  w, b = Tensor(W0, requires_grad=True), Tensor(B0, requires_grad=True)
  opt = Adam([w, b], lr=0.05)
  train(opt, w, b, 3)
  saved, w_saved, b_saved = opt.state_dict(), w.numpy().copy(), b.numpy().copy()
  train(opt, w, b, 2)
  w2, b2 = Tensor(w_saved, requires_grad=True), Tensor(b_saved, requires_grad=True)
  resumed = Adam([w2, b2], lr=0.05)
  resumed.load_state_dict(saved)
  train(resumed, w2, b2, 2)
  np.testing.assert_allclose(w2.numpy(), w.numpy(), rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(b2.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("make", [lambda opt: StepLR(opt, step_size=2, gamma=0.5), lambda opt: CosineAnnealingLR(opt, T_max=6),
                                  lambda opt: OneCycleLR(opt, max_lr=0.1, total_steps=8)], ids=["step", "cosine", "onecycle"])
def test_scheduler_state_dict_resumes_training(make):
  def train(opt, sched, w, b, steps):
    for _ in range(steps):
      opt.zero_grad()
      ((Tensor(X) @ w + b).tanh().square().sum()).backward()
      opt.step()
      sched.step()
  w, b = Tensor(W0, requires_grad=True), Tensor(B0, requires_grad=True)
  opt = SGD([w, b], lr=0.1, momentum=0.9)
  sched = make(opt)
  train(opt, sched, w, b, 3)
  saved_opt, saved_sched, w_saved, b_saved = opt.state_dict(), sched.state_dict(), w.numpy().copy(), b.numpy().copy()
  assert "optimizer" not in saved_sched and saved_sched["last_epoch"] == 3
  train(opt, sched, w, b, 4)
  w2, b2 = Tensor(w_saved, requires_grad=True), Tensor(b_saved, requires_grad=True)
  opt2 = SGD([w2, b2], lr=0.1, momentum=0.9)
  sched2 = make(opt2)
  opt2.load_state_dict(saved_opt)
  sched2.load_state_dict(saved_sched)
  train(opt2, sched2, w2, b2, 4)
  assert sched2.get_last_lr() == sched.get_last_lr() and sched2.last_epoch == sched.last_epoch == 7
  np.testing.assert_allclose(w2.numpy(), w.numpy(), rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(b2.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)
  with pytest.raises(ValueError, match="load_state_dict"): sched2.load_state_dict({"last_epoch": 1})
