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


SHRIMPGRAD = """
from tinychad import Tensor
x = Tensor.ones((2,2)); y = Tensor.zeros((2,2)); z = x.dot(y); z.backward()
print(x.grad.numpy().tolist(), y.grad.numpy().tolist())
"""


def test_shrimpgrad_readme_dot_backward():
  """shrimpgrad's README verbatim: nothing asked for gradients (requires_grad None, tinygrad's "not decided"), the
  backward of a non-scalar seeds with ones, and both leaves get the gradient of z.sum()."""
  assert run_snippet(SHRIMPGRAD).strip() == "[[0.0, 0.0], [0.0, 0.0]] [[2.0, 2.0], [2.0, 2.0]]"


def test_tri_state_requires_grad():
  from tinychad import Tensor, no_grad
  undecided, always, never = Tensor([1.0, 2.0]), Tensor([3.0, 4.0], requires_grad=True), Tensor([5.0, 6.0], requires_grad=False)
  assert undecided.requires_grad is None and always.requires_grad and never.requires_grad is False
  (undecided * always * never).sum().backward()
  np.testing.assert_allclose(undecided.grad.numpy(), [15.0, 24.0])
  np.testing.assert_allclose(always.grad.numpy(), [5.0, 12.0])
  assert never.grad is None
  # a leaf the pass doesn't reach gets nothing; under no_grad() nothing is recorded, whatever the flags
  other = Tensor([1.0])
  (Tensor([2.0]) * 3).backward()
  assert other.grad is None
  with no_grad(): out = undecided * always
  assert out.requires_grad is False and out._ctx is None
  # an undecided leaf's backward gives it its own seed
  leaf = Tensor([1.0, 1.0])
  leaf.backward()
  np.testing.assert_allclose(leaf.grad.numpy(), [1.0, 1.0])
  # a non-scalar output is seeded with ones: the gradients of its sum
  w = Tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
  (w * 2).backward()
  np.testing.assert_allclose(w.grad.numpy(), np.full((2, 2), 2.0))
