"""TinyJit: replays match running without it; new shapes or changed Python values record afresh."""
from __future__ import annotations
import itertools
import numpy as np
import pytest
from tinychad import Tensor, TinyJit, GlobalCounters
from tinychad.nn import Linear
from tinychad.nn.optim import SGD

pytestmark = pytest.mark.usefixtures("train_device")     # conftest: the default device, then OPENCL


def make_model(seed: int = 0):
  Tensor.manual_seed(seed)
  return Linear(12, 8), Linear(8, 3)


def train(step, x, y, steps: int) -> list[float]:
  return [step(x, y).item() for _ in range(steps)]


def make_step(l1, l2, opt):
  def step(x, y):
    loss = l2(l1(x).relu()).cross_entropy(y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss
  return step


def test_replayed_training_matches_plain_training():
  x, y = Tensor.randn(6, 12).realize(), Tensor(np.array([0, 1, 2, 0, 1, 2]))
  results = []
  for jit in (False, True):
    l1, l2 = make_model()
    opt = SGD([l1.weight, l1.bias, l2.weight, l2.bias], lr=0.1, momentum=0.9)
    step = make_step(l1, l2, opt)
    results.append((train(TinyJit(step) if jit else step, x, y, 8), l1.weight.numpy()))
  np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-6)
  np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-6)


def test_replay_skips_graph_building_and_uses_new_inputs():
  calls = itertools.count()   # an iterator holds no number the JIT's snapshot would see change

  @TinyJit
  def forward(a, b):
    next(calls)
    return (a * b + 1).relu().sum(1)

  for i in range(5):
    a, b = Tensor.randn(4, 5), Tensor.randn(4, 5)
    out = forward(a, b)
    np.testing.assert_allclose(out.numpy(), np.maximum(a.numpy() * b.numpy() + 1, 0).sum(1), rtol=1e-5)
  assert next(calls) == 2     # the Python body ran to compile and to record, then replays
  GlobalCounters.reset()
  forward(Tensor.randn(4, 5), Tensor.randn(4, 5))
  assert GlobalCounters.kernel_count == 0   # replays bypass the scheduler (and its counters)


def test_new_shapes_record_again():
  @TinyJit
  def double(a): return a * 2
  for shape in ((3,), (3,), (3,), (4, 2), (4, 2), (4, 2)):
    a = Tensor.randn(*shape)
    np.testing.assert_allclose(double(a).numpy(), a.numpy() * 2)


def test_changed_python_value_is_not_replayed_stale():
  settings = {"scale": 2.0}

  @TinyJit
  def scaled(a): return a * settings["scale"]

  a = Tensor.randn(5)
  for _ in range(3): np.testing.assert_allclose(scaled(a).numpy(), a.numpy() * 2)
  settings["scale"] = 5.0
  np.testing.assert_allclose(scaled(a).numpy(), a.numpy() * 5)


def test_changed_learning_rate_is_used():
  x, y = Tensor.randn(6, 12).realize(), Tensor(np.array([0, 1, 2, 0, 1, 2]))
  finals = []
  for jit in (False, True):
    l1, l2 = make_model(1)
    opt = SGD([l1.weight, l1.bias, l2.weight, l2.bias], lr=0.1)
    step = make_step(l1, l2, opt)
    step = TinyJit(step) if jit else step
    train(step, x, y, 3)
    opt.lr = 0.5
    finals.append(train(step, x, y, 3))
  np.testing.assert_allclose(finals[0], finals[1], rtol=1e-6)


def test_switching_train_and_eval_records_again():
  @TinyJit
  def drop(a): return a.dropout(0.5) * 1

  a = Tensor.ones(64)
  Tensor.training = True
  try:
    masks = [drop(a).numpy() == 0 for _ in range(4)]
    assert all(m.any() and not m.all() for m in masks)
    assert not (masks[2] == masks[3]).all()   # replays draw a new dropout mask each call
    Tensor.training = False
    for _ in range(3): np.testing.assert_allclose(drop(a).numpy(), 1.0)
  finally:
    Tensor.training = False


def test_a_submodule_switched_to_eval_recaptures():
  from tinychad import nn

  class Block(nn.Module):
    def __init__(self):
      super().__init__()
      self.inner = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))
    def forward(self, x): return self.inner(x)

  class Net(nn.Module):
    def __init__(self):
      super().__init__()
      self.body, self.head = nn.ModuleList([Block(), Block()]), nn.Linear(8, 2)
    def forward(self, x): return self.head(self.body[1](self.body[0](x)))

  net, x = Net(), Tensor.randn(4, 8).realize()
  forward = TinyJit(lambda t: net(t).realize())
  net.train()
  for _ in range(3): forward(x)
  # body.eval() then head.train(): Tensor.training ends up True as before; only the dropouts deep in body changed
  net.body.eval()
  net.head.train()
  expected = net(x).numpy()
  for _ in range(3): np.testing.assert_allclose(forward(x).numpy(), expected, rtol=1e-6)


# a module of its own for each jitted function: the bug needed the function's global name (`step`) to be
# an attribute it reads too (`opt.step()`), so that the JIT saw itself among the values it watches
STEP_MODULE = """
@TinyJit
def {name}(x, y):
  note_run(1)
  loss = l2(l1(x).relu()).cross_entropy(y)
  opt.zero_grad()
  loss.backward()
  opt.{method}()
  return loss
"""


def jitted_step(name: str, method: str = "step"):
  l1, l2 = make_model(2)
  opt = SGD([l1.weight, l1.bias, l2.weight, l2.bias], lr=0.1, momentum=0.9)
  body_runs: list = []
  # the body counts its runs through a bound method (which the JIT's snapshot doesn't look into), not
  # through the list itself, whose growing length would be a changed value
  namespace = {"TinyJit": TinyJit, "l1": l1, "l2": l2, "opt": opt, "note_run": body_runs.append, "body_runs": body_runs}
  exec(STEP_MODULE.format(name=name, method=method), namespace)
  return namespace[name], namespace


@pytest.mark.parametrize("name", ["step", "train_step", "forward"])
def test_function_named_like_what_it_calls_replays(name):
  fn, namespace = jitted_step(name)
  assert namespace[name] is fn and fn.__wrapped__.__globals__ is namespace
  x, y = Tensor.randn(6, 12).realize(), Tensor(np.array([0, 1, 2, 0, 1, 2]))
  kernels = []
  for _ in range(5):
    GlobalCounters.reset()
    fn(x, y).numpy()
    kernels.append(GlobalCounters.kernel_count)
  # calls 1 and 2 run the Python body (compile, record) and schedule kernels; from call 3 on, replays
  # schedule none (their kernels run without the scheduler's counting), and the body doesn't run
  assert kernels[0] > 0 and kernels[1] > 0 and kernels[2:] == [0, 0, 0], kernels
  assert len(namespace["body_runs"]) == 2
  # a Python value the function reads through its globals changes: it records afresh, then replays
  namespace["opt"].lr = 0.05
  for _ in range(3): fn(x, y)
  assert len(namespace["body_runs"]) == 4


@pytest.mark.parametrize("name", ["step", "train_step", "forward"])
def test_replayed_named_step_trains_like_plain_python(name):
  x, y = Tensor.randn(6, 12).realize(), Tensor(np.array([0, 1, 2, 0, 1, 2]))
  fn, namespace = jitted_step(name)
  jitted = [fn(x, y).item() for _ in range(6)]
  plain_fn, plain_namespace = jitted_step(name)
  plain = [plain_fn.fn(x, y).item() for _ in range(6)]
  np.testing.assert_allclose(jitted, plain, rtol=1e-6)
  np.testing.assert_allclose(namespace["l1"].weight.numpy(), plain_namespace["l1"].weight.numpy(), rtol=1e-6)
