"""The examples from the project's seed notes run as written."""
from __future__ import annotations
import os
import subprocess
import sys
import numpy as np


def run_snippet(code: str, **env: str) -> str:
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env}, cwd=os.path.dirname(os.path.dirname(__file__)))
  assert result.returncode == 0, result.stderr
  return result.stdout


CHADNET = """
from tinychad.tensor import tensor, Linear
from tinychad.optim import SGD

class CHADnet:
  def __init__(self):
    self.l1 = Linear(784, 128)
    self.l2 = Linear(128, 10)

  def forward(self, x):
    x = self.l1(x).relu()
    x = self.l2(x).logsoftmax(axis=1)
    return x

x = tensor.randn(3,28,28)
x = x.reshape(-1,784)
model = CHADnet()
out = model.forward(x)
print(out.shape)
"""


def test_chadnet_forward():
  assert run_snippet(CHADNET).strip().endswith("(3, 10)")


def test_lazy_exec_and_get_buffers():
  code = CHADNET + """
w = out.sum()
print(w.get_buffers())
w.exec()
print(round(w.numpy().item(), 3) < 0)
"""
  printed = run_snippet(code, LAZY="1").splitlines()
  assert "('input', (128, 784), 'float32')" in printed[-2]
  assert printed[-1] == "True"


def test_seed_training_step_with_nllloss_and_sgd():
  code = CHADNET + """
import numpy as np
target = tensor(np.array([1, 4, 7]))
opt = SGD([model.l1.weight, model.l1.bias, model.l2.weight, model.l2.bias], lr=1e-3, momentum=0.9)
losses = []
for _ in range(5):
  loss = model.forward(x).NLLLoss(target)
  opt.zero_grad()
  loss.backward()
  opt.step()
  losses.append(loss.numpy().item())
print(losses[-1] < losses[0])
"""
  assert run_snippet(code).strip().endswith("True")


def test_ones_dot_backward():
  from tinychad import Tensor
  x = Tensor.eye(2, requires_grad=True)
  y = Tensor([[2.0, 0], [-2.0, 1]], requires_grad=True)
  z = Tensor.ones((2, 2)).dot(y).mul(x).sum()
  z.backward()
  np.testing.assert_allclose(x.grad.numpy(), [[0.0, 1.0], [0.0, 1.0]])
  np.testing.assert_allclose(y.grad.numpy(), [[1.0, 1.0], [1.0, 1.0]])


def test_llvm_flag_runs_linear():
  code = """
from tinychad.tensor import tensor, Linear
x = tensor.randn(5,5).reshape(1,-1)
print(Linear(25,10)(x).shape, x.device)
"""
  assert run_snippet(code, LLVM="1", DEVICE="").strip() == "(1, 10) LLVM"


def test_llvm_flag_with_debug_4_shows_llvm_ir(tmp_path):
  code = """
from tinychad.tensor import tensor, Linear
x = tensor.randn(5,5).reshape(1,-1)
print(Linear(25,10)(x).numpy().shape)
"""
  printed = run_snippet(code, LLVM="1", DEVICE="", DEBUG="4", TINYCHAD_CACHE=str(tmp_path))
  assert "define void @\"r_10_25\"" in printed and "fmul" in printed
  assert printed.strip().endswith("(1, 10)")
