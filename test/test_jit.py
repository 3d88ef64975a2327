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


def test_train_called_before_every_step_still_replays():
  from tinychad import nn
  net, x = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)), Tensor.randn(4, 8).realize()
  calls = itertools.count()

  @TinyJit
  def forward(t):
    next(calls)
    return net(t).realize()

  try:
    for _ in range(5):
      net.train()          # the common loop: flags set again, unchanged, each step
      forward(x)
    assert next(calls) == 2
    net[1].training = False   # a flag changed through the property: recorded afresh, without dropout
    np.testing.assert_allclose(forward(x).numpy(), net[0](x).numpy(), rtol=1e-6)
  finally:
    Tensor.training = False


def native_replay() -> bool:
  """Whether replays on the default device run as KernelLists (a compiled CPU device and a C compiler for the pool)."""
  from tinychad import Device
  from tinychad.runtime.compiled import Compiled
  from tinychad.runtime.threads import KernelList
  device = Device[Device.DEFAULT]
  return isinstance(device, Compiled) and type(device).run is Compiled.run and KernelList.available(2)


def matmul_chain(a, b):
  # kernels big enough to be spread over threads (a 96x96x96 matmul) and tiny ones, one after another
  return ((a @ b).relu() @ b + 1).sum(0)


def expected_chain(a, b): return (np.maximum(a @ b, 0) @ b + 1).sum(0)


@pytest.mark.parametrize("threads", ["1", "2"])
def test_replay_runs_its_kernels_in_one_native_call(monkeypatch, threads):
  from tinychad.engine import jit, realize
  from tinychad.runtime.threads import KernelList
  monkeypatch.setenv("THREADS", threads)
  forward = TinyJit(matmul_chain)
  for _ in range(3): forward(Tensor.randn(96, 96), Tensor.randn(96, 96))
  if not native_replay(): pytest.skip("replays run kernel by kernel here (no C compiler, or not a CPU device)")
  plan = forward.recording.plans[False][0]
  assert len(plan) == 1 and isinstance(plan[0][0], KernelList) and plan[0][0].count == len(forward.recording.steps) >= 3
  # a replay runs no kernel through Python
  monkeypatch.setattr(jit, "run_kernel", None)
  monkeypatch.setattr(realize, "run_kernel", None)
  for _ in range(3):
    a, b = Tensor.randn(96, 96), Tensor.randn(96, 96)
    np.testing.assert_allclose(forward(a, b).numpy(), expected_chain(a.numpy(), b.numpy()), rtol=1e-4, atol=1e-3)


def test_replay_without_the_pool_and_with_debug_gives_the_same(monkeypatch, capsys):
  from tinychad.runtime.threads import KernelList
  forward = TinyJit(matmul_chain)
  a, b = Tensor.randn(96, 96).realize(), Tensor.randn(96, 96).realize()
  for _ in range(3): forward(a, b)
  expected = forward(a, b).numpy()
  monkeypatch.setattr(KernelList, "run", lambda self: False)    # the pool could not start its threads
  np.testing.assert_array_equal(forward(a, b).numpy(), expected)
  monkeypatch.setenv("DEBUG", "2")                               # the kernel by kernel path, timed
  np.testing.assert_array_equal(forward(a, b).numpy(), expected)
  assert capsys.readouterr().out.count("  replay ") == len(forward.recording.steps)


def test_a_host_step_between_kernels_runs_in_its_place():
  from tinychad.engine.realize import run_on_host
  from tinychad.runtime.threads import KernelList

  def triple(bufs): np.multiply(bufs[0].as_numpy(), 3, out=bufs[0].as_numpy())

  @TinyJit
  def forward(a):
    b = (a * 2).realize()
    run_on_host("triple", triple, [b.lazydata.base.realized])
    return (b + 1).realize()

  for _ in range(4):
    a = Tensor.randn(5)
    np.testing.assert_allclose(forward(a).numpy(), a.numpy() * 6 + 1, rtol=1e-6)
  if native_replay(): assert [type(k) for k, _ in forward.recording.plans[False][0]] == [KernelList, type(None), KernelList]


@pytest.mark.parametrize("debug", ["0", "2"])
def test_inference_replay_skips_the_kernels_of_unchanged_weights(monkeypatch, debug):
  """Kernels that read only weights (a convolution's copy of its weight into channels-last panels; with NOOPT=1,
  which packs no panels, the weight's mean square alone): for inference the weights don't change, so a replay skips
  them (they wrote the same values last time), until a weight is assigned outside."""
  from tinychad import nn, no_grad
  from tinychad.engine import jit as jit_module
  from tinychad.runtime.threads import KernelList
  Tensor.manual_seed(0)
  # 16 -> 32 channels: wide enough for the weight's panels to be a kernel of their own (3 -> 16 reads it in place)
  conv, head = nn.Conv2d(16, 32, 3, padding=1), nn.Linear(32, 4)

  def forward(x):
    with no_grad(): return head(conv(x).relu().mean((2, 3)) * conv.weight.square().mean()).realize()
  jitted = TinyJit(forward)
  monkeypatch.setenv("DEBUG", debug)   # 2: kernel by kernel through run_kernel; 0: native KernelLists where there are
  ran = []
  real_run, real_list_run = jit_module.run_kernel, KernelList.run
  monkeypatch.setattr(jit_module, "run_kernel", lambda item, bufs: (ran.append(item.name), real_run(item, bufs)))
  monkeypatch.setattr(KernelList, "run", lambda self: (ran.extend([None] * self.count), real_list_run(self))[1])
  per_call = []
  for i in range(6):
    if i == 4: conv.weight.assign(conv.weight * 2).realize()       # outside the jitted call: rebinds the weight
    x = Tensor.randn(2, 16, 16, 16).realize()
    ran.clear()
    out = jitted(x)
    per_call.append(len(ran))
    np.testing.assert_allclose(out.numpy(), forward(x).numpy(), rtol=1e-5, atol=1e-6)
  recorded = len(jitted.recording.steps)
  # calls 1-2 run and record; 3 replays all but the constant kernels; 5 (new weight) runs them again, 6 skips them
  assert per_call[2] < recorded and per_call[3] == per_call[2]
  assert per_call[4] == recorded and per_call[5] == per_call[2]


def test_a_host_step_writing_a_weight_in_place_outside_the_call_reruns_the_constant_kernels():
  """A broadcast or all-reduce of parameters writes their buffers in place (run_on_host): the buffer is the same
  one, so only the host-write count tells a replay that the constant kernels it skips would now differ."""
  from tinychad import nn, no_grad
  from tinychad.engine.realize import run_on_host
  Tensor.manual_seed(0)
  conv = nn.Conv2d(3, 8, 3)

  def forward(x):
    with no_grad(): return conv(x).sum((2, 3)).realize()
  jitted = TinyJit(forward)
  for i in range(5):
    if i == 3:
      def double(bufs): np.multiply(bufs[0].as_numpy(), 2, out=bufs[0].as_numpy())
      run_on_host("double", double, [conv.weight.lazydata.base.realized])
    x = Tensor.randn(2, 3, 6, 6).realize()
    np.testing.assert_allclose(jitted(x).numpy(), forward(x).numpy(), rtol=1e-5, atol=1e-5)


def _halves(x):
  """x's rows doubled and x's rows plus one, stacked: a cat whose two pieces are written into its buffer."""
  return (x * 2).reshape(1, 64).cat((x + 1).reshape(1, 64), dim=0)


@pytest.mark.parametrize("debug", ["0", "2"])
def test_a_cat_written_in_place_replays_into_new_buffers(monkeypatch, debug):
  # the cat returned (a new buffer at each replay, its pieces' kernels moved along), a piece returned (a view of a
  # cat realized in the call), and a kernel reading the cat
  def fn(x):
    stacked = _halves(x)
    first = (x * 3).reshape(1, 64)
    both = first.cat((x - 1).reshape(1, 64), dim=0).realize()
    return stacked, first, both.sum(0) + stacked.sum(0)
  def want(x):
    stacked = np.concatenate([x.reshape(1, 64) * 2, x.reshape(1, 64) + 1])
    both = np.concatenate([x.reshape(1, 64) * 3, x.reshape(1, 64) - 1])
    return stacked, x.reshape(1, 64) * 3, both.sum(0) + stacked.sum(0)
  jitted = TinyJit(fn)
  monkeypatch.setenv("DEBUG", debug)
  kept = []
  for _ in range(5):
    x = Tensor.randn(4, 16).realize()
    outs = jitted(x)
    kept.append((x.numpy(), outs))
    for got, expected in zip(outs, want(x.numpy())):
      np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)
  # the cat the recorded call returned was written there (through its pieces), so it is no buffer from outside
  assert id(kept[1][1][0].lazydata.base.realized) not in jitted.recording.external
  # each replay's outputs are its own: a later one wrote none of an earlier one's
  for x, outs in kept:
    for got, expected in zip(outs, want(x)): np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_a_piece_of_a_cat_is_an_input_like_any_other():
  jitted = TinyJit(lambda x: (x * 3).realize())
  for _ in range(4):
    stacked = _halves(Tensor.randn(4, 16).realize()).realize()
    second = stacked[1:]        # a view of the cat, whose buffer holds both pieces
    piece = (Tensor.randn(4, 16).realize() * 2).reshape(1, 64)
    Tensor.cat(piece, (piece + 1), dim=0).realize()    # piece: a view into that cat's buffer
    np.testing.assert_allclose(jitted(second).numpy(), stacked.numpy()[1:] * 3, rtol=1e-6)
    np.testing.assert_allclose(jitted(piece).numpy(), piece.numpy() * 3, rtol=1e-6)


def test_inference_replay_skips_the_pieces_of_a_cat_of_unchanged_weights():
  # the cat of two weights' transforms reads only weights: its pieces' kernels are constant, skipped by a replay
  # while the weights are the same, and run again once one is assigned outside
  from tinychad import no_grad
  w1, w2 = Tensor.randn(1, 64).realize(), Tensor.randn(1, 64).realize()
  def forward(x):
    with no_grad(): return (x @ w1.exp().cat(w2.exp(), dim=0)).realize()
  jitted = TinyJit(forward)
  for i in range(5):
    if i == 3: w1.assign(w1 * 2).realize()
    x = Tensor.randn(3, 2).realize()
    want = x.numpy() @ np.exp(np.concatenate([w1.numpy(), w2.numpy()]))
    np.testing.assert_allclose(jitted(x).numpy(), want, rtol=1e-5, atol=1e-5)
  assert len(jitted.recording.constant) >= 2     # the pieces' kernels, at least
  # returned, the cat is a new buffer at each replay: its pieces' kernels run every time
  returned = TinyJit(lambda x: (w1.exp().cat(w2.exp(), dim=0).realize(), (x * 2).realize()))
  for _ in range(4):
    got, _ = returned(Tensor.randn(3, 2).realize())
    np.testing.assert_allclose(got.numpy(), np.exp(np.concatenate([w1.numpy(), w2.numpy()])), rtol=1e-6)
