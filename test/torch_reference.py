"""Compare tinychad with PyTorch: the same seeded inputs go through both, then values, result dtype
and the gradient of every float input must agree.

in: numpy arrays or shapes (made into seeded random float32 arrays), a function for torch and one for
    tinychad (the same function when the APIs agree)
out: an assertion error naming what differs; the tinychad outputs for further checks.
"""
from __future__ import annotations
import numpy as np
import torch
from tinychad import Tensor


def random_inputs(*shapes, low: float = -2.0, high: float = 2.0, seed: int = 0) -> list[np.ndarray]:
  rng = np.random.default_rng(seed)
  return [rng.uniform(low, high, shape).astype(np.float32) for shape in shapes]


def _as_list(out) -> list:
  return list(out) if isinstance(out, (list, tuple)) else [out]


def _dtype_name(torch_dtype: torch.dtype) -> str: return str(torch_dtype).removeprefix("torch.")


def compare(inputs, torch_fn, tinychad_fn=None, grad=True, atol: float = 1e-5, rtol: float = 1e-4, seed: int = 0) -> list[Tensor]:
  """Run `torch_fn` and `tinychad_fn` (default: torch_fn) on the same inputs and check they agree.

  `inputs` holds numpy arrays and/or shape tuples (seeded uniform(-2, 2) float32). Float inputs require
  grad when `grad` is set (True, False, or one flag per input); the outputs are then weighted by a seeded random upstream gradient and summed,
  and every float input's gradient is compared (PyTorch's None gradient must be None or all zeros here)."""
  tinychad_fn = tinychad_fn or torch_fn
  arrays = [a if isinstance(a, np.ndarray) else random_inputs(a, seed=seed + i)[0] for i, a in enumerate(inputs)]
  flags = grad if isinstance(grad, (tuple, list)) else (grad,) * len(arrays)
  wants_grad = [g and a.dtype.kind == "f" for g, a in zip(flags, arrays)]
  torch_in = [torch.tensor(a, requires_grad=g) for a, g in zip(arrays, wants_grad)]
  tc_in = [Tensor(a, requires_grad=g) for a, g in zip(arrays, wants_grad)]
  torch_out, tc_out = _as_list(torch_fn(*torch_in)), _as_list(tinychad_fn(*tc_in))
  assert len(torch_out) == len(tc_out), f"{len(tc_out)} outputs, torch has {len(torch_out)}"
  for k, (t, c) in enumerate(zip(torch_out, tc_out)):
    assert tuple(c.shape) == tuple(t.shape), f"output {k}: shape {c.shape}, torch {tuple(t.shape)}"
    assert c.dtype.name == _dtype_name(t.dtype), f"output {k}: dtype {c.dtype.name}, torch {t.dtype}"
    np.testing.assert_allclose(c.numpy(), t.detach().numpy(), atol=atol, rtol=rtol, err_msg=f"output {k} value")
  if not any(wants_grad): return tc_out
  weighted = [(t, c, random_inputs(tuple(t.shape), seed=seed + 100 + k)[0]) for k, (t, c) in enumerate(zip(torch_out, tc_out))
              if t.dtype.is_floating_point and t.requires_grad]
  if not weighted: return tc_out
  torch.autograd.backward([t for t, _, _ in weighted], [torch.tensor(u) for _, _, u in weighted])
  total = None
  for _, c, upstream in weighted:
    term = (c * Tensor(upstream)).sum()
    total = term if total is None else total + term
  total.backward()
  for k, (t, c, g) in enumerate(zip(torch_in, tc_in, wants_grad)):
    if not g: continue
    expected = np.zeros(t.shape, np.float32) if t.grad is None else t.grad.numpy()
    got = np.zeros(t.shape, np.float32) if c.grad is None else c.grad.numpy()
    assert got.shape == expected.shape, f"input {k}: gradient shape {got.shape}, torch {expected.shape}"
    np.testing.assert_allclose(got, expected, atol=atol, rtol=rtol, err_msg=f"input {k} gradient")
  return tc_out
