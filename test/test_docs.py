"""The docs' claims, run: the scalar engine of docs/from-micrograd.md (tinychad/examples/micrograd.py)
computes the same gradients as tinychad on the same MLP, its training loss falls, and docs/pipeline.md
is what docs/make_pipeline.py writes from a real run today."""
from __future__ import annotations
import pathlib
import re
import subprocess
import sys
import numpy as np
import pytest
from tinychad import Tensor, dtypes
from tinychad.device import Device
from tinychad.examples import micrograd

ROOT = pathlib.Path(__file__).resolve().parents[1]


def tinychad_mlp_loss(model: micrograd.MLP, xs: list, ys: list) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
  """The micrograd MLP's mean squared error written with tinychad Tensors (float64), and its (weight, bias) pairs."""
  h, params = Tensor(np.array(xs), dtype=dtypes.float64), []
  for i, layer in enumerate(model.layers):
    w = Tensor(np.array([[wi.data for wi in neuron.w] for neuron in layer]), dtype=dtypes.float64, requires_grad=True)
    b = Tensor(np.array([neuron.b.data for neuron in layer]), dtype=dtypes.float64, requires_grad=True)
    params.append((w, b))
    h = h @ w.T + b
    if i < len(model.layers) - 1: h = h.relu()
  return ((h.reshape(-1) - Tensor(np.array(ys), dtype=dtypes.float64)) ** 2).mean(), params


def test_scalar_engine_gradients_equal_tinychads():
  model = micrograd.MLP([3, 5, 4, 1], seed=3)
  xs = [[0.5, -1.0, 2.0], [1.5, 0.25, -0.75], [-0.3, 0.8, 0.1], [2.0, -0.5, 0.6]]
  ys = [1.0, -1.0, 0.5, 0.0]
  loss = micrograd.mse(model, xs, ys)
  loss.backward()
  tc_loss, params = tinychad_mlp_loss(model, xs, ys)
  tc_loss.backward()
  np.testing.assert_allclose(tc_loss.item(), loss.data, rtol=0, atol=1e-6)
  for (w, b), layer in zip(params, model.layers):
    np.testing.assert_allclose(w.grad.numpy(), [[wi.grad for wi in neuron.w] for neuron in layer], rtol=0, atol=1e-6)
    np.testing.assert_allclose(b.grad.numpy(), [neuron.b.grad for neuron in layer], rtol=0, atol=1e-6)
  # the check has teeth: some hidden unit is off (ReLU's zero gradient) and some gradients are large
  grads = np.concatenate([w.grad.numpy().ravel() for w, _ in params])
  assert (grads == 0).any() and np.abs(grads).max() > 0.1


def test_scalar_engine_rules_one_by_one():
  x, y = micrograd.Value(1.5), micrograd.Value(-2.0)
  out = (x * y + x ** 3 - y / x + (x - y).tanh() + (-x).relu() + y.relu() + 2 * x)
  out.backward()
  # d/dx: y + 3x^2 + y/x^2 + (1 - tanh(x-y)^2) + 0 + 2; d/dy: x - 1/x - (1 - tanh(x-y)^2)
  sech2 = 1 - np.tanh(3.5) ** 2
  assert x.grad == pytest.approx(-2.0 + 3 * 1.5 ** 2 + -2.0 / 1.5 ** 2 + sech2 + 2)
  assert y.grad == pytest.approx(1.5 - 1 / 1.5 - sech2)


def test_micrograd_example_loss_falls():
  losses = micrograd.train(steps=25, verbose=False)
  assert losses[-1] < 0.8 * losses[0], losses


def test_from_micrograd_snippets_run(capsys):
  """Every ```python block of docs/from-micrograd.md, in order, in one namespace, as a reader would paste them."""
  text = (ROOT / "docs" / "from-micrograd.md").read_text()
  blocks = re.findall(r"```python\n(.*?)```", text, re.S)
  assert len(blocks) >= 5
  namespace: dict = {}
  for number, block in enumerate(blocks):
    exec(compile(block, f"docs/from-micrograd.md block {number}", "exec"), namespace)
  out = capsys.readouterr().out
  assert out.count("5.5 [1.0, -2.0, 3.0]") == 2 and "8.5" in out


@pytest.mark.skipif(not Device.available("CPU"), reason="docs/pipeline.md follows a kernel to C: needs the CPU device")
def test_pipeline_page_is_current():
  script = ROOT / "docs" / "make_pipeline.py"
  res = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
  assert res.returncode == 0, res.stdout + res.stderr
