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
