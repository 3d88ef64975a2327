"""Bad input raises a clear error at the user's call, naming the op, the shapes and the dtypes."""
from __future__ import annotations
import numpy as np
import pytest
from tinychad import Tensor, dtypes


def raises(exc, *words):
  """pytest.raises that also checks the message names every word given."""
  class Checker:
    def __enter__(self):
      self.ctx = pytest.raises(exc)
      self.info = self.ctx.__enter__()
      return self.info
    def __exit__(self, *args):
      handled = self.ctx.__exit__(*args)
      message = str(self.info.value)
      for word in words: assert word in message, f"{word!r} not in {message!r}"
      return handled
  return Checker()


def test_broadcast_mismatch():
  with raises(ValueError, "add", "(2, 3)", "(4,)"): Tensor.ones(2, 3) + Tensor.ones(4)


def test_matmul_mismatch_names_shapes_and_dtypes():
  with raises(ValueError, "matmul", "(2, 3)", "(4, 5)", "float32"): Tensor.ones(2, 3) @ Tensor.ones(4, 5)
  with raises(ValueError, "matmul", "1 dim"): Tensor.ones(()) @ Tensor.ones(3)
  with raises(TypeError, "matmul", "bool", "(2, 3)", "(3,)"): Tensor.ones(2, 3).bool() @ Tensor.ones(3).bool()


def test_reshape_invalid():
  with raises(ValueError, "reshape", "(4, 4)", "9"): Tensor.ones(3, 3).reshape(4, 4)
  with raises(ValueError, "reshape", "-1"): Tensor.ones(3, 3).reshape(-1, -1)


def test_cat_and_stack_mismatch():
  with raises(ValueError, "cat", "(2, 3)", "(2, 4)"): Tensor.ones(2, 3).cat(Tensor.ones(2, 4), dim=0)
  with raises(ValueError, "stack"): Tensor.stack(Tensor.ones(2), Tensor.ones(3))


def test_bad_axes():
  with raises(IndexError, "sum", "dimension 2", "(2, 3)"): Tensor.ones(2, 3).sum(2)
  with raises(IndexError, "permute"): Tensor.ones(2, 3).permute(0, 5)
  with raises(ValueError, "permute"): Tensor.ones(2, 3).permute(0, 0)
  with raises(TypeError, "axis"): Tensor.ones(2, 3).sum("0")


def test_bad_dtypes():
  with raises(TypeError, "dtype"): Tensor([1, 2], dtype="complex64")
  with raises(TypeError, "uint32"): Tensor(np.array([1, 2], dtype=np.uint32))
  with raises(TypeError, "str"): Tensor(["a", "b"])
  with raises(TypeError, "bitwise_and", "float32"): Tensor([1.0]) & Tensor([1.0])
  with raises(TypeError, "one_hot", "float32"): Tensor([1.0]).one_hot(3)


def test_invalid_indices():
  t = Tensor.ones(3, 4)
  with raises(IndexError, "index 3", "size 3"): t[3]
  with raises(IndexError, "too many indices", "(3, 4)"): t[0, 0, 0]
  with raises(IndexError, "7", "size 3"): t[Tensor([0, 7])]
  with raises(IndexError, "gather", "size 4"): t.gather(1, Tensor([[0, 9]]))
  with raises(TypeError, "unsupported index"): t["x"]


def test_loss_and_conv_inputs():
  with raises(IndexError, "nll_loss", "10 classes"): Tensor.ones(2, 10).nll_loss(Tensor([1, 12]))
  with raises(TypeError, "nll_loss", "float32"): Tensor.ones(2, 10).nll_loss(Tensor([1.0, 2.0]))
  with raises(ValueError, "conv2d", "(1, 3, 8, 8)", "(4, 2, 3, 3)"): Tensor.ones(1, 3, 8, 8).conv2d(Tensor.ones(4, 2, 3, 3))


def test_creation_errors():
  with raises(ValueError, "full", "-1"): Tensor.full((2, -1), 0.0)
  with raises(ValueError, "inconsistent"): Tensor([[1, 2], [3]])
  with raises(ValueError, "item", "(2,)"): Tensor([1, 2]).item()


def test_backward_errors():
  # a non-scalar output without a gradient is seeded with ones (test_seed_examples); a gradient of another shape raises
  with raises(ValueError, "gradient shape", "(3,)", "(2,)"): Tensor([1.0, 2.0], requires_grad=True).mul(2).backward(Tensor.ones(3))
  x = Tensor([1.0], requires_grad=False)
  with raises(RuntimeError, "does not require grad"): x.backward()


def test_errors_come_before_any_kernel_runs():
  from tinychad import GlobalCounters
  a = Tensor.ones(2, 3) * 2
  GlobalCounters.reset()
  with raises(ValueError, "mul"): a * Tensor.ones(3, 2)
  assert GlobalCounters.kernel_count == 0
  assert a.dtype == dtypes.float32


# ---- issue 23: silent wrong answers and bad sizes raise, naming the op ----
def test_stack_of_different_shapes_raises_in_every_call_form():
  a, b = Tensor.ones(2, 3), Tensor.ones(3, 2)
  with raises(ValueError, "stack", "(2, 3)", "(3, 2)"): Tensor.stack(a, b)
  with raises(ValueError, "stack", "(2, 3)", "(3, 2)"): a.stack(b)
  with raises(ValueError, "stack", "(2, 3)", "(3, 2)"): Tensor.stack([a, b], 1)
  with raises(ValueError, "cat", "(2, 3)", "(3, 2)"): a.cat(b, dim=1)
  with raises(ValueError, "stack", "non-empty"): Tensor.stack([])
  with raises(TypeError, "cat", "list"): Tensor.cat(a, [b])


def test_pool_kernel_larger_than_padded_input():
  x = Tensor.ones(1, 1, 2, 2)
  with raises(ValueError, "max_pool2d", "kernel (3, 3)", "(1, 1, 2, 2)"): x.max_pool2d(3)
  with raises(ValueError, "avg_pool2d", "kernel (3, 3)", "(1, 1, 2, 2)"): x.avg_pool2d(3)
  with raises(ValueError, "max_pool2d", "kernel (3, 3)", "(1, 1, 2, 2)"): x.max_pool2d(3, dilation=2, padding=1)
  assert x.max_pool2d(3, padding=1).shape == (1, 1, 1, 1)  # the padded input holds one window


def test_zero_and_negative_sizes_strides_groups_dilations():
  x, w = Tensor.ones(1, 2, 4, 4), Tensor.ones(2, 2, 2, 2)
  with raises(ValueError, "chunk", "0", "(4, 4)"): Tensor.ones(4, 4).chunk(0)
  with raises(ValueError, "chunk", "-1"): Tensor.ones(4).chunk(-1)
  with raises(ValueError, "conv2d", "stride", "0"): x.conv2d(w, stride=0)
  with raises(ValueError, "conv2d", "stride", "-1"): x.conv2d(w, stride=(1, -1))
  with raises(ValueError, "conv2d", "dilation", "0"): x.conv2d(w, dilation=0)
  with raises(ValueError, "conv2d", "groups", "0"): x.conv2d(w, groups=0)
  with raises(ValueError, "conv2d", "groups", "-2"): x.conv2d(w, groups=-2)
  with raises(ValueError, "conv2d", "padding", "-1"): x.conv2d(w, padding=-1)
  with raises(ValueError, "conv1d", "stride", "0"): Tensor.ones(1, 2, 5).conv1d(Tensor.ones(2, 2, 3), stride=0)
  with raises(ValueError, "conv_transpose2d", "stride", "0"): x.conv_transpose2d(w, stride=0)
  with raises(ValueError, "conv_transpose2d", "groups", "0"): x.conv_transpose2d(w, groups=0)
  with raises(ValueError, "max_pool2d", "stride", "0"): x.max_pool2d(2, stride=0)
  with raises(ValueError, "max_pool2d", "kernel_size", "0"): x.max_pool2d(0)
  with raises(ValueError, "max_pool2d", "dilation", "0"): x.max_pool2d(2, dilation=0)
  with raises(ValueError, "avg_pool2d", "stride", "0"): x.avg_pool2d(2, stride=0)
  with raises(ValueError, "avg_pool2d", "kernel_size", "-2"): x.avg_pool2d(-2)
  with raises(ValueError, "split", "0"): Tensor.ones(4).split(0)


def test_max_of_empty_raises():
  with raises(ValueError, "max", "empty"): Tensor.ones(0).max()
  with raises(ValueError, "max", "size 0", "(2, 0)"): Tensor.ones(2, 0).max(1)
  with raises(ValueError, "min", "empty"): Tensor.ones(0, 3).min()   # the message names the op called
  assert Tensor.ones(2, 0).max(0).shape == (0,)  # reducing a non-empty dim of an empty tensor is fine, as in PyTorch


def test_resize_and_shuffle_errors():
  from tinychad.nn import functional as F
  x = Tensor.ones(1, 4, 3, 3)
  with raises(ValueError, "pixel_shuffle", "(1, 4, 3, 3)", "9"): F.pixel_shuffle(x, 3)
  with raises(ValueError, "pixel_shuffle", "upscale_factor", "0"): F.pixel_shuffle(x, 0)
  with raises(ValueError, "interpolate", "exactly one"): F.interpolate(x)
  with raises(ValueError, "interpolate", "size", "0"): F.interpolate(x, size=(0, 2))
  with raises(ValueError, "interpolate", "scale_factor"): F.interpolate(x, scale_factor=-1.0)
  with raises(ValueError, "interpolate", "mode", "cubic"): F.interpolate(x, size=4, mode="cubic")
  with raises(ValueError, "interpolate", "align_corners"): F.interpolate(x, size=4, mode="area", align_corners=True)
  with raises(ValueError, "adaptive_avg_pool2d", "output_size"): F.adaptive_avg_pool2d(x, 0)


def test_negative_sizes_and_layer_sizes():
  from tinychad import nn
  with raises(ValueError, "repeat", "-1"): Tensor.ones(2).repeat(-1)
  with raises(ValueError, "expand", "(-2,)"): Tensor.ones(1).expand(-2)
  with raises(ValueError, "uniform", "-1"): Tensor.uniform(-1, 3)
  with raises(ValueError, "normal", "-3"): Tensor.normal(2, -3)
  with raises(ValueError, "randint", "-1"): Tensor.randint(0, 5, size=(-1,))
  with raises(ValueError, "eye", "-1"): Tensor.eye(-1)
  with raises(ValueError, "linspace", "-1"): Tensor.linspace(0, 1, -1)
  with raises(ValueError, "Linear", "in_features", "-1"): nn.Linear(-1, 3)
  with raises(ValueError, "Conv2d", "in_channels", "0"): nn.Conv2d(0, 3, 3)
  with raises(ValueError, "Conv2d", "kernel_size", "0"): nn.Conv2d(2, 3, 0)
  with raises(ValueError, "Conv1d", "groups", "0"): nn.Conv1d(2, 2, 3, groups=0)
  with raises(ValueError, "GroupNorm", "num_groups", "0"): nn.GroupNorm(0, 4)
  with raises(ValueError, "MultiheadAttention", "num_heads", "0"): nn.MultiheadAttention(4, 0)


def test_pool_padding_over_half_the_kernel():
  x = Tensor.ones(1, 1, 4, 4)
  # a window wholly in the padding would give -inf (max) or 0 (avg): PyTorch refuses, so do we
  with raises(ValueError, "max_pool2d", "padding", "half"): x.max_pool2d(2, padding=3)
  with raises(ValueError, "avg_pool2d", "padding", "half"): x.avg_pool2d(2, padding=2)
  assert x.max_pool2d(3, stride=1, padding=1).shape == (1, 1, 4, 4)


def test_empty_reductions_name_their_op():
  with raises(ValueError, "min", "empty", "(0,)"): Tensor.ones(0).min()
  with raises(ValueError, "argmax", "size 0", "(0, 3)"): Tensor.ones(0, 3).argmax(0)
  with raises(ValueError, "argmin", "empty"): Tensor.ones(0).argmin()
  with raises(ValueError, "argmax", "size 0"): Tensor.ones(0, 3).max(dim=0)
  assert Tensor.ones(0).prod().item() == 1 and Tensor.ones(0).sum().item() == 0   # reductions with an identity are fine


def test_one_hot_and_layer_norm_bad_input():
  from tinychad import nn
  from tinychad.nn import functional as F
  with raises(ValueError, "one_hot", "-1", "[0, 3)"): Tensor([-1, 2]).one_hot(3)
  with raises(ValueError, "one_hot", "5", "[0, 3)"): Tensor([5, 2]).one_hot(3)
  with raises(ValueError, "layer_norm", "(4,)", "(2, 3)"): F.layer_norm(Tensor.ones(2, 3), (4,))
  with raises(ValueError, "layer_norm", "(2, 2, 3)"): F.layer_norm(Tensor.ones(2, 3), (2, 2, 3))
  with raises(ValueError, "layer_norm", "(4,)", "(2, 3)"): nn.LayerNorm(4)(Tensor.ones(2, 3))


def test_new_ops_bad_input():
  from tinychad.nn import functional as F
  x = Tensor.ones(1, 1, 4, 4)
  with raises(ValueError, "unfold", "step 0"): Tensor.ones(4).unfold(0, 2, 0)
  with raises(ValueError, "unfold", "size 5", "(4,)"): Tensor.ones(4).unfold(0, 5, 1)
  with raises(ValueError, "unfold", "stride", "0"): F.unfold(x, 2, stride=0)
  with raises(ValueError, "unfold", "kernel (5, 5)"): F.unfold(x, 5)
  with raises(ValueError, "unfold", "(4, 4)"): F.unfold(Tensor.ones(4, 4), 2)
  with raises(ValueError, "max_pool1d", "stride", "0"): Tensor.ones(1, 4).max_pool1d(2, stride=0)
  with raises(ValueError, "max_pool2d", "kernel (5, 5)"): x.max_pool2d(5, ceil_mode=True)
  with raises(ValueError, "roll", "2 shifts", "1 dims"): Tensor.ones(3).roll((1, 2), (0,))
  with raises(IndexError, "roll", "dimension 1"): Tensor.ones(3).roll(1, 1)
  with raises(ValueError, "repeat_interleave", "[1, 2]", "(3,)"): Tensor.ones(3).repeat_interleave([1, 2])
  with raises(ValueError, "repeat_interleave", "-1"): Tensor.ones(2).repeat_interleave([1, -1])
  with raises(TypeError, "repeat_interleave", "float"): Tensor.ones(2).repeat_interleave(Tensor([1.0, 2.0]))
  with raises(ValueError, "outer", "(2, 2)"): Tensor.ones(2, 2).outer(Tensor.ones(2))
  with raises(ValueError, "diag", "(2, 2, 2)"): Tensor.ones(2, 2, 2).diag()
  with raises(ValueError, "diagonal", "both 0"): Tensor.ones(2, 2).diagonal(0, 0, 0)
  with raises(ValueError, "trace", "(3,)"): Tensor.ones(3).trace()
  with raises(ValueError, "meshgrid", "indexing"): Tensor.meshgrid(Tensor.ones(2), indexing="yx")
  with raises(ValueError, "atan2", "(2,)", "(3,)"): Tensor.ones(2).atan2(Tensor.ones(3))
  with raises(IndexError, "narrow", "length 3"): Tensor.ones(4).narrow(0, 2, 3)
  with raises(ValueError, "mm", "(2, 3, 4)"): Tensor.ones(2, 3, 4).mm(Tensor.ones(4, 2))
  with raises(ValueError, "norm", "-1"): Tensor.ones(3).norm(-1)
  with raises(TypeError, "lshift", "float32"): Tensor.ones(3) << 1
  with raises(ValueError, "glu", "even"): F.glu(Tensor.ones(2, 3))
  with raises(ValueError, "sparse_categorical_crossentropy", "(3,)", "(2, 4)"):
    Tensor.ones(2, 4).sparse_categorical_crossentropy(Tensor([0, 1, 2]))
  with raises(IndexError, "nll_loss", "target 7"): Tensor.ones(2, 4).sparse_categorical_crossentropy(Tensor([0, 7]))
  with raises(IndexError, "cumprod", "dimension 2"): Tensor.ones(3).cumprod(2)
  with raises(IndexError, "cummax", "dimension 1"): Tensor.ones(3).cummax(1)


def test_embedding_bad_indices_raise_as_in_pytorch():
  """An embedding index outside [0, num_embeddings) raises IndexError, a negative one too (PyTorch's rule; tensor
  indexing would wrap it); float indices and a weight that isn't 2-d raise naming the op and the shape."""
  torch = pytest.importorskip("torch")
  from tinychad import nn
  from tinychad.nn import functional as F
  layer, weight = nn.Embedding(10, 4), Tensor.ones(10, 4)
  for bad in (-1, 10):
    with pytest.raises(IndexError): torch.nn.Embedding(10, 4)(torch.tensor([0, bad]))
    with raises(IndexError, "embedding", str(bad), "10 embeddings", "(10, 4)"): layer(Tensor([0, bad]))
    with raises(IndexError, "embedding", str(bad)): F.embedding(Tensor([[bad]]), weight)
  # both of the bounds check's paths: a short index (Python's min and max) and a long one (numpy's)
  long = [i % 10 for i in range(200)]
  np.testing.assert_array_equal(layer(Tensor(long)).numpy(), layer.weight.numpy()[long])
  for bad in (-1, 10):
    with raises(IndexError, "embedding", str(bad)): layer(Tensor(long[:100] + [bad] + long[100:]))
  # tensor indexing wraps negatives down to -size, short or long
  t = Tensor.arange(5)
  assert t[Tensor([-5, 4])].tolist() == [0, 4] and t[Tensor([-5, 4] * 50)].tolist() == [0, 4] * 50
  for bad in ([-6], [5], [0] * 99 + [-6], [0] * 99 + [5]):
    with raises(IndexError, str(bad[-1]), "size 5"): t[Tensor(bad)]
  with raises(TypeError, "embedding", "float32"): F.embedding(Tensor([0.0]), weight)
  with raises(TypeError, "embedding", "bool"): F.embedding(Tensor([True]), weight)
  with raises(ValueError, "embedding", "(10,)"): F.embedding(Tensor([0]), Tensor.ones(10))
