"""Kernel counts: what the scheduler fuses, and what it realizes once."""
from __future__ import annotations
import math
import sys
import numpy as np
import pytest
from tinychad import Tensor, GlobalCounters
from tinychad.engine import schedule
from tinychad.engine.schedule import MAX_FUSED_DEPTH, create_schedule
from tinychad.function import cat
from tinychad.lazy import LazyBuffer
from tinychad.ops import BinaryOps, LoadOps, ReduceOps, TernaryOps, UnaryOps


def kernels(*tensors: Tensor) -> int:
  GlobalCounters.reset()
  Tensor.realize(*tensors)
  return GlobalCounters.kernel_count


def rand(*shape) -> Tensor: return Tensor.randn(*shape).realize()


def test_elementwise_chain_is_one_kernel():
  a, b, c = rand(16, 16), rand(16, 16), rand(16, 16)
  out = ((a * b) + c).relu()
  assert len(out.schedule()) == 1
  assert kernels(out) == 1
  np.testing.assert_allclose(out.numpy(), np.maximum(a.numpy() * b.numpy() + c.numpy(), 0), rtol=1e-6)


def test_reduce_fuses_its_inputs():
  a, b = rand(8, 32), rand(8, 32)
  out = (a * b).sum(1)
  assert kernels(out) == 1
  np.testing.assert_allclose(out.numpy(), (a.numpy() * b.numpy()).sum(1), rtol=1e-5, atol=1e-5)


def test_elementwise_after_reduce_fuses():
  a = rand(8, 32)
  out = (a.sum(1) * 2 + 1).relu()
  assert kernels(out) == 1
  np.testing.assert_allclose(out.numpy(), np.maximum(a.numpy().sum(1) * 2 + 1, 0), rtol=1e-5)


def test_reduce_of_reduce_is_two_kernels():
  a = rand(8, 32)
  assert kernels(a.sum(1).exp().sum(0)) == 2


def test_movement_ops_never_copy():
  x, y = rand(4, 6), rand(3, 2, 4, 5)
  moved = x.reshape(2, 3, 4).permute(1, 0, 2).reshape(3, 2, 4, 1).expand(3, 2, 4, 5)
  out = moved + y
  schedule = out.schedule()
  assert len(schedule) == 1
  assert {inp for inp in schedule[0].inputs} == {x.lazydata.base, y.lazydata.base}
  expected = x.numpy().reshape(2, 3, 4).transpose(1, 0, 2).reshape(3, 2, 4, 1) + y.numpy()
  np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6)


def test_contiguous_of_an_in_order_view_is_no_copy():
  # as PyTorch's contiguous() returns an already contiguous tensor itself
  x = rand(2, 3, 4)
  assert kernels(x.permute(2, 0, 1).permute(1, 2, 0).contiguous(), x.reshape(6, 4).contiguous()) == 0
  # computed as one tensor: its contiguous() is the same buffer, seen as (4, 6)
  doubled = x * 2
  assert kernels(doubled, doubled.reshape(4, 6).contiguous()) == 1
  np.testing.assert_allclose(x.permute(2, 0, 1).permute(1, 2, 0).contiguous().numpy(), x.numpy())
  # a view in another order, a part of its base, or a constant still gets its own buffer
  for copied in (x.permute(2, 0, 1), x[:, 1:], Tensor.ones(3, 4)):
    assert kernels(copied.contiguous()) == 1
  np.testing.assert_allclose(x[:, 1:].contiguous().numpy(), x.numpy()[:, 1:])


def test_padding_and_shrinking_stay_views():
  x = rand(5, 5)
  out = x.pad(((1, 1), (2, 0)))[1:, ::2].flip(0) * 3
  assert kernels(out) == 1
  expected = np.pad(x.numpy(), ((1, 1), (2, 0)))[1:, ::2][::-1] * 3
  np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6)


def test_softmax_is_at_most_three_kernels():
  x = rand(16, 32)
  out = x.softmax(1)
  assert kernels(out) <= 3
  e = np.exp(x.numpy() - x.numpy().max(1, keepdims=True))
  np.testing.assert_allclose(out.numpy(), e / e.sum(1, keepdims=True), rtol=1e-5)


def test_row_reduce_and_its_row_share_a_kernel():
  """softmax's sum and the normalize that reads it back over each row are one kernel (a second pass
  over the row while it is in cache); so are layernorm's variance and its output."""
  torch = __import__("torch")
  x = rand(64, 256)
  soft, norm = x.softmax(1), x.layernorm()
  assert [item.name for item in soft.schedule()] == ["r_64_256", "r_64_256"]
  assert [type(item.ast.srcs[0].op).__name__ for item in soft.schedule()] == ["ReduceOps", "BinaryOps"]
  assert len(norm.schedule()) == 2
  np.testing.assert_allclose(soft.numpy(), torch.softmax(torch.tensor(x.numpy()), 1).numpy(), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(norm.numpy(), torch.nn.functional.layer_norm(torch.tensor(x.numpy()), (256,)).numpy(),
                             rtol=1e-4, atol=1e-5)
  # not for a reduce over the outer axis, a whole-tensor reduce, or rows too long to stay in cache
  assert kernels(x.softmax(0)) == 3
  assert kernels(x - x.mean()) == 2
  assert kernels(rand(4, 16384).softmax(1)) == 3


def test_tensor_used_twice_is_computed_once():
  x, w = rand(8, 16), rand(16, 4)
  shared = x @ w                    # a reduce: recomputing it would double the work
  left, right = shared + 1, shared * 2
  assert kernels(left, right) == 3  # shared once, then each consumer
  assert left.schedule() == []      # realized tensors schedule nothing


def test_expensive_elementwise_used_twice_is_realized_once():
  x = rand(64)
  shared = x.exp().sin().exp().cos().exp().sin().log().exp().sqrt().exp()
  left, right = shared.sum(), shared * 3
  assert len(left.schedule()) == 1   # alone, the chain fuses into the reduce
  assert kernels(left, right) == 3


def test_cheap_elementwise_used_twice_is_recomputed():
  x = rand(64)
  shared = x * 2
  assert kernels(shared.sum(), shared + 1) == 2


def test_elementwise_read_several_times_by_one_kernel_stays_in_it():
  """gelu reads x + b twice (0.5 x and erf's input), and erf's series (engine/erf.py) reads its variables up to 12
  times: all in the same kernel, so each is computed there once instead of being written to memory and read back."""
  x, b = rand(32, 64), rand(64)
  out = (x + b).gelu()
  assert kernels(out) == 1
  torch = __import__("torch")
  np.testing.assert_allclose(out.numpy(), torch.nn.functional.gelu(torch.tensor(x.numpy() + b.numpy())).numpy(),
                             rtol=1e-5, atol=1e-6)
  # an expensive chain read by two kernels is still realized once, and a long reuse chain builds fast
  shared = x.exp().sin().exp().cos().exp().sin().log().exp().sqrt().exp()
  assert kernels(shared.sum(), shared * 3) == 3
  deep = x
  for _ in range(40): deep = deep * deep * 0.5 + deep
  assert kernels(deep) == 1


def test_gelu_read_by_a_matmul_keeps_erf_in_few_kernels():
  """GELU before a matmul (a GPT MLP): the matmul's expanding read makes gelu's output a kernel of its
  own, and erf is one node of the lazy graph, read once, which the scheduler expands into its series inside
  gelu's kernel: 3 kernels. When erf's series was recorded op by op, its variables read several times had to
  stay cheap enough to recompute (a float64 series with clipped inputs made 5 kernels; Clenshaw's recurrence,
  each step reading the two before, one kernel per step: 22)."""
  x, w1, b, w2 = rand(16, 32), rand(32, 64), rand(64), rand(64, 8)
  out = (x @ w1 + b).gelu() @ w2
  assert len(out.schedule()) == 3
  torch = __import__("torch")
  expected = torch.nn.functional.gelu(torch.tensor(x.numpy() @ w1.numpy() + b.numpy())) @ torch.tensor(w2.numpy())
  np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)


def test_gelu_backward_is_few_kernels():
  """GELU's gradient is its closed form (function.Gelu: erf's own derivative, 2/sqrt(pi) exp(-x^2), inside), not
  autograd through erf's series, which kept each Horner step's value for backward: 21 kernels per GELU of a ViT step."""
  x = rand(16, 32)
  w1, w2 = Tensor.randn(32, 64, requires_grad=True).realize(), Tensor.randn(64, 8, requires_grad=True).realize()
  ((x @ w1).gelu() @ w2).sum().backward()
  # the matmul; the gradient's matmul times gelu's slope (erf's series inline); w1's gradient (4 with the slope
  # autograd made of GELU's five ops, 6 with erf's float64 series recorded op by op, 24 with autograd through it)
  assert len([item for item in w1.grad.schedule() if item.is_kernel]) == 3
  torch = __import__("torch")
  tw1, tw2 = (torch.tensor(t.numpy(), requires_grad=True) for t in (w1, w2))
  (torch.nn.functional.gelu(torch.tensor(x.numpy()) @ tw1) @ tw2).sum().backward()
  np.testing.assert_allclose(w1.grad.numpy(), tw1.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_erf_is_one_recorded_op_expanded_in_its_kernel():
  """erf is one node of the lazy graph (a decoding step records and keys ~70 fewer per GELU); the kernel tree has
  its series in primitive ops (engine/erf.py), which no device needs to know."""
  x = rand(8, 16)
  out = (x * 2).erf()
  assert out.lazydata.op is UnaryOps.ERF and out.lazydata.srcs[0].op is not UnaryOps.ERF
  (item,) = out.schedule()
  ops = [node.op for node in item.ast.walk()]
  assert UnaryOps.ERF not in ops and ops.count(TernaryOps.WHERE) == 3
  torch = __import__("torch")
  np.testing.assert_allclose(out.numpy(), torch.erf(torch.tensor(x.numpy()) * 2).numpy(), rtol=1e-6, atol=1e-7)


_built: list[tuple[int, ...]] = []


def _running_sums(srcs: tuple[LazyBuffer, ...], steps: int) -> LazyBuffer:
  # a loop that records an op per step: x_t = x_(t-1) + a[t] (a cat of every x_t), built only on a miss
  (a,) = srcs
  _built.append(a.shape)
  xs, x = [], None
  for t in range(steps):
    row = a.shrink(((t, t + 1), (0, a.shape[1])))
    x = row if x is None else x.e(BinaryOps.ADD, row)
    xs.append(x)
  return cat(xs, 0)


def _wrong_shape(srcs: tuple[LazyBuffer, ...]) -> LazyBuffer: return srcs[0].reshape((srcs[0].size,))


def test_subgraph_is_one_node_built_only_when_scheduled_anew():
  """A SUBGRAPH node (LazyBuffer.subgraph: an LSTM's time steps) is recorded and keyed as one node, and its builder
  records the graph only when the schedule cache has no schedule for the graph it is in."""
  _built.clear()
  def running(values: np.ndarray) -> Tensor:
    a = Tensor(values).lazydata
    return Tensor(LazyBuffer.subgraph((a,), _running_sums, (5,), (5, 3), a.dtype))
  values = np.arange(15, dtype=np.float32).reshape(5, 3)
  first = running(values)
  assert first.lazydata.op is LoadOps.SUBGRAPH
  np.testing.assert_array_equal(first.numpy(), np.cumsum(values, 0))
  again = running(values * 2)
  np.testing.assert_array_equal((again * 1).numpy(), np.cumsum(values * 2, 0) * 1)
  np.testing.assert_array_equal(running(values + 1).numpy(), np.cumsum(values + 1, 0))
  assert len(_built) == 2, "built again for a graph scheduled before"   # the first graph, and again * 1's
  bad = Tensor(LazyBuffer.subgraph((Tensor(values).lazydata,), _wrong_shape, (), (5, 3), first.dtype))
  with pytest.raises(RuntimeError, match="_wrong_shape built"): bad.realize()


def test_erf_gradient_is_exact_in_float64():
  torch = __import__("torch")
  values = np.linspace(-7, 7, 301)
  x = Tensor(values, requires_grad=True)
  x.erf().sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), 2 / math.sqrt(math.pi) * np.exp(-values ** 2), rtol=1e-14, atol=1e-300)
  reference = torch.tensor(values, requires_grad=True)
  reference.erf().sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), reference.grad.numpy(), rtol=1e-14, atol=1e-300)


def test_linear_weight_gradient_is_one_sum_over_every_row():
  """x (batch, tokens, k) @ w (k, m) is one (batch * tokens, k) matmul, so w's gradient is one reduce over
  every row; with w broadcast over the batch it was a (batch, k, m) sum per batch index, then a second."""
  x, w = rand(4, 6, 8), Tensor.randn(8, 5, requires_grad=True).realize()
  (x @ w).sum().backward()
  reduces = [item for item in w.grad.schedule()
             if item.is_kernel and any(isinstance(n.op, ReduceOps) for n in item.ast.walk())]
  assert len(reduces) == 1
  np.testing.assert_allclose(w.grad.numpy(), x.numpy().reshape(24, 8).sum(0)[:, None].repeat(5, 1), rtol=1e-5, atol=1e-5)


def test_matmul_of_merged_heads_reads_one_view():
  """An attention output (batch, heads, tokens, head size) read as (batch, tokens, width) by the output
  projection: its width axis is (heads, head size) in memory, so the matmul kernel runs over that split
  (codegen/refine.py) and reads the operand through one affine view, not through div/mod of stacked views."""
  heads, w = rand(2, 3, 5, 4), rand(12, 7)
  merged = heads.permute(0, 2, 1, 3).reshape(2, 5, 12)
  out = merged @ w
  (item,) = [item for item in out.schedule() if item.is_kernel]
  assert all(len(load.arg[1].views) == 1 for load in _loads(item))
  expected = heads.numpy().transpose(0, 2, 1, 3).reshape(2, 5, 12) @ w.numpy()
  np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)
  # and its gradients: the weight's sums over (batch, tokens), the heads' over width, both through one view
  h, w = Tensor.randn(2, 3, 5, 4, requires_grad=True).realize(), Tensor.randn(12, 7, requires_grad=True).realize()
  (h.permute(0, 2, 1, 3).reshape(2, 5, 12) @ w).square().sum().backward()
  torch = __import__("torch")
  th, tw = (torch.tensor(t.numpy(), requires_grad=True) for t in (h, w))
  (th.permute(0, 2, 1, 3).reshape(2, 5, 12) @ tw).square().sum().backward()
  np.testing.assert_allclose(h.grad.numpy(), th.grad.numpy(), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_cat_of_heads_gradients_reads_one_view_per_piece():
  """The gradient of a (batch, tokens, 3 x width) projection split into q, k, v and read as heads (batch, heads,
  tokens, head size): a cat of the three heads-layout gradients. Its kernel runs over (batch, tokens, 3, heads,
  head size) (codegen/refine.py), so each piece is one masked view with SIMD rows, not div/mod of stacked views;
  the gradient is PyTorch's."""
  B, T, H, D = 2, 8, 4, 16
  x, a = np.random.default_rng(0).standard_normal((B, T, 3 * H * D)).astype(np.float32), rand(B, H, T, D)
  qkv = Tensor(x, requires_grad=True)
  heads = [(t.reshape(B, T, H, D).transpose(1, 2) * a).contiguous() for t in qkv.split(H * D, 2)]
  sum(h.exp().sum() for h in heads).backward()
  item = qkv.grad.schedule()[-1]
  assert len(_loads(item)) == 3 and all(len(load.arg[1].views) == 1 for load in _loads(item))
  torch = __import__("torch")
  tx = torch.tensor(x, requires_grad=True)
  sum((t.reshape(B, T, H, D).transpose(1, 2) * torch.tensor(a.numpy())).exp().sum() for t in tx.split(H * D, 2)).backward()
  np.testing.assert_allclose(qkv.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_each_decision_is_made_by_a_named_rule():
  """Whether a base gets a kernel is decided by the first rule of REALIZE_RULES that holds, once per base."""
  x = rand(32, 64)
  names = [name for name, _, _ in schedule.REALIZE_RULES]
  shifted = x + 1
  for out, rule in ((shifted * shifted + shifted, "one_kernel"), (x.softmax(-1), "cheap"), (x @ rand(64, 64) * 2, "read_once")):
    decided_by = schedule._Scheduler([out.lazydata]).decided_by
    assert rule in decided_by.values() and set(decided_by.values()) <= set(names)
    assert decided_by[out.lazydata.base] == "output"


def test_long_chain_is_cut_into_kernels():
  """A loop of elementwise updates realized once: 600 ops deep, cut every MAX_FUSED_DEPTH ops."""
  x = rand(8, 8)
  out, expected = x, x.numpy()
  for _ in range(300):
    out = out * 0.999 + 0.01
    expected = expected * np.float32(0.999) + np.float32(0.01)
  assert kernels(out) == 600 // (MAX_FUSED_DEPTH + 1) + 1
  np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5)


def test_deep_graphs_schedule_under_the_default_recursion_limit():
  """An unrolled RNN's backward, and chains of reduces (softmax, layernorm) realized once: each
  schedule walks a graph thousands of ops deep. Compared with PyTorch."""
  torch = __import__("torch")
  # Python's default: some libraries raise it on import (tinygrad, imported by another test on this worker, to 10000)
  limit = sys.getrecursionlimit()
  sys.setrecursionlimit(1000)
  try:
    _deep_graphs(torch)
  finally:
    sys.setrecursionlimit(limit)


def _deep_graphs(torch) -> None:
  w0, h0 = np.random.default_rng(0).standard_normal((2, 8, 8)).astype(np.float32) * 0.4
  w, wt = Tensor(w0, requires_grad=True), torch.tensor(w0, requires_grad=True)
  h, ht = Tensor(h0), torch.tensor(h0)
  for _ in range(300): h, ht = (h @ w).tanh(), (ht @ wt).tanh()
  (h * h).sum().backward()
  (ht * ht).sum().backward()
  np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-4, atol=1e-5)
  x = Tensor(h0, requires_grad=True)
  xt = torch.tensor(h0, requires_grad=True)
  y, yt = x, xt
  for _ in range(100):
    y = y.softmax(-1).layernorm() * 1.5
    yt = torch.nn.functional.layer_norm(yt.softmax(-1), (8,), eps=1e-5) * 1.5
  (y * y[0]).sum().backward()
  (yt * yt[0]).sum().backward()
  np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-3, atol=1e-4)


def test_schedule_does_not_run():
  x = rand(4, 4)
  out = (x + 1).sum()
  GlobalCounters.reset()
  items = out.schedule()
  assert GlobalCounters.kernel_count == 0 and out.lazydata.base.realized is None
  assert [type(item.ast.srcs[0].op) for item in items] == [ReduceOps]
  assert items[0].name == "r_4_4"


def test_global_counters_count_flops_and_bytes():
  a, b = rand(32, 32), rand(32, 32)
  GlobalCounters.reset()
  (a + b).realize()
  assert GlobalCounters.kernel_count == 1
  assert GlobalCounters.global_ops == 32 * 32
  assert GlobalCounters.global_mem == 3 * 32 * 32 * 4


def test_get_buffers_lists_inputs_and_outputs():
  a, b = rand(2, 3), rand(3, 4)
  out = (a @ b).relu()
  buffers = out.get_buffers()
  assert ("input", (2, 3), "float32") in buffers and ("input", (3, 4), "float32") in buffers
  assert buffers[-1][0] == "output"


def _loads(item) -> list:
  return [n for n in item.ast.walk() if n.op.name == "LOAD"]


def test_max_pool_gradient_reads_one_view_per_buffer():
  """The pool gradient is the pooled result expanded over each window, read as the input's shape: the
  kernel runs over the (out, kernel) split instead, where every load is one affine view (codegen/refine.py)."""
  x = Tensor.randn(2, 3, 8, 8, requires_grad=True).realize()
  x.relu().max_pool2d(2).sum().backward()
  items = [item for item in x.grad.schedule() if item.is_kernel]
  assert items and all(len(load.arg[1].views) == 1 for item in items for load in _loads(item))
  expected = x.numpy().reshape(2, 3, 4, 2, 4, 2)
  is_max = expected == np.maximum(expected.max(axis=(3, 5), keepdims=True), 0)
  np.testing.assert_array_equal(x.grad.numpy(), (is_max & (expected > 0)).reshape(2, 3, 8, 8).astype(np.float32))


@pytest.mark.parametrize("channels_last", [False, True])
def test_overlapping_max_pool_gradient_is_elementwise(channels_last):
  """A 3x3 stride-2 padded max-pool (ResNet's): its gradient (function.MaxPool) is a count of each window's
  maxima and one elementwise sum over the taps over the input's own positions, every load one view. Left to
  pool_windows' movement ops it was a reduce that scattered the windows back through four stacked views
  (52 ms at ResNet-18's batch 8, where PyTorch takes ~1 ms). Ties share the gradient, as Max does."""
  torch = __import__("torch")
  data = np.round(np.random.default_rng(0).standard_normal((2, 4, 12, 12)), 1).astype(np.float32)   # ties
  leaf = Tensor(data.transpose(0, 2, 3, 1).copy() if channels_last else data, requires_grad=True)
  x = leaf.permute(0, 3, 1, 2) if channels_last else leaf     # a convolution's output is laid out so
  assert (x.lazydata.st.permuted_order is not None) == channels_last
  g = rand(2, 4, 6, 6)
  out = x.max_pool2d(3, 2, 1)
  (out * g).sum().backward()
  items = [item for item in leaf.grad.schedule() if item.is_kernel]
  assert len(items) <= 4 and all(len(load.arg[1].views) == 1 for item in items for load in _loads(item))
  grad = leaf.grad.permute(0, 3, 1, 2) if channels_last else leaf.grad
  windows = torch.nn.functional.unfold(torch.tensor(data), 3, padding=1, stride=2).reshape(2, 4, 9, 6, 6)
  inside = torch.nn.functional.unfold(torch.ones(1, 1, 12, 12), 3, padding=1, stride=2).reshape(1, 1, 9, 6, 6) > 0
  windows = torch.where(inside, windows, -math.inf)
  is_max = (windows == windows.amax(2, keepdim=True)).float()
  spread = is_max / is_max.sum(2, keepdim=True) * torch.tensor(g.numpy()).reshape(2, 4, 1, 6, 6)
  expected = torch.nn.functional.fold(spread.reshape(2, 36, 36), (12, 12), 3, padding=1, stride=2)
  np.testing.assert_allclose(out.numpy(), torch.nn.functional.max_pool2d(torch.tensor(data), 3, 2, 1).numpy())
  np.testing.assert_allclose(grad.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)


def test_convolution_gradients_are_window_sums_without_scatter():
  """Conv's backward is two convolutions (input and weight gradient), not a scatter-add of overlapping
  windows (a third reduce reading through three stacked views). Only padding stacks a masked view."""
  x, w = Tensor.randn(2, 4, 9, 9, requires_grad=True).realize(), Tensor.randn(8, 4, 3, 3, requires_grad=True).realize()
  x.conv2d(w, padding=1).sum().backward()
  items = [item for g in (x.grad, w.grad) for item in g.schedule() if item.is_kernel]
  assert all(len(load.arg[1].views) <= 2 for item in items for load in _loads(item))
  assert sum(1 for item in items if any(isinstance(n.op, ReduceOps) for n in item.ast.walk())) == 2


def _multiply_adds(items) -> int:
  """Products the reduce kernels of a schedule compute: each output times the size of its reduce."""
  total = 0
  for item in items:
    for node in item.ast.walk():
      if isinstance(node.op, ReduceOps): total += item.output.size * math.prod(node.arg[1][a] for a in node.arg[0])
  return total


@pytest.mark.parametrize("size,cin,kernel,stride,padding", [(12, 8, 5, 1, 0), (8, 16, 3, 2, 1)], ids=["5x5-on-12x12", "stride-2"])
def test_wasteful_input_gradient_goes_tap_by_tap(size, cin, kernel, stride, padding):
  """A 5x5 convolution of a 12x12 image: as one convolution over the padded output gradient, the input
  gradient would multiply 144 positions by 25 taps where 64 by 25 are real (with stride 2, three in four
  products land between the strides). Tap by tap, its one reduce is a matmul over output channels with
  exactly the real products, and the weight gradient reuses its channels-last copy of the output gradient."""
  torch = __import__("torch")
  # 8 x 25 or 16 x 9 products per weight: the weight gradient reads a channels-last gradient too (CHANNELS_LAST_GRAD_MIN_WORK)
  x = Tensor.randn(2, cin, size, size, requires_grad=True).realize()
  w = Tensor.randn(6, cin, kernel, kernel, requires_grad=True).realize()
  out = x.conv2d(w, stride=stride, padding=padding).realize()
  g = rand(*out.shape)
  (out * g).sum().backward()
  assert _multiply_adds(x.grad.schedule()) == g.numel() * cin * kernel * kernel
  x.grad.realize()
  assert all(item.output.size != g.numel() for item in w.grad.schedule())
  tx, tw = torch.tensor(x.numpy(), requires_grad=True), torch.tensor(w.numpy(), requires_grad=True)
  torch.nn.functional.conv2d(tx, tw, stride=stride, padding=padding).backward(torch.tensor(g.numpy()))
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_whole_tensor_sum_splits_so_threads_share_it(monkeypatch):
  monkeypatch.delenv("NOOPT", raising=False)    # NOOPT=1 keeps plain kernels: checked at the end
  x = rand(1 << 20)
  items = x.sum().schedule()
  # 64 partial sums (an output loop threads can split), then their total
  assert [item.output.size for item in items] == [64, 1]
  np.testing.assert_allclose(x.sum().numpy(), x.numpy().astype(np.float64).sum(), rtol=1e-5, atol=1e-3)
  np.testing.assert_allclose(x.reshape(2, -1).max(1).numpy(), x.numpy().reshape(2, -1).max(1))
  # short reduces, float16 and NOOPT keep one kernel
  assert len(rand(4096).sum().schedule()) == 1
  assert len(x.half().realize().sum().schedule()) == 1
  monkeypatch.setenv("NOOPT", "1")
  assert len(x.sum().schedule()) == 1


def test_ops_on_a_permuted_buffer_keep_its_layout(monkeypatch):
  """Elementwise ops and reduces over one permutation of a contiguous buffer run in the buffer's own
  order and give a permuted view: no transposing copy, SIMD along the buffer's contiguous axis."""
  monkeypatch.delenv("NOOPT", raising=False)
  base = rand(4, 6, 5, 8)
  view = base.permute(0, 3, 1, 2)                        # NHWC memory seen as NCHW
  out = (view * 2 + 1).relu()
  assert out.lazydata.st.permuted_order == (0, 2, 3, 1)
  assert len(out.schedule()) == 1
  nchw = base.numpy().transpose(0, 3, 1, 2)
  np.testing.assert_allclose(out.numpy(), np.maximum(nchw * 2 + 1, 0), rtol=1e-6)
  np.testing.assert_allclose(view.max((2, 3)).numpy(), nchw.max((2, 3)))
  # a per-channel broadcast (batchnorm's mean) reads the same in any order: the layout survives it
  mean = rand(8)
  centered = view - mean.reshape(1, 8, 1, 1)
  assert centered.lazydata.st.permuted_order == (0, 2, 3, 1)
  np.testing.assert_allclose(centered.numpy(), nchw - mean.numpy().reshape(1, 8, 1, 1), rtol=1e-6)
  # mixed layouts (one contiguous input) fall back to a plain kernel writing NCHW
  other = rand(4, 8, 6, 5)
  mixed = view + other
  assert mixed.lazydata.st.contiguous
  np.testing.assert_allclose(mixed.numpy(), nchw + other.numpy(), rtol=1e-6)


def test_conv_relu_pool_has_no_transposing_copy(monkeypatch):
  """The convolution's channels-last sum keeps its layout through ReLU (fused into it) and max-pool
  (SIMD over channels); only the 4x smaller pooled result is copied back to NCHW."""
  monkeypatch.delenv("NOOPT", raising=False)
  x, w = rand(4, 3, 10, 10), rand(8, 3, 3, 3)
  items = x.conv2d(w).relu().max_pool2d(2).schedule()
  # the convolution (+ReLU, reading the weight where it is), the pool, the pooled result to NCHW
  assert [item.output.size for item in items] == [4 * 8 * 8 * 8, 4 * 8 * 4 * 4, 4 * 8 * 4 * 4]


def test_single_channel_conv_weight_gradient_reads_the_channels_last_gradient(monkeypatch):
  """conv(1 -> 8) -> relu -> max-pool: the gradient reaching the convolution is channels-last, and the
  weight gradient reads it that way; an NCHW copy would be a transposing kernel gcc can't vectorize."""
  monkeypatch.delenv("NOOPT", raising=False)
  torch = __import__("torch")
  x, w = rand(4, 1, 10, 10), Tensor.randn(8, 1, 3, 3, requires_grad=True).realize()
  x.conv2d(w).relu().max_pool2d(2).sum().backward()
  full = 4 * 8 * 8 * 8
  for item in w.grad.schedule():
    if not item.is_kernel or item.output.size != full or not item.name.startswith("E_"): continue
    for load in _loads(item):
      strides = [s for s in load.arg[1].views[-1].strides if s != 0]
      assert strides == sorted(strides, reverse=True), (item.name, load.arg[1])   # walks memory in order
  tw = torch.tensor(w.numpy(), requires_grad=True)
  torch.nn.functional.max_pool2d(torch.nn.functional.conv2d(torch.tensor(x.numpy()), tw).relu(), 2).sum().backward()
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_constant_gradient_is_not_copied_into_a_padded_buffer(monkeypatch):
  """out.sum()'s gradient is a constant: the input gradient's convolution reads it through its padded
  view (a masked constant, no memory) instead of a dense padded copy of ones."""
  monkeypatch.delenv("NOOPT", raising=False)
  torch = __import__("torch")
  x = Tensor.randn(2, 4, 9, 9, requires_grad=True).realize()
  w = Tensor.randn(6, 4, 3, 3, requires_grad=True).realize()
  x.conv2d(w).sum().backward()
  for item in x.grad.schedule():
    assert not (item.is_kernel and item.ast.srcs[0].op.name == "CONST"), item.name   # a kernel storing a constant
  tx, tw = torch.tensor(x.numpy(), requires_grad=True), torch.tensor(w.numpy(), requires_grad=True)
  torch.nn.functional.conv2d(tx, tw).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_kernels_do_not_depend_on_the_order_of_the_outputs():
  """A CNN's gradients asked for last layer first (as data-parallel training averages them) made conv1's bias
  gradient recompute the ReLU/max-pool backward (a DIV by the pool's tie count) inline, because its reduce was
  built before the weight gradient's kernel forced that input into memory: now the reduce loads it, in either
  order. The reversed order first: with the old rule, a first scheduling of these gradients in one order also
  decided the second's (both inlined, or both loaded), so only the first one shows it."""
  from tinychad import nn
  model = nn.Sequential(nn.Conv2d(1, 32, 5), Tensor.relu, lambda x: x.max_pool2d(2), nn.Conv2d(32, 64, 5), Tensor.relu,
                        lambda x: x.max_pool2d(2), lambda x: x.flatten(1), nn.Linear(1024, 10))
  Tensor.realize(*model.parameters())
  model(rand(64, 1, 28, 28)).cross_entropy(Tensor(np.arange(64) % 10)).backward()   # scheduled, never run
  grads = [p.grad.contiguous().lazydata for p in model.parameters()]   # each in a buffer of its own, as DDP has them
  for outs in (grads[::-1], grads):
    scheduler = schedule._Scheduler(outs)   # not create_schedule: its cache would answer the second order from the first
    scheduler.schedule()
    bias_grads = [item.ast.pretty() for item in scheduler.items if item.output.size == 32]
    assert bias_grads and not any("DIV" in text for text in bias_grads), bias_grads


# ---- a cat's pieces written in place (_Scheduler.cats_in_place) ----
def _stacked(*pieces: Tensor) -> Tensor:
  """The pieces (1, ...) one after another along axis 0: each fills one contiguous stretch of the cat."""
  return pieces[0].cat(*pieces[1:], dim=0)


def _in_place(items: list) -> tuple[list, list]:
  """(the cats' buffers, the pieces written into them) of a schedule."""
  return [it for it in items if it.ast.op is LoadOps.EMPTY], [it for it in items if it.into is not None]


@pytest.mark.parametrize("device", ["NUMPY", "CPU", "LLVM"])
def test_a_cats_pieces_are_written_into_its_buffer(device, set_noopt):
  set_noopt("0")     # NOOPT=1 writes no cat in place: test_cats_that_stay_kernels
  from tinychad.device import BufferView
  a, b = Tensor.randn(4, 16, device=device).realize(), Tensor.randn(4, 16, device=device).realize()
  x, y = (a * 2).reshape(1, 64), (b.exp() + 1).reshape(1, 64)
  out = _stacked(x, y)
  items = out.schedule()
  cats, pieces = _in_place(items)
  # the cat is a buffer and no kernel; each piece's kernel writes its stretch of it
  assert len(items) == 3 and [it.output for it in cats] == [out.lazydata.base]
  assert [it.into for it in pieces] == [(out.lazydata.base, 0), (out.lazydata.base, 64)]
  want = np.concatenate([a.numpy().reshape(1, 64) * 2, np.exp(b.numpy()).reshape(1, 64) + 1])
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
  views = [x.lazydata.base.realized, y.lazydata.base.realized]
  assert all(isinstance(v, BufferView) and v.view_of is out.lazydata.base.realized for v in views)
  assert [v.view_offset for v in views] == [0, 64 * 4]
  np.testing.assert_allclose(y.numpy(), want[1:], rtol=1e-6)   # a piece reads as itself
  # the same graph again runs its prepared launch: new values, the same places
  c = Tensor.randn(4, 16, device=device).realize()
  again = _stacked((c * 2).reshape(1, 64), (b.exp() + 1).reshape(1, 64))
  np.testing.assert_allclose(again.numpy(), np.concatenate([c.numpy().reshape(1, 64) * 2, want[1:]]), rtol=1e-6)


def test_a_cat_of_many_pieces_nests_its_groups_in_place(set_noopt):
  set_noopt("0")
  # function.cat groups more than CAT_MAX_PIECES pieces: each group is a piece of the whole, written in place too
  pieces = [Tensor.randn(1, 16).realize() for _ in range(40)]
  out = _stacked(*[(p * 3).relu() for p in pieces])
  items = out.schedule()
  cats, written = _in_place(items)
  assert len(cats) == 1 + math.ceil(40 / (math.isqrt(39) + 1)) and len(written) == 40 + len(cats) - 1
  assert sum(1 for it in items if it.is_kernel) == 40
  np.testing.assert_allclose(out.numpy(), np.maximum(np.concatenate([p.numpy() for p in pieces]) * 3, 0), rtol=1e-6)


def test_a_cat_read_by_two_kernels_is_loaded_not_recomputed(set_noopt):
  set_noopt("0")
  # a cat of few pieces is cheap: the rules would have each reader add its pieces' masked loads; in place, they load it
  a, b = rand(1, 32), rand(1, 32)
  both = _stacked(a.exp(), b.exp())
  s, m = both.sum(1), both.max(1)
  items = create_schedule([s.lazydata, m.lazydata])
  assert len(_in_place(items)[1]) == 2 and sum(1 for it in items if it.is_kernel) == 4
  Tensor.realize(s, m)
  want = np.exp(np.concatenate([a.numpy(), b.numpy()]))
  np.testing.assert_allclose(s.numpy(), want.sum(1), rtol=1e-5)
  np.testing.assert_allclose(m.numpy(), want.max(1), rtol=1e-6)


def test_booleans_cat_in_place(set_noopt):
  set_noopt("0")
  a, b = rand(1, 64), rand(1, 64)
  out = _stacked(a > 0, b < 0)
  assert len(_in_place(out.schedule())[1]) == 2
  np.testing.assert_array_equal(out.numpy(), np.concatenate([a.numpy() > 0, b.numpy() < 0]))


def test_cats_that_stay_kernels(set_noopt):
  set_noopt("0")
  from tinychad.engine.schedule_cache import CatsInPlace
  a, b = rand(2, 16), rand(2, 16)
  def check(out: Tensor, want: np.ndarray) -> None:
    items = out.schedule()
    assert _in_place(items) == ([], []) and len(items) == 3, [it.name for it in items]
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
  # along an inner axis, each piece's stretch is cut in rows
  check((a * 2).cat(b * 2, dim=1), np.concatenate([a.numpy(), b.numpy()], 1) * 2)
  # a piece's end that isn't PIECE_ALIGN_BYTES-aligned: vectorized stores assume aligned buffers
  c = rand(1, 3)
  check(_stacked((c * 2), (c * 3)), np.concatenate([c.numpy() * 2, c.numpy() * 3]))
  # a piece padded with zeros inside its stretch fills it only in part
  check(_stacked((a * 2)[:1].pad(((0, 0), (0, 16))), (b * 2).reshape(1, 32)),
        np.concatenate([np.pad(a.numpy()[:1] * 2, ((0, 0), (0, 16))), b.numpy().reshape(1, 32) * 2]))
  # a piece computed before: written nowhere now (a copy would cost what the cat's kernel does)
  d = (a * 2).reshape(1, 32).realize()
  items = _stacked(d, (b * 2).reshape(1, 32)).schedule()
  assert _in_place(items) == ([], []) and len(items) == 2
  # export's capture (CatsInPlace.off) and NOOPT=1 (the plain path)
  rows = np.concatenate([a.numpy(), b.numpy()]).reshape(2, 32)
  with CatsInPlace.off(): check(_stacked((a * 4).reshape(1, 32), (b * 4).reshape(1, 32)), rows * 4)
  set_noopt("1")
  check(_stacked((a * 5).reshape(1, 32), (b * 5).reshape(1, 32)), rows * 5)
