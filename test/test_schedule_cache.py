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
