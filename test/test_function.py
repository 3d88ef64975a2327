"""function.py's Functions recorded as one node where nothing will differentiate them (Function.one_node): the same
values and the same kernels as their ops recorded one by one, a few LazyBuffers instead of dozens."""
from __future__ import annotations
import numpy as np
import pytest
from tinychad import GlobalCounters, Tensor, no_grad
from tinychad.nn import functional as F
from tinychad.ops import LoadOps

rng = np.random.default_rng(0)


def values(*shape: int) -> np.ndarray: return rng.standard_normal(shape).astype(np.float32)


def _linear(x, w, b=None): return F.linear(x, w, b)
def _layer_norm(x, w, b): return F.layer_norm(x, x.shape[-1:], w, b, eps=1e-3)
def _layer_norm_plain(x): return F.layer_norm(x, x.shape[-2:])
def _causal(q, k, v): return F.scaled_dot_product_attention(q, k, v, is_causal=True)
def _masked(q, k, v, m): return F.scaled_dot_product_attention(q, k, v, attn_mask=m)
def _bool_masked(q, k, v, m): return F.scaled_dot_product_attention(q, k, v, attn_mask=m > 0)
def _cat(a, b, c): return Tensor.cat(a, b, c, dim=1)
def _transposed_linear(x, w): return F.linear(x.transpose(1, 2), w)
def _gelu(x): return x.gelu()


CASES = {
  "linear with bias": (_linear, [(2, 3, 8), (5, 8), (5,)]),
  "linear without bias": (_linear, [(7, 8), (4, 8)]),
  "linear of a transposed input": (_transposed_linear, [(2, 8, 3), (6, 8)]),
  "layer_norm": (_layer_norm, [(4, 6, 16), (16,), (16,)]),
  "layer_norm over two axes, no affine": (_layer_norm_plain, [(3, 5, 7)]),
  "causal attention": (_causal, [(1, 2, 5, 8), (1, 2, 5, 8), (1, 2, 5, 8)]),
  "attention with an additive mask": (_masked, [(2, 2, 3, 4), (2, 2, 6, 4), (2, 2, 6, 4), (3, 6)]),
  "attention with a bool mask": (_bool_masked, [(1, 4, 1, 8), (1, 4, 9, 8), (1, 4, 9, 8), (1, 9)]),
  "cat": (_cat, [(2, 3, 4), (2, 1, 4), (2, 5, 4)]),
  "gelu": (_gelu, [(4, 33)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_one_node_under_no_grad_gives_the_values_and_kernels_of_the_ops(name: str):
  fn, shapes = CASES[name]
  arrays = [values(*shape) for shape in shapes]
  # recorded op by op: a parameter that needs a gradient makes the Function record its ops
  recorded = fn(*[Tensor(a, requires_grad=True).realize() for a in arrays])
  assert recorded.lazydata.base.op is not LoadOps.SUBGRAPH
  GlobalCounters.reset()
  expected = recorded.numpy()
  op_kernels = GlobalCounters.kernel_count
  with no_grad():
    node = fn(*[Tensor(a).realize() for a in arrays])
  assert node.lazydata.base.op is LoadOps.SUBGRAPH, "no_grad records the Function as one node"
  assert not node.requires_grad
  GlobalCounters.reset()
  np.testing.assert_array_equal(node.numpy(), expected)
  assert GlobalCounters.kernel_count == op_kernels


def test_inputs_that_never_need_a_gradient_make_one_node_outside_no_grad():
  x, w = (Tensor(values(4, 8), requires_grad=False) for _ in range(2))
  out = F.linear(x, w)
  assert out.lazydata.base.op is LoadOps.SUBGRAPH
  np.testing.assert_allclose(out.numpy(), x.numpy() @ w.numpy().T, rtol=1e-5, atol=1e-6)
  maybe = F.linear(Tensor(values(4, 8)), w)   # requires_grad None: a backward pass may still reach it
  assert maybe.lazydata.base.op is not LoadOps.SUBGRAPH


def test_a_linear_then_gelu_stays_one_kernel():
  """The node takes over the base the Linear computes, so the GELU after it fuses its sum as it would the ops'."""
  x, w, b = Tensor(values(8, 16)).realize(), Tensor(values(32, 16)).realize(), Tensor(values(32)).realize()
  with no_grad():
    out = F.gelu(F.linear(x, w, b))
    GlobalCounters.reset()
    out.realize()
  assert GlobalCounters.kernel_count == 1
  torch = pytest.importorskip("torch")
  reference = torch.nn.functional.gelu(torch.nn.functional.linear(*(torch.tensor(t.numpy()) for t in (x, w, b))))
  np.testing.assert_allclose(out.numpy(), reference.numpy(), rtol=1e-5, atol=1e-6)


def test_argmax_is_one_node_and_takes_a_nan_as_the_maximum_as_pytorch():
  torch = pytest.importorskip("torch")
  a = np.array([[1.0, np.nan, 3.0], [2.0, 2.0, np.nan], [0.5, 4.0, 4.0]], np.float32)
  x = Tensor(a, requires_grad=True)
  picked = x.argmax(1)
  assert picked.lazydata.base.op is LoadOps.SUBGRAPH and not picked.requires_grad, "an index has no gradient"
  for axis in (0, 1):
    for keepdim in (False, True):
      np.testing.assert_array_equal(x.argmax(axis, keepdim).numpy(), torch.tensor(a).argmax(axis, keepdim).numpy())
      np.testing.assert_array_equal(x.argmin(axis, keepdim).numpy(), torch.tensor(a).argmin(axis, keepdim).numpy())
  assert x.argmax().item() == torch.tensor(a).argmax().item() == 1
