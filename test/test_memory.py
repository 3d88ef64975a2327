"""Memory stays flat: buffers are freed when nothing references them, and reused through the pool."""
from __future__ import annotations
import gc
import resource
import numpy as np
from tinychad import Tensor
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
