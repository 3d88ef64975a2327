"""Compare a whole tinychad model with its PyTorch twin: the same weights (moved through a safetensors file
written by safetensors.torch, as a user's checkpoint would be), then outputs, every parameter's gradient, and
the losses of a few optimizer steps.

in: a tinychad model and a torch.nn.Module whose state_dict names agree, a loss function for each
out: assertion errors naming the output, parameter or step that differs.
"""
from __future__ import annotations
from typing import Callable
import numpy as np
import torch
from safetensors.torch import save_file
from tinychad import Tensor
from tinychad.nn.state import load_weights


def torch_checkpoint(twin: torch.nn.Module, path) -> str:
  """twin's state dict saved with safetensors.torch (what a PyTorch user hands over); returns the path."""
  save_file({k: v.detach().contiguous() for k, v in twin.state_dict().items()}, str(path))
  return str(path)


def load_twin(model, twin: torch.nn.Module, path, **kwargs) -> None:
  """Copy twin's weights into model through a safetensors file, strictly by name."""
  load_weights(model, torch_checkpoint(twin, path), **kwargs)


def assert_close(got: np.ndarray, expected: np.ndarray, what: str, rtol: float = 2e-3, atol_scale: float = 2e-4) -> None:
  """allclose with an absolute tolerance relative to the reference's largest value: gradients of deep float32
  models cancel to tiny values whose rounding differs between the two kernels' summation orders."""
  atol = atol_scale * max(float(np.abs(expected).max(initial=0.0)), 1e-6)
  np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, err_msg=what)


def assert_same_grads(model, twin: torch.nn.Module, **tol) -> int:
  """Every parameter of twin has a gradient equal to model's parameter of the same name; returns how many."""
  ours = dict(model.named_parameters())
  assert sorted(ours) == sorted(n for n, _ in twin.named_parameters()), "parameter names differ"
  grads = {name: p.grad.numpy() if p.grad is not None else np.zeros(tuple(p.shape), np.float32)
           for name, p in twin.named_parameters()}
  # a gradient that is zero in exact arithmetic (attention's key bias: softmax ignores a shift shared by a whole
  # row) is rounding noise in both; it must stay that small next to the model's largest gradient
  noise = 1e-6 * max(float(np.abs(g).max(initial=0.0)) for g in grads.values())
  for name, expected in grads.items():
    got = ours[name].grad.numpy() if ours[name].grad is not None else np.zeros(ours[name].shape, np.float32)
    if np.abs(expected).max(initial=0.0) < noise: assert np.abs(got).max(initial=0.0) < 10 * noise, f"gradient of {name}"
    else: assert_close(got, expected, f"gradient of {name}", **tol)
  return len(ours)


def assert_same_training(model, twin: torch.nn.Module, loss_fn: Callable[[object], Tensor],
                         torch_loss_fn: Callable[[torch.nn.Module], torch.Tensor], make_opt, make_torch_opt,
                         steps: int = 3, rtol: float = 1e-3) -> list[float]:
  """Run `steps` optimizer steps on both (loss_fn(model) / torch_loss_fn(twin) compute a batch's loss);
  the losses must agree at every step. Returns tinychad's losses."""
  opt, torch_opt = make_opt(model), make_torch_opt(twin)
  losses = []
  for step in range(steps):
    opt.zero_grad()
    torch_opt.zero_grad()
    loss, torch_loss = loss_fn(model), torch_loss_fn(twin)
    loss.backward()
    torch_loss.backward()
    opt.step()
    torch_opt.step()
    losses.append(loss.item())
    np.testing.assert_allclose(losses[-1], torch_loss.item(), rtol=rtol, atol=1e-5, err_msg=f"loss at step {step}")
  return losses


def to_torch(array: np.ndarray) -> torch.Tensor: return torch.from_numpy(np.ascontiguousarray(array))
