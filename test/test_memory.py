"""Memory stays flat: buffers are freed when nothing references them, and reused through the pool."""
from __future__ import annotations
import gc
import resource
import numpy as np
from tinychad import Tensor, no_grad
from tinychad.device import memory_pool
from tinychad.nn import Linear
from tinychad.nn.optim import SGD


def rss_mb() -> float:
  with open("/proc/self/statm") as f: pages = int(f.read().split()[1])
  return pages * resource.getpagesize() / 2**20


def test_training_loop_memory_is_flat():
  layer_1, layer_2 = Linear(64, 32), Linear(32, 4)
  opt = SGD([layer_1.weight, layer_1.bias, layer_2.weight, layer_2.bias], lr=0.01, momentum=0.9)
  x, y = Tensor.randn(16, 64).realize(), Tensor(np.arange(16) % 4)

  def step():
    loss = layer_2(layer_1(x).relu()).cross_entropy(y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()

  for _ in range(200): step()
  gc.collect()
  before = rss_mb()
  for _ in range(2000): last = step()
  gc.collect()
  assert rss_mb() - before < 8, f"RSS grew from {before:.1f} MB to {rss_mb():.1f} MB"
  assert np.isfinite(last)


def test_freed_buffers_are_reused():
  memory_pool.clear()
  a = (Tensor.ones(1024) * 2).realize()
  address = a.lazydata.base.realized.as_numpy().ctypes.data
  del a
  gc.collect()
  b = (Tensor.ones(1024) * 3).realize()
  assert b.lazydata.base.realized.as_numpy().ctypes.data == address
  np.testing.assert_allclose(b.numpy(), 3)


def test_freeing_a_big_tensor_gives_memory_back_to_the_os():
  import tinychad
  from tinychad import GlobalCounters
  tinychad.empty_cache()
  gc.collect()
  before_rss, before_used = rss_mb(), tinychad.memory_allocated()
  big = (Tensor.ones(64, 1024, 1024) + 1).realize()   # 256 MiB of float32
  assert tinychad.memory_allocated() - before_used >= 256 * 2**20
  assert GlobalCounters.mem_used == tinychad.memory_allocated()
  assert tinychad.max_memory_allocated() >= tinychad.memory_allocated()
  assert rss_mb() - before_rss > 200, "the tensor's pages were touched"
  del big
  gc.collect()
  # a buffer this big is never pooled: both the counter and the process's resident memory drop by its size
  assert tinychad.memory_allocated() - before_used < 2**20
  assert tinychad.memory_pooled() < 256 * 2**20
  assert rss_mb() - before_rss < 50, f"RSS still {rss_mb() - before_rss:.0f} MB above where it started"


def test_pool_is_reported_apart_and_emptied():
  import tinychad
  tinychad.empty_cache()
  a = (Tensor.ones(1 << 18) * 2).realize()   # 1 MiB: small enough to be pooled when freed
  used = tinychad.memory_allocated()
  del a
  gc.collect()
  assert tinychad.memory_allocated() == used - (1 << 20)
  assert tinychad.memory_pooled() >= 1 << 20
  assert tinychad.memory_reserved() == tinychad.memory_allocated() + tinychad.memory_pooled()
  tinychad.empty_cache()
  assert tinychad.memory_pooled() == 0
  tinychad.reset_peak_memory_stats()
  assert tinychad.max_memory_allocated() == tinychad.memory_allocated()


def test_a_buffer_that_grows_a_little_each_step_takes_the_block_the_last_step_gave_back():
  # a KV cache concatenated once per token: each token's cache is a few hundred bytes bigger than the last
  import tinychad
  tinychad.empty_cache()
  cache = Tensor.zeros(1, 4, 100, 64).contiguous().realize()
  addresses = set()
  with no_grad():      # as in decoding: no graph keeps the old caches
    for _ in range(12):
      cache = cache.cat(Tensor.ones(1, 4, 1, 64), dim=2).realize()
      addresses.add(cache.lazydata.base.realized.address)
  # 101 -> 112 rows of 1 KiB in 4 KiB steps (16 per power of two): 3 size classes, each with two blocks that the
  # old and the new cache pass back and forth (with exact sizes every step took fresh memory, and the pool kept
  # every old cache)
  classes = {memory_pool.size_class(rows * 1024) for rows in range(101, 113)}
  assert len(classes) == 3 and len(addresses) <= 2 * len(classes), (classes, len(addresses))
  assert tinychad.memory_pooled() <= 2 * sum(classes) + (64 << 10)     # exact sizes: 12 old caches
  np.testing.assert_equal(cache.numpy()[0, :, 100:], 1)
  np.testing.assert_equal(cache.numpy()[0, :, :100], 0)
  assert cache.numpy().shape == (1, 4, 112, 64)


def test_a_buffer_in_a_bigger_block_shows_its_own_size():
  from tinychad.device import Buffer
  from tinychad.dtype import dtypes
  assert memory_pool.size_class(4100) > 4100
  buf = Buffer("CPU", 1025, dtypes.float32).allocate()
  assert buf.as_numpy().shape == (1025,)
  buf.copyin(np.arange(1025, dtype=np.float32))
  np.testing.assert_equal(buf.as_numpy(), np.arange(1025))


def test_a_full_pool_gives_back_the_sizes_given_back_least_recently(monkeypatch):
  # a process that ran one model, then another: the pool must keep the sizes in use now, not the old ones
  memory_pool.clear()
  monkeypatch.setattr(memory_pool, "LIMIT_BYTES", 1 << 20)
  old = [(Tensor.ones(1 << 16) + i).realize() for i in range(3)]     # 3 x 256 KiB
  small = (Tensor.ones(4) + 1).realize()
  del old, small
  assert memory_pool.pooled_bytes == 3 * (1 << 18) + 16
  newer = [(Tensor.ones(3 << 15) + i).realize() for i in range(2)]    # 2 x 384 KiB: past the limit together
  del newer
  # the 256 KiB blocks, given back first, went; the tiny one given back after them stayed
  assert memory_pool.pooled_bytes == 2 * (3 << 17) + 16
  assert sorted(memory_pool.free) == [16, 3 << 17] and len(memory_pool.free[3 << 17]) == 2
  # a full pool still takes back the size an eager loop uses (refusing it made every op's buffer fresh memory)
  for _ in range(3): (Tensor.ones(4) + 2).realize()
  assert len(memory_pool.free[16]) == 1 and memory_pool.pooled_bytes <= 1 << 20
  # one size alone past the limit: the pool keeps what fits of it
  many = [(Tensor.ones(3 << 15) + i).realize() for i in range(4)]
  del many
  assert memory_pool.pooled_bytes <= 1 << 20 and len(memory_pool.free[3 << 17]) == 2


def test_a_zero_byte_buffer_goes_back_to_the_pool(monkeypatch):
  import sys
  from tinychad.device import Buffer
  from tinychad.dtype import dtypes
  errors = []
  monkeypatch.setattr(sys, "unraisablehook", errors.append)    # where an exception in __del__ would go
  for _ in range(2):
    memory_pool.clear()
    Buffer("CPU", 0, dtypes.float32).allocate()
  assert not errors and len(memory_pool.free[0]) == 1
