"""Remembered schedules (engine/schedule_cache.py).

in: graphs of the same shape over other buffers, and graphs that differ only in what a key must see
    (a shared buffer, the sign of a zero constant, NOOPT, buffers the scheduler made)
out: pass when a repeated shape is not scheduled again yet computes with its own buffers, and every
     difference that changes the kernels gets its own schedule and the right numbers.
"""
import numpy as np
import pytest
from tinychad import Tensor
from tinychad.engine import schedule, schedule_cache
from tinychad.codegen.pack import PACK_MIN_STRIDE_BYTES
from tinychad.engine.schedule import create_schedule
from tinychad.codegen.opt import STAGE_MAX_BYTES, panel_width
from tinychad.dtype import dtypes

rng = np.random.default_rng(0)


@pytest.fixture
def schedulings(monkeypatch):
  """Counts the graphs the scheduler really works through (not taken from the cache)."""
  monkeypatch.setattr(schedule_cache, "_templates", type(schedule_cache._templates)())
  count = [0]
  real = schedule._Scheduler

  def counting(outs):
    count[0] += 1
    return real(outs)
  monkeypatch.setattr(schedule, "_Scheduler", counting)
  return count


def _data(*shape):
  return rng.standard_normal(shape, dtype=np.float32)


def test_same_shape_is_scheduled_once_and_uses_its_own_buffers(schedulings):
  got, want = [], []
  for _ in range(3):
    a, b, c = _data(16, 8), _data(8, 32), _data(32)
    got.append(((Tensor(a) @ Tensor(b)).relu() + Tensor(c)).sum(0).numpy())
    want.append((np.maximum(a @ b, 0) + c).sum(0))
  assert schedulings[0] == 1
  for g, w in zip(got, want): np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_a_shared_buffer_is_part_of_the_shape(schedulings):
  x, y = Tensor(_data(64)), Tensor(_data(64))
  square = create_schedule([(x * x).lazydata])
  product = create_schedule([(x * y).lazydata])
  assert schedulings[0] == 2 and len(square[0].inputs) == 1 and len(product[0].inputs) == 2
  np.testing.assert_allclose((x * y).numpy(), x.numpy() * y.numpy())


def test_constants_that_compare_equal_keep_their_own_kernels(schedulings):
  x = Tensor(np.ones(16, np.float32)).realize()   # already computed: nothing to schedule
  assert not np.signbit((x * 0.0).numpy()).any()
  assert np.signbit((x * -0.0).numpy()).all()
  assert schedulings[0] == 2
  # True becomes the int32 constant 1, so these two are one graph shape
  assert (x.cast(dtypes.int32) + 1).numpy().dtype == np.int32 and (x.cast(dtypes.int32) + True).numpy().dtype == np.int32
  assert schedulings[0] == 3


def _build_one(srcs): return srcs[0]
def _build_two(srcs): return srcs[0]


def test_subgraph_arguments_key_by_function_and_by_each_parameters_type():
  key = schedule_cache._arg_key
  # a subgraph's argument: (its build function, its parameters); 1 == 1.0 == True, yet each builds its own graph
  variants = [(_build_one, (1, 2.0)), (_build_one, (1.0, 2.0)), (_build_one, (True, 2.0)), (_build_two, (1, 2.0)),
              (_build_one, ((2,), 1e-5, (True, False))), (_build_one, ((2,), 1e-5, (1, 0)))]
  keys = [key(arg) for arg in variants]
  assert len(set(keys)) == len(variants), keys
  assert [key(arg) for arg in variants] == keys and hash(keys[0]) == hash(key((_build_one, (1, 2.0))))


def test_noopt_is_part_of_the_key(schedulings, monkeypatch):
  # b's rows a page apart and a panel too big to stage: packed ahead unless NOOPT
  k, n = STAGE_MAX_BYTES // (4 * panel_width(dtypes.float32)) + 16, PACK_MIN_STRIDE_BYTES // 4
  a, b = Tensor.rand(32, k, device="NUMPY").realize(), Tensor.rand(k, n, device="NUMPY").realize()
  monkeypatch.setenv("NOOPT", "0")
  assert len(create_schedule([(a @ b).lazydata])) == 2
  monkeypatch.setenv("NOOPT", "1")
  assert len(create_schedule([(a @ b).lazydata])) == 1


def test_buffers_the_scheduler_made_are_made_anew(schedulings, set_noopt):
  set_noopt("0")    # NOOPT packs nothing
  k, n = STAGE_MAX_BYTES // (4 * panel_width(dtypes.float32)) + 16, PACK_MIN_STRIDE_BYTES // 4
  outputs = []
  for _ in range(2):
    a, b = _data(32, k), _data(k, n)
    out = Tensor(a) @ Tensor(b)
    pack, _ = create_schedule([out.lazydata])
    outputs.append(pack.output)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-3)
  assert schedulings[0] == 1 and outputs[0] is not outputs[1]


def test_the_cache_forgets_the_least_recent(schedulings, monkeypatch):
  monkeypatch.setattr(schedule_cache, "MAX_SCHEDULES", 2)
  x = Tensor(_data(8))
  for op in (lambda t: t + 1, lambda t: t * 2, lambda t: t - 3, lambda t: t + 1):
    create_schedule([op(x).lazydata])
  assert len(schedule_cache._templates) == 2 and schedulings[0] == 4


def test_float_constants_key_by_value(schedulings):
  # a float constant keys as its value (NaN as its bits, so it equals itself): equal values share a schedule,
  # different ones don't, and each computes its own numbers
  x = Tensor(_data(16)).realize()
  for scale in (2.5, 2.5, 3.5, float("nan"), float("nan"), float("inf")):
    np.testing.assert_allclose((x * scale).numpy(), x.numpy() * np.float32(scale), rtol=1e-6)
  assert schedulings[0] == 4


# ---- the one-op key and the prepared launch (engine/realize.py: Launch) ----

def _walked_key(outs):
  """graph_key through the generic walk only (the one-op pass turned off)."""
  real = schedule_cache._one_op_graph
  schedule_cache._one_op_graph = lambda out: None
  try:
    return schedule_cache.graph_key(outs)
  finally:
    schedule_cache._one_op_graph = real


def test_the_one_op_key_is_the_walks_key():
  x, y = Tensor(_data(4, 8)).realize(), Tensor(_data(4, 8)).realize()
  graphs = [x + y, x + x, x * 2.5, x + x.flip(0), x.T.contiguous(), x.sum(1), (x + y).exp(), x.cast(dtypes.int32),
            x.permute(1, 0) + y.permute(1, 0), Tensor.full((4, 8), 2.0) + x, x.maximum(y)]
  one_op = 0
  for t in graphs:
    lb = t.lazydata
    key, nodes = schedule_cache.graph_key([lb])
    walked_key, walked_nodes = _walked_key([lb])
    assert key == walked_key and nodes == walked_nodes, t
    one_op += schedule_cache._one_op_graph(lb) is not None
  assert one_op >= 8    # the pass answered for most of these (a chain of two ops or a view on top it leaves to the walk)


def _launched(monkeypatch) -> tuple[list, list]:
  """Counts run_schedule's items (the long way: a capture, DEBUG, GRAPH, PORT, a copy between devices) and each
  prepared launch's steps (a plain realize, its first call included)."""
  from tinychad.engine import realize as realize_mod
  long_way, launches = [], []
  real_schedule, real_launch = realize_mod.run_schedule, realize_mod.run_launch
  monkeypatch.setattr(realize_mod, "run_schedule", lambda items: (long_way.append(len(items)), real_schedule(items)))
  monkeypatch.setattr(realize_mod, "run_launch",
                      lambda launch, nodes: (launches.append(len(launch.steps)), real_launch(launch, nodes)))
  return long_way, launches


def test_a_prepared_launch_runs_with_its_own_buffers(schedulings, monkeypatch):
  long_way, launches = _launched(monkeypatch)
  for _ in range(4):
    a, b = _data(3, 5), _data(3, 5)
    np.testing.assert_allclose((Tensor(a) + Tensor(b)).numpy(), a + b, rtol=1e-6)
  # scheduled once, launched every time (the first time too): same results over each call's own buffers
  assert schedulings[0] == 1 and long_way == [] and launches == [1] * 4


def test_no_stale_launch_for_what_the_key_sees(schedulings, monkeypatch):
  # same op and shape, but a dtype, a view, a constant or a shared buffer that differs: a kernel of its own each time
  long_way, launches = _launched(monkeypatch)
  a, b = _data(4, 4), _data(4, 4)
  x, y = Tensor(a).realize(), Tensor(b).realize()
  xi, yi = x.cast(dtypes.int32).realize(), y.cast(dtypes.int32).realize()
  cases = [(lambda: x + y, a + b), (lambda: xi + yi, a.astype(np.int32) + b.astype(np.int32)),
           (lambda: x + y.T, a + b.T), (lambda: x + x, a + a), (lambda: x * 2.0, a * 2), (lambda: x * 3.0, a * 3),
           (lambda: x * -0.0, a * -0.0), (lambda: x * 0.0, a * 0.0), (lambda: x + y.flip(1), a + b[:, ::-1])]
  schedulings[0] = 0
  del launches[:]
  for _ in range(2):
    for make, want in cases:
      got = make().numpy()
      assert got.dtype == want.dtype
      np.testing.assert_array_equal(got, want)
      np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
  # each case scheduled once and launched each time
  assert schedulings[0] == len(cases) and not long_way and len(launches) == 2 * len(cases)


def test_a_source_computed_since_is_another_graph(schedulings):
  x = Tensor(_data(8)).realize()
  lazy = x + 1                      # not computed: x + 1 + 2 is a two-op graph
  deeper = schedule_cache.graph_key([(lazy + 2).lazydata])[0]
  lazy.realize()                    # now a buffer: lazy + 2 is one op over it
  shallow = schedule_cache.graph_key([(lazy + 2).lazydata])[0]
  assert deeper != shallow
  np.testing.assert_allclose((lazy + 2).numpy(), x.numpy() + 3, rtol=1e-6)


def test_launch_of_several_kernels_and_made_buffers(schedulings, set_noopt, monkeypatch):
  set_noopt("0")    # packed panels: buffers the scheduler made, remade by each launch
  long_way, launches = _launched(monkeypatch)
  k, n = STAGE_MAX_BYTES // (4 * panel_width(dtypes.float32)) + 16, PACK_MIN_STRIDE_BYTES // 4
  for _ in range(3):
    a, b, c = _data(32, k), _data(k, n), _data(n)
    out = (Tensor(a) @ Tensor(b) + Tensor(c)).relu()
    np.testing.assert_allclose(out.numpy(), np.maximum(a @ b + c, 0), rtol=1e-4, atol=1e-3)
  assert schedulings[0] == 1 and not long_way and len(launches) == 3 and launches[0] >= 2, launches


def test_empty_and_zero_size_outputs_launch(schedulings, monkeypatch):
  long_way, launches = _launched(monkeypatch)
  for _ in range(3):
    x = Tensor(_data(4)).realize()
    assert (x[:0] + 1).numpy().shape == (0,)
    assert Tensor.empty(3, 2).realize().shape == (3, 2)
  assert schedulings[0] == 2 and not long_way and len(launches) == 6


def test_forgotten_kernels_are_built_again(schedulings, monkeypatch):
  from tinychad.device import Device
  long_way, launches = _launched(monkeypatch)
  x = Tensor(_data(4)).realize()
  for _ in range(2): (x + 1).realize()
  assert len(launches) == 2 and schedulings[0] == 1
  monkeypatch.setattr(Device[x.device], "programs", {})    # as set_noopt does: the device forgets its kernels
  np.testing.assert_allclose((x + 1).numpy(), x.numpy() + 1, rtol=1e-6)
  # the stale launch is not run: the kernel is built again into the new table, and a new launch runs it
  assert len(launches) == 3 and not long_way and len(Device[x.device].programs) == 1 and schedulings[0] == 1


def test_capture_and_debug_take_the_long_way(schedulings, monkeypatch, capsys):
  from tinychad.engine.realize import capture
  long_way, launches = _launched(monkeypatch)
  x = Tensor(_data(4)).realize()
  for _ in range(2): (x * 5).realize()
  with capture() as steps: (x * 5).realize()
  assert len(steps) == 1 and steps[0][0].name.startswith("E_")
  monkeypatch.setenv("DEBUG", "1")
  (x * 5).realize()
  assert "realize: 1 items, 1 kernels" in capsys.readouterr().out
  assert long_way == [1, 1] and len(launches) == 2


# ---- shared scalar operands (lazy.py: LazyBuffer.operand) ----

def test_operands_are_shared_until_computed():
  from tinychad.lazy import LazyBuffer
  a = LazyBuffer.operand(2.5, (3, 4), dtypes.float32, "CPU")
  assert LazyBuffer.operand(2.5, (3, 4), dtypes.float32, "CPU") is a
  # what the key sees makes another constant: the type, dtype, shape, device and value
  others = [LazyBuffer.operand(2.5, (4, 3), dtypes.float32, "CPU"), LazyBuffer.operand(2.5, (3, 4), dtypes.float64, "CPU"),
            LazyBuffer.operand(2.5, (3, 4), dtypes.float32, "NUMPY"), LazyBuffer.operand(3.5, (3, 4), dtypes.float32, "CPU"),
            LazyBuffer.operand(1, (3, 4), dtypes.int32, "CPU")]
  assert all(o is not a for o in others)
  assert LazyBuffer.operand(True, (2,), dtypes.int32, "CPU") is not LazyBuffer.operand(1, (2,), dtypes.int32, "CPU")
  # a constant computed (realized) since is not handed out again: new graphs read the value inline
  Tensor(a).realize()
  b = LazyBuffer.operand(2.5, (3, 4), dtypes.float32, "CPU")
  assert b is not a and b.base.realized is None and b.base.op.name == "CONST"
  x = Tensor(_data(3, 4)).realize()
  np.testing.assert_allclose((x * 2.5).numpy(), x.numpy() * 2.5, rtol=1e-6)


def test_zero_and_nan_operands_are_made_anew():
  from tinychad.lazy import LazyBuffer
  zero, negative_zero = LazyBuffer.operand(0.0, (2,), dtypes.float32, "CPU"), LazyBuffer.operand(-0.0, (2,), dtypes.float32, "CPU")
  assert zero is not negative_zero and np.signbit(Tensor(negative_zero).numpy()).all() and not np.signbit(Tensor(zero).numpy()).any()
  assert np.isnan(Tensor(LazyBuffer.operand(float("nan"), (2,), dtypes.float32, "CPU")).numpy()).all()
  # the value is the dtype's: 1/3 in float32 is rounded, 2**40 in int64 exact
  third = Tensor(LazyBuffer.operand(1 / 3, (), dtypes.float32, "CPU")).numpy()
  assert third == np.float32(1 / 3) and Tensor(LazyBuffer.operand(2 ** 40, (), dtypes.int64, "CPU")).numpy() == 2 ** 40


def test_constants_users_hold_are_their_own():
  # Tensor.full/ones give each tensor its own constant: computing one never hands its buffer to another
  a, b = Tensor.full((4,), 3.0), Tensor.full((4,), 3.0)
  assert a.lazydata is not b.lazydata and a.lazydata.base is not b.lazydata.base
  a.realize(), b.realize()
  assert a.lazydata.base.realized is not b.lazydata.base.realized


@pytest.mark.parametrize("device", ["NUMPY", "CPU", "LLVM", "OPENCL"])
def test_launch_on_each_device(device, monkeypatch):
  # a device with a run() of its own (OPENCL's queue, NUMPY's evaluator) keeps it in a prepared launch
  from tinychad.device import Device
  if not Device.available(device): pytest.skip(f"{device} is not available here")
  long_way, launches = _launched(monkeypatch)
  for scale in (1.5, 1.5, 1.5):
    a, b = _data(5, 3), _data(5, 3)
    got = (Tensor(a, device=device) * scale + Tensor(b, device=device)).numpy()
    np.testing.assert_allclose(got, a * np.float32(scale) + b, rtol=1e-6)
  assert not long_way and len(launches) == 3
