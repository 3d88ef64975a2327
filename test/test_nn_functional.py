"""nn functions against PyTorch (values, dtypes, gradients): convolutions, pooling, losses, attention,
normalisation and dropout.

in: seeded random inputs (see torch_reference.compare)  ->  out: pass/fail, once per device with the
    kernel optimizations on, and once more per compiled device with them off (NOOPT=1).
"""
import math
import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from tinychad import GlobalCounters, Tensor, dtypes
from tinychad.helpers import getenv
from torch_reference import compare, random_inputs
from tinychad.function import _input_gradient_by_taps as _tapwise

pytestmark = pytest.mark.usefixtures("each_device")

CONV_ATOL = 1e-4


# ---- convolutions ----
CONV2D = [
  dict(x=(2, 3, 6, 5), w=(4, 3, 3, 3)),
  dict(x=(1, 2, 7, 7), w=(3, 2, 3, 2), stride=2),
  dict(x=(1, 2, 7, 6), w=(3, 2, 3, 3), stride=(2, 1), padding=(1, 2)),
  dict(x=(2, 2, 5, 5), w=(2, 2, 3, 3), padding="same"),
  dict(x=(1, 2, 6, 6), w=(2, 2, 2, 2), padding="same"),
  dict(x=(1, 2, 8, 8), w=(2, 2, 3, 3), dilation=2, padding="same"),
  dict(x=(1, 2, 9, 8), w=(3, 2, 3, 2), dilation=(2, 3), stride=2, padding=1),
  dict(x=(2, 4, 5, 5), w=(6, 2, 3, 3), groups=2, padding=1),
  dict(x=(1, 4, 5, 5), w=(4, 1, 3, 3), groups=4, padding="valid"),
  dict(x=(1, 3, 4, 4), w=(2, 3, 1, 1)),
  dict(x=(1, 1, 4, 4), w=(1, 1, 4, 4)),
  dict(x=(3, 6, 6), w=(2, 3, 3, 3)),
  dict(x=(1, 2, 5, 5), w=(2, 2, 2, 2), padding=2),                        # padding beyond kernel-1: the input gradient crops
  dict(x=(2, 2, 8, 9), w=(3, 2, 3, 3), stride=(2, 3), padding=(1, 0)),    # the last rows/columns reach no window
]


def _conv_kwargs(case: dict) -> dict: return {k: v for k, v in case.items() if k not in ("x", "w")}


@pytest.mark.parametrize("case", CONV2D, ids=[str(i) for i in range(len(CONV2D))])
@pytest.mark.parametrize("bias", [False, True])
def test_conv2d(case, bias):
  kwargs = _conv_kwargs(case)
  shapes = [case["x"], case["w"]] + ([(case["w"][0],)] if bias else [])
  compare(shapes, lambda x, w, b=None: TF.conv2d(x, w, b, **kwargs), lambda x, w, b=None: x.conv2d(w, b, **kwargs), atol=CONV_ATOL)


def test_conv2d_channels_last_input():
  """A permuted (non-contiguous) input and weight."""
  compare([(2, 5, 5, 3), (3, 3, 3, 4)], lambda x, w: TF.conv2d(x.permute(0, 3, 1, 2), w.permute(3, 2, 0, 1), padding=1),
          lambda x, w: x.permute(0, 3, 1, 2).conv2d(w.permute(3, 2, 0, 1), padding=1), atol=CONV_ATOL)


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("cin", [32, 2])     # 32: the channels-last gradient path, 2: the lanes-along-width one
def test_conv2d_weight_gradient_summed_in_batch_parts(monkeypatch, groups, cin):
  """A large output gradient is summed over the batch in parts (_batch_parts); shrink the budget so
  these small shapes take that path: 2 samples of 4x4 positions x 8 channels per part."""
  import tinychad.function as F
  monkeypatch.setattr(F, "WEIGHT_GRAD_PART_BYTES", 2 * 4 * 4 * 8 * 4)
  assert F._batch_parts(6, 4 * 4 * 8 * 4) == 3
  compare([(6, cin, 6, 6), (8, cin // groups, 3, 3)], lambda x, w: TF.conv2d(x, w, groups=groups),
          lambda x, w: x.conv2d(w, groups=groups), atol=CONV_ATOL)


# depthwise and grouped convolutions, each run in both layouts of the window sum (_window_product):
# NCHW with lanes along the output width (fewer than CHANNELS_LAST_MIN_OUT_GROUP output channels per
# group) and channels-last with lanes along the output channels
GROUPED = [
  dict(x=(2, 8, 9, 10), w=(8, 1, 3, 3), groups=8, padding=1),                          # depthwise
  dict(x=(2, 4, 9, 10), w=(8, 1, 3, 3), groups=4, padding=1),                          # channel multiplier 2
  dict(x=(2, 6, 11, 9), w=(6, 1, 3, 3), groups=6, stride=2, padding=1),
  dict(x=(1, 4, 10, 12), w=(4, 1, 3, 3), groups=4, stride=(2, 1), dilation=(1, 2), padding=2),
  dict(x=(2, 4, 8, 7), w=(12, 1, 3, 2), groups=4, padding=((2, 0), (1, 3))),          # uneven padding
  dict(x=(2, 8, 7, 7), w=(4, 4, 3, 3), groups=2, padding=1),                           # grouped
  dict(x=(1, 6, 9, 9), w=(9, 2, 3, 3), groups=3, stride=2, dilation=2, padding=2),
  dict(x=(2, 4, 11), w=(8, 1, 5), groups=4, stride=2, padding=2),                      # 1-D depthwise
]


@pytest.mark.parametrize("case", GROUPED, ids=[str(i) for i in range(len(GROUPED))])
@pytest.mark.parametrize("channels_last", [False, True])
def test_grouped_conv_in_both_layouts(monkeypatch, case, channels_last):
  import tinychad.function as F
  monkeypatch.setattr(F, "CHANNELS_LAST_MIN_OUT_GROUP", 1 if channels_last else 1 << 30)
  kwargs = _conv_kwargs(case)
  conv_torch, conv = (TF.conv2d, Tensor.conv2d) if len(case["x"]) == 4 else (TF.conv1d, Tensor.conv1d)
  if isinstance(kwargs.get("padding"), tuple) and isinstance(kwargs["padding"][0], tuple):
    (top, bottom), (left, right) = kwargs["padding"]      # PyTorch pads symmetrically only
    unpadded = {k: v for k, v in kwargs.items() if k != "padding"}
    torch_fn = lambda x, w, b: conv_torch(TF.pad(x, (left, right, top, bottom)), w, b, **unpadded)
  else:
    torch_fn = lambda x, w, b: conv_torch(x, w, b, **kwargs)
  out = compare([case["x"], case["w"], (case["w"][0],)], torch_fn, lambda x, w, b: conv(x, w, b, **kwargs), atol=CONV_ATOL)[0]
  # the layout asked for is the one taken: a channels-last sum is seen through a permuted view. NOOPT=1
  # keeps no layout (lazy.py): the bias is added in NCHW order, into a contiguous buffer
  assert (out.lazydata.st.permuted_order is not None) == (channels_last and not getenv("NOOPT", 0))


@pytest.mark.parametrize("channels_last", [False, True])
def test_depthwise_conv_gradient_of_a_sum(monkeypatch, channels_last):
  """y.sum().backward(): the output gradient is a view of one constant, never in memory."""
  import tinychad.function as F
  monkeypatch.setattr(F, "CHANNELS_LAST_MIN_OUT_GROUP", 1 if channels_last else 1 << 30)
  for kwargs in (dict(padding=1), dict(stride=2, padding=1), dict(padding=(0, 2), dilation=2)):
    compare([(2, 4, 9, 8), (8, 1, 3, 3)], lambda x, w: TF.conv2d(x, w, groups=4, **kwargs).sum(),
            lambda x, w: x.conv2d(w, groups=4, **kwargs).sum(), atol=CONV_ATOL)


# input gradients computed tap by tap (function.py _input_gradient_by_taps), forced on for
# geometries that would not waste enough to take that path on their own
TAPWISE = [
  dict(x=(2, 3, 12, 12), w=(4, 3, 5, 5)),                                 # taken by default: 144 vs 64 positions
  dict(x=(2, 3, 6, 6), w=(4, 3, 5, 5), padding=1),
  dict(x=(2, 3, 7, 9), w=(4, 3, 5, 3), padding=(2, 1), dilation=(1, 2)),
  dict(x=(2, 3, 6, 6), w=(4, 3, 4, 4), padding=((3, 0), (1, 2))),
  dict(x=(2, 3, 2, 4), w=(4, 3, 3, 3), padding=((0, 5), (1, 1))),       # taps that reach only padding
  dict(x=(2, 3, 5, 5), w=(2, 3, 5, 5), padding=4),
  dict(x=(3, 4, 10), w=(6, 4, 7)),                                        # 1-D
  dict(x=(2, 3, 8, 8), w=(4, 3, 3, 3), stride=2, padding=1),             # taken by default: 64 vs 16
  dict(x=(2, 3, 9, 11), w=(4, 3, 3, 2), stride=(2, 3), padding=(1, 0), dilation=(2, 1)),
  dict(x=(2, 2, 8, 9), w=(3, 2, 3, 3), stride=(2, 3), padding=(1, 0)),    # rows no window reaches
  dict(x=(2, 3, 1, 1), w=(2, 3, 1, 1), stride=2, padding=1),              # every window in the padding
  dict(x=(2, 4, 13), w=(3, 4, 4), stride=3, padding=2),                   # 1-D
  dict(x=(2, 4, 7, 7), w=(4, 1, 3, 3), groups=4, padding=1),             # depthwise
  dict(x=(2, 6, 9, 8), w=(3, 2, 3, 3), groups=3, stride=2, padding=(1, 0)),  # depthwise, 2 inputs per group
  dict(x=(2, 4, 11, 10), w=(4, 1, 3, 3), groups=4, stride=2, padding=1),  # depthwise, taken by default
  dict(x=(2, 4, 11), w=(4, 1, 3), groups=4, stride=2, dilation=2, padding=1),  # 1-D depthwise
]


@pytest.mark.parametrize("case", TAPWISE, ids=[str(i) for i in range(len(TAPWISE))])
def test_conv_input_gradient_tap_by_tap(monkeypatch, case):
  import tinychad.function as F
  monkeypatch.setattr(F, "TAPWISE_MIN_WASTE", 0)
  calls = []
  monkeypatch.setattr(F, "_input_gradient_by_taps", lambda *args: calls.append(1) or _tapwise(*args))
  kwargs = _conv_kwargs(case)
  conv_torch, conv = (TF.conv2d, Tensor.conv2d) if len(case["x"]) == 4 else (TF.conv1d, Tensor.conv1d)
  if isinstance(kwargs.get("padding"), tuple) and isinstance(kwargs["padding"][0], tuple):
    # PyTorch takes only symmetric padding: the input is padded first
    (top, bottom), (left, right) = kwargs["padding"]
    unpadded = {k: v for k, v in kwargs.items() if k != "padding"}
    torch_fn = lambda x, w: conv_torch(TF.pad(x, (left, right, top, bottom)), w, **unpadded)
  else:
    torch_fn = lambda x, w: conv_torch(x, w, **kwargs)
  compare([case["x"], case["w"]], torch_fn, lambda x, w: conv(x, w, **kwargs), atol=CONV_ATOL)
  assert calls


CONV1D = [
  dict(x=(2, 3, 9), w=(4, 3, 3)),
  dict(x=(1, 2, 10), w=(2, 2, 4), stride=3, padding=2),
  dict(x=(1, 2, 10), w=(2, 2, 3), dilation=3, padding="same"),
  dict(x=(2, 4, 7), w=(4, 2, 2), groups=2),
  dict(x=(3, 8), w=(2, 3, 5), padding=1),
]


@pytest.mark.parametrize("case", CONV1D, ids=[str(i) for i in range(len(CONV1D))])
def test_conv1d(case):
  kwargs = _conv_kwargs(case)
  compare([case["x"], case["w"], (case["w"][0],)], lambda x, w, b: TF.conv1d(x, w, b, **kwargs),
          lambda x, w, b: x.conv1d(w, b, **kwargs), atol=CONV_ATOL)


CONV_TRANSPOSE2D = [
  dict(x=(1, 2, 4, 4), w=(2, 3, 3, 3)),
  dict(x=(2, 2, 3, 4), w=(2, 1, 3, 3), stride=2),
  dict(x=(1, 2, 3, 3), w=(2, 2, 3, 2), stride=(2, 3), padding=1, output_padding=(1, 2)),
  dict(x=(1, 4, 3, 3), w=(4, 1, 3, 3), groups=2, stride=2, padding=1),
  dict(x=(1, 2, 4, 3), w=(2, 2, 2, 3), dilation=2),
  dict(x=(1, 2, 4, 4), w=(2, 3, 4, 4), stride=2, padding=1, dilation=1),
  dict(x=(2, 3, 3), w=(2, 2, 2, 2), stride=2),
]


def test_strided_conv_transpose_goes_tap_by_tap():
  """A stride-2 transposed convolution skips the zeros between the strides: its multiply-adds are the
  input's positions times the taps, not the output's (a quarter of them in 2-D)."""
  x, w = Tensor.rand(2, 8, 6, 6).realize(), Tensor.rand(8, 4, 3, 3).realize()
  GlobalCounters.reset()
  x.conv_transpose2d(w, stride=2).realize()
  needed = 2 * 6 * 6 * 8 * 4 * 3 * 3
  # a multiply and an add per needed multiply-add, plus the sum of the taps' views (54k here); the
  # spread input's convolution does 13x13 positions instead of 6x6 (195k)
  assert GlobalCounters.global_ops < 3 * needed


@pytest.mark.parametrize("case", CONV_TRANSPOSE2D, ids=[str(i) for i in range(len(CONV_TRANSPOSE2D))])
def test_conv_transpose2d(case):
  kwargs = _conv_kwargs(case)
  bias = (case["w"][1] * kwargs.get("groups", 1),)
  compare([case["x"], case["w"], bias], lambda x, w, b: TF.conv_transpose2d(x, w, b, **kwargs),
          lambda x, w, b: x.conv_transpose2d(w, b, **kwargs), atol=CONV_ATOL)


# ---- pooling ----
POOLS = [
  dict(kernel_size=2), dict(kernel_size=3, stride=1), dict(kernel_size=(3, 2), stride=(2, 1)), dict(kernel_size=3, stride=2, padding=1),
  dict(kernel_size=2, stride=3), dict(kernel_size=(2, 3), padding=(1, 0)),
]


@pytest.mark.parametrize("kwargs", POOLS, ids=[str(i) for i in range(len(POOLS))])
def test_max_pool2d(kwargs):
  compare([(2, 2, 7, 6)], lambda x: TF.max_pool2d(x, **kwargs), lambda x: x.max_pool2d(**kwargs))


def test_max_pool2d_dilation_and_3d_input():
  compare([(2, 9, 8)], lambda x: TF.max_pool2d(x, 3, stride=2, dilation=2), lambda x: x.max_pool2d(3, stride=2, dilation=2))


def test_max_pool2d_int_input():
  compare([np.arange(32).reshape(1, 2, 4, 4) % 7], lambda x: TF.max_pool2d(x.float(), 2).long(),
          lambda x: x.max_pool2d(2))


@pytest.mark.parametrize("kwargs", POOLS + [dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)],
                         ids=[str(i) for i in range(len(POOLS) + 1)])
def test_avg_pool2d(kwargs):
  compare([(2, 2, 7, 6)], lambda x: TF.avg_pool2d(x, **kwargs), lambda x: x.avg_pool2d(**kwargs))


def test_avg_pool2d_transposed_input():
  compare([(1, 2, 6, 4)], lambda x: TF.avg_pool2d(x.transpose(2, 3), 2), lambda x: x.transpose(2, 3).avg_pool2d(2))


# ---- losses ----
REDUCTIONS = ["mean", "sum", "none"]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_cross_entropy_class_indices(reduction, label_smoothing):
  target = np.array([1, 0, 3, 3, 2])
  compare([(5, 4), target], lambda x, t: TF.cross_entropy(x, t, reduction=reduction, label_smoothing=label_smoothing),
          lambda x, t: x.cross_entropy(t, reduction=reduction, label_smoothing=label_smoothing))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_cross_entropy_ignore_index(reduction, label_smoothing):
  target = np.array([1, -100, 3, 2, -100])
  compare([(5, 4), target], lambda x, t: TF.cross_entropy(x, t, reduction=reduction, label_smoothing=label_smoothing),
          lambda x, t: x.cross_entropy(t, reduction=reduction, label_smoothing=label_smoothing))
  target = np.array([1, 2, 3, 2, 0])
  compare([(5, 4), target], lambda x, t: TF.cross_entropy(x, t, reduction=reduction, ignore_index=2, label_smoothing=label_smoothing),
          lambda x, t: x.cross_entropy(t, reduction=reduction, ignore_index=2, label_smoothing=label_smoothing))
  # an ignore_index beyond int32 (the one-hot then compares in int64: in int32 it would be class 1)
  target, ignore = np.array([1, 2**32 + 1, 3, 2, 0]), 2**32 + 1
  compare([(5, 4), target], lambda x, t: TF.cross_entropy(x, t, reduction=reduction, ignore_index=ignore, label_smoothing=label_smoothing),
          lambda x, t: x.cross_entropy(t, reduction=reduction, ignore_index=ignore, label_smoothing=label_smoothing))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.3])
def test_cross_entropy_probabilities(reduction, label_smoothing):
  probabilities = np.random.default_rng(1).dirichlet(np.ones(4), size=3).astype(np.float32)
  compare([(3, 4), probabilities], lambda x, p: TF.cross_entropy(x, p, reduction=reduction, label_smoothing=label_smoothing),
          lambda x, p: x.cross_entropy(p, reduction=reduction, label_smoothing=label_smoothing))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_spatial_and_unbatched(reduction):
  target = np.array([[[0, 2], [1, 1], [2, 0]], [[1, 1], [0, -100], [2, 2]]])
  compare([(2, 3, 3, 2), target], lambda x, t: TF.cross_entropy(x, t, reduction=reduction),
          lambda x, t: x.cross_entropy(t, reduction=reduction))
  compare([(4,), np.array(2)], lambda x, t: TF.cross_entropy(x, t, reduction=reduction, label_smoothing=0.1),
          lambda x, t: x.cross_entropy(t, reduction=reduction, label_smoothing=0.1))


def test_cross_entropy_transposed_logits():
  compare([(4, 3), np.array([0, 3, 1])], lambda x, t: TF.cross_entropy(x.T, t), lambda x, t: x.T.cross_entropy(t))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss(reduction):
  target = np.array([2, 0, -100, 1])
  compare([(4, 3), target], lambda x, t: TF.nll_loss(x, t, reduction=reduction), lambda x, t: x.nll_loss(t, reduction=reduction))
  weight = np.array([0.2, 1.0, 3.0], np.float32)
  compare([(4, 3), target, weight], lambda x, t, w: TF.nll_loss(x, t, w, reduction=reduction),
          lambda x, t, w: x.nll_loss(t, reduction=reduction, weight=w), grad=(True, False, False))


def test_nll_loss_spatial_and_unbatched():
  compare([(2, 3, 4), np.array([[0, 1, 2, 2], [1, 1, 0, -100]])], lambda x, t: TF.nll_loss(x, t), lambda x, t: x.nll_loss(t))
  for reduction in REDUCTIONS:
    compare([(3,), np.array(1)], lambda x, t: TF.nll_loss(x, t, reduction=reduction), lambda x, t: x.nll_loss(t, reduction=reduction))


def test_nll_loss_bad_target_raises():
  with pytest.raises(IndexError):
    Tensor.zeros(2, 3).nll_loss(Tensor([0, 3]))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy(reduction):
  p = random_inputs((3, 4), low=0.05, high=0.95)[0]
  target = random_inputs((3, 4), low=0.0, high=1.0, seed=1)[0]
  compare([p, target], lambda x, t: TF.binary_cross_entropy(x, t, reduction=reduction),
          lambda x, t: x.binary_cross_entropy(t, reduction=reduction))


def test_binary_cross_entropy_saturated_probabilities():
  p = np.array([0.0, 1.0, 0.5, 1.0], np.float32)
  target = np.array([0.0, 1.0, 1.0, 0.0], np.float32)
  compare([p, target], lambda x, t: TF.binary_cross_entropy(x, t, reduction="none"),
          lambda x, t: x.binary_cross_entropy(t, reduction="none"), grad=False)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy_with_logits(reduction):
  logits = random_inputs((3, 4), low=-30, high=30)[0]
  target = random_inputs((3, 4), low=0.0, high=1.0, seed=1)[0]
  compare([logits, target], lambda x, t: TF.binary_cross_entropy_with_logits(x, t, reduction=reduction),
          lambda x, t: x.binary_cross_entropy_with_logits(t, reduction=reduction))
  pos_weight = np.array([0.5, 1.0, 2.0, 3.0], np.float32)
  compare([logits, target, pos_weight], lambda x, t, w: TF.binary_cross_entropy_with_logits(x, t, reduction=reduction, pos_weight=w),
          lambda x, t, w: x.binary_cross_entropy_with_logits(t, reduction=reduction, pos_weight=w), grad=(True, True, False))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_mse_loss(reduction):
  compare([(3, 4), (3, 4)], lambda x, t: TF.mse_loss(x, t, reduction=reduction), lambda x, t: x.mse_loss(t, reduction=reduction))
  compare([(4, 3), (3, 4)], lambda x, t: TF.mse_loss(x.T, t, reduction=reduction), lambda x, t: x.T.mse_loss(t, reduction=reduction))


def test_mse_loss_broadcasts_target():
  compare([(3, 4), (4,)], lambda x, t: TF.mse_loss(x, t.expand(3, 4)), lambda x, t: x.mse_loss(t))


# ---- attention ----
def _bool_mask(shape: tuple[int, ...]) -> np.ndarray:
  mask = np.random.default_rng(2).random(shape) < 0.7
  mask[..., 0] = True   # every query sees at least one key
  return mask


ATTENTION = [
  dict(q=(2, 3, 4), k=(2, 5, 4), v=(2, 5, 6)),
  dict(q=(1, 2, 4, 8), k=(1, 2, 4, 8), v=(1, 2, 4, 8), is_causal=True),
  dict(q=(2, 3, 4), k=(2, 3, 4), v=(2, 3, 2), scale=0.3),
  dict(q=(2, 3, 4), k=(2, 5, 4), v=(2, 5, 6), mask=_bool_mask((3, 5))),
  dict(q=(1, 2, 3, 4), k=(1, 2, 5, 4), v=(1, 2, 5, 6), mask=random_inputs((2, 1, 5), seed=3)[0]),
  dict(q=(3, 4), k=(5, 4), v=(5, 2)),
]


@pytest.mark.parametrize("case", ATTENTION, ids=[str(i) for i in range(len(ATTENTION))])
def test_scaled_dot_product_attention(case):
  kwargs = {k: v for k, v in case.items() if k in ("is_causal", "scale")}
  shapes = [case["q"], case["k"], case["v"]] + ([case["mask"]] if "mask" in case else [])
  compare(shapes, lambda q, k, v, m=None: TF.scaled_dot_product_attention(q, k, v, attn_mask=m, **kwargs),
          lambda q, k, v, m=None: q.scaled_dot_product_attention(k, v, attn_mask=m, **kwargs))


def test_scaled_dot_product_attention_fully_masked_query_gets_zeros():
  mask = np.array([[True, False, True], [False, False, False]])
  compare([(2, 4), (3, 4), (3, 4), mask], lambda q, k, v, m: TF.scaled_dot_product_attention(q, k, v, attn_mask=m),
          lambda q, k, v, m: q.scaled_dot_product_attention(k, v, attn_mask=m))


def test_scaled_dot_product_attention_transposed_heads():
  """(batch, seq, heads, dim) inputs transposed to (batch, heads, seq, dim), as attention layers do."""
  compare([(1, 4, 2, 3), (1, 4, 2, 3), (1, 4, 2, 3)],
          lambda q, k, v: TF.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True),
          lambda q, k, v: q.transpose(1, 2).scaled_dot_product_attention(k.transpose(1, 2), v.transpose(1, 2), is_causal=True))


def test_scaled_dot_product_attention_dropout_keeps_shape_and_scale():
  """Equal scores give every key weight 1/16; dropout keeps each with probability 0.75, scaled by 1/0.75."""
  q, v = Tensor.zeros(4, 16, 8), Tensor.ones(4, 16, 8)
  Tensor.training = True
  try:
    out = q.scaled_dot_product_attention(q, v, dropout_p=0.25).numpy()
  finally:
    Tensor.training = False
  assert out.shape == (4, 16, 8)
  kept_keys = out[..., 0] * 16 * 0.75
  np.testing.assert_allclose(kept_keys, np.round(kept_keys), atol=1e-4)
  assert abs(out.mean() - 1.0) < 0.1 and 0 < out.std() < 0.5


# ---- normalisation and dropout ----
@pytest.mark.parametrize("shape, axes", [((3, 5), -1), ((2, 3, 4), (-2, -1)), ((4, 1), -1)])
def test_layernorm(shape, axes):
  normalized = shape[-2:] if isinstance(axes, tuple) else shape[-1:]
  compare([shape], lambda x: TF.layer_norm(x, normalized), lambda x: x.layernorm(axes), atol=1e-4)


def test_layernorm_affine_on_transposed_input():
  compare([(3, 5), (3,), (3,)], lambda x, w, b: TF.layer_norm(x.T, (3,), w, b), lambda x, w, b: x.T.layernorm() * w + b, atol=1e-4)


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 4, 2)])
def test_batchnorm_with_given_statistics(shape):
  eps = 1e-5
  mean = random_inputs((3,), seed=5)[0]
  var = random_inputs((3,), low=0.5, high=2.0, seed=6)[0]
  invstd = (1 / np.sqrt(var + eps)).astype(np.float32)
  compare([shape, (3,), (3,)], lambda x, w, b: TF.batch_norm(x, torch.tensor(mean), torch.tensor(var), w, b, training=False, eps=eps),
          lambda x, w, b: x.batchnorm(w, b, Tensor(mean), Tensor(invstd)), atol=1e-4)


def test_batchnorm_without_affine():
  mean, var = random_inputs((2,), seed=5)[0], random_inputs((2,), low=0.5, high=2.0, seed=6)[0]
  compare([(3, 2, 4)], lambda x: TF.batch_norm(x, torch.tensor(mean), torch.tensor(var), training=False, eps=0.0),
          lambda x: x.batchnorm(None, None, Tensor(mean), Tensor((1 / np.sqrt(var)).astype(np.float32))), atol=1e-4)


def test_dropout_is_identity_when_not_training():
  x = Tensor(random_inputs((4, 5))[0])
  assert Tensor.training is False
  assert x.dropout(0.5) is x


@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
def test_dropout_in_training_mode(p):
  array = random_inputs((64, 64), low=1.0, high=2.0)[0]
  x = Tensor(array, requires_grad=True)
  Tensor.training = True
  try:
    out = x.dropout(p)
  finally:
    Tensor.training = False
  values = out.numpy()
  kept = values != 0
  assert out.shape == x.shape and out.dtype == dtypes.float32
  assert abs(kept.mean() - (1 - p)) < 0.03
  if p < 1: np.testing.assert_allclose(values[kept], array[kept] / (1 - p), rtol=1e-6)
  out.sum().backward()
  expected_grad = kept / (1 - p) if p < 1 else np.zeros_like(array)
  np.testing.assert_allclose(x.grad.numpy(), expected_grad, rtol=1e-6)


def test_dropout_rejects_bad_p():
  with pytest.raises(ValueError):
    Tensor.ones(3).dropout(1.5)


def test_conv2d_bad_channels_raise():
  with pytest.raises(ValueError):
    Tensor.ones(1, 3, 4, 4).conv2d(Tensor.ones(2, 2, 3, 3))


def test_losses_are_float32_scalars():
  logits, target = Tensor(random_inputs((4, 3))[0]), Tensor([0, 2, 1, 1])
  for loss in (logits.cross_entropy(target), logits.log_softmax().nll_loss(target), logits.mse_loss(logits * 0)):
    assert loss.shape == () and loss.dtype == dtypes.float32 and math.isfinite(loss.item())


def test_linear_and_layer_norm_are_one_recorded_op_each():
  """F.linear and F.layer_norm (so nn.Linear, nn.LayerNorm) record one autograd op each (function.Linear and
  function.LayerNorm: a decoding step records ~120 ops where it recorded ~620), with PyTorch's values and gradients."""
  from tinychad import nn
  from tinychad.nn import functional as F
  rng = np.random.default_rng(0)
  x, w, b, g = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 8), (5, 8), (5,), (2, 3, 5)))
  tx, tw, tb = (Tensor(a, requires_grad=True) for a in (x, w, b))
  norm = nn.LayerNorm(5)
  norm.weight.assign(Tensor(rng.standard_normal(5).astype(np.float32)))
  out = norm(F.linear(tx, tw, tb))
  assert type(out._ctx).__name__ == "LayerNorm" and out._ctx.parents[1:] == (norm.weight, norm.bias)
  assert type(out._ctx.parents[0]._ctx).__name__ == "Linear" and out._ctx.parents[0]._ctx.parents == (tx, tw, tb)
  (out * Tensor(g)).sum().backward()
  px, pw, pb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
  pn = torch.tensor(norm.weight.numpy(), requires_grad=True)
  expected = TF.layer_norm(TF.linear(px, pw, pb), (5,), pn, None)
  (expected * torch.tensor(g)).sum().backward()
  np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-5, atol=1e-5)
  for mine, theirs in ((tx, px), (tw, pw), (tb, pb), (norm.weight, pn)):
    np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(norm.bias.grad.numpy(), (expected.grad_fn is not None) * g.sum((0, 1)), rtol=1e-5, atol=1e-5)
  # a float16 input with float32 parameters promotes, as the ops it is made of do
  half = F.layer_norm(Tensor(x).half(), (8,), Tensor(np.ones(8, np.float32)))
  assert half.dtype == dtypes.float32
  np.testing.assert_allclose(half.numpy(), TF.layer_norm(torch.tensor(x), (8,)).numpy(), rtol=2e-3, atol=2e-3)
  with pytest.raises(ValueError, match=r"layer_norm: weight and bias must be of shape \(8,\)"):
    F.layer_norm(Tensor(x), (8,), Tensor(np.ones(7, np.float32)))
