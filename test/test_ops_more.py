"""The ops issue 23 added, against PyTorch, forward and backward, on every device (and NOOPT=1 on the compiled ones):
inverse trigonometry, logsigmoid/softsign, isnan/isinf/isfinite, roll, repeat_interleave, unfold, running extremes,
diagonals, pooling with ceil_mode/return_indices, tinygrad's loss names, the PyTorch conveniences; 0-d, empty and
non-contiguous inputs included. Same harness as test_ops.py (helper_test_op)."""
from __future__ import annotations
import math
import pathlib
import re
import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from tinychad import Tensor, dtypes
import tinychad.nn.functional as F
from test_ops import helper_test_op

pytestmark = pytest.mark.usefixtures("each_device")

UNARY = [
  ("atan", torch.atan, Tensor.atan, -6, 6),
  ("asin", torch.asin, Tensor.asin, -0.95, 0.95),
  ("acos", torch.acos, Tensor.acos, -0.95, 0.95),
  ("logsigmoid", TF.logsigmoid, Tensor.logsigmoid, -30, 30),
  ("softsign", TF.softsign, Tensor.softsign, -4, 4),
  ("log1p", torch.log1p, Tensor.log1p, -0.9, 3),
  ("expm1", torch.expm1, Tensor.expm1, -3, 3),
  ("frac", torch.frac, Tensor.frac, -3, 3),
  ("deg2rad", torch.deg2rad, Tensor.deg2rad, -200, 200),
  ("tanhshrink", TF.tanhshrink, F.tanhshrink, -3, 3),
]


@pytest.mark.parametrize("shape", [(3, 4), (), (0, 3)], ids=str)
@pytest.mark.parametrize("name, torch_fn, tinychad_fn, low, high", UNARY, ids=[c[0] for c in UNARY])
def test_unary(name, torch_fn, tinychad_fn, low, high, shape):
  helper_test_op([shape], torch_fn, tinychad_fn, atol=1e-6, rtol=2e-6, low=low, high=high)


@pytest.mark.parametrize("name, torch_fn, tinychad_fn, low, high", UNARY[:6], ids=[c[0] for c in UNARY[:6]])
def test_unary_noncontiguous(name, torch_fn, tinychad_fn, low, high):
  helper_test_op([(4, 3)], lambda x: torch_fn(x.T), lambda x: tinychad_fn(x.T), atol=1e-6, rtol=2e-6, low=low, high=high)


def test_small_and_special_values():
  x = np.array([0.0, -0.0, 1e-30, -1e-20, 1e-8, 3e-5, -0.7, 1.0, -1.0, 40, -40, math.inf, -math.inf, math.nan], np.float32)
  for torch_fn, fn in [(torch.log1p, Tensor.log1p), (torch.expm1, Tensor.expm1), (torch.atan, Tensor.atan),
                       (TF.logsigmoid, Tensor.logsigmoid), (torch.isnan, Tensor.isnan), (torch.isinf, Tensor.isinf),
                       (torch.isfinite, Tensor.isfinite), (torch.isposinf, Tensor.isposinf), (torch.isneginf, Tensor.isneginf),
                       (torch.nan_to_num, Tensor.nan_to_num)]:
    helper_test_op([x], torch_fn, fn, atol=0, rtol=2e-7, grad=False)
  helper_test_op([np.arange(-3, 3)], torch.isfinite, Tensor.isfinite, grad=False)


def test_erf_float32_is_within_one_ulp():
  # float32's three series (|x| up to 0.75, up to 1.5, beyond) on a grid dense enough to see a fit 1.1 ulp off
  # (one degree short), both sides of each bound, the clip at 4, tiny values down to denormals, huge ones
  bounds = np.float32([0.75, 1.125, 1.5, 2.5, 4.0])
  near = np.concatenate([bounds, np.nextafter(bounds, np.float32(0)), np.nextafter(bounds, np.float32(9))])
  x = np.concatenate([np.linspace(0, 4.5, 500001), np.geomspace(1e-45, 1e-3, 300), near, [7, 1e30, 3e38]]).astype(np.float32)
  got = Tensor(x).erf().numpy()
  assert got.dtype == np.float32
  # |got - erf(x)| in ulps of erf(x) rounded to float32 (math.erf, float64, is within 1 ulp of float64)
  exact = np.array([math.erf(float(v)) for v in x])
  ulps = np.abs(got.astype(np.float64) - exact) / np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
  assert ulps.max() <= 1, f"max {ulps.max():.3f} ulp at x={x[ulps.argmax()]}"
  np.testing.assert_array_equal(Tensor(-x).erf().numpy(), -got)   # odd, to the bit
  np.testing.assert_array_equal(Tensor([math.inf, -math.inf, 0.0, -0.0]).erf().numpy(), [1, -1, 0, 0])
  assert np.signbit(Tensor([-0.0]).erf().item())
  assert np.isnan(Tensor([math.nan]).erf().item())
  # float16 is computed in float32 and rounded
  half = x[:: 50].astype(np.float16)
  np.testing.assert_array_equal(Tensor(half).erf().numpy(), Tensor(half.astype(np.float32)).erf().numpy().astype(np.float16))


def test_erf_float64_keeps_its_accuracy():
  # float64 keeps its own two series, within 3e-13 of erf
  x = np.concatenate([np.linspace(-7, 7, 20001), np.geomspace(1e-300, 1, 200), [1.5, np.nextafter(1.5, 0), 6, 1e300]])
  exact = np.array([math.erf(v) for v in x])
  np.testing.assert_allclose(Tensor(x).erf().numpy(), exact, rtol=1e-12, atol=0)
  np.testing.assert_array_equal(Tensor([math.inf, -math.inf], dtype=dtypes.float64).erf().numpy(), [1, -1])
  assert np.isnan(Tensor([math.nan], dtype=dtypes.float64).erf().item())


@pytest.mark.parametrize("shapes", [[(3, 4), (3, 4)], [(2, 1, 3), (4, 1)], [(), (5,)]], ids=str)
def test_atan2(shapes):
  helper_test_op(shapes, torch.atan2, Tensor.atan2, atol=1e-6, rtol=2e-6, min_abs=0.05)


def test_atan2_axes_and_origin():
  y = np.array([0.0, 0.0, 1.0, -1.0, 0.0, 2.0, -2.0], np.float32)
  x = np.array([0.0, -1.0, 0.0, 0.0, 1.0, -1.0, -1.0], np.float32)
  helper_test_op([y, x], torch.atan2, Tensor.atan2, grad=False)


@pytest.mark.parametrize("name, torch_fn, tinychad_fn", [
  ("logaddexp", torch.logaddexp, Tensor.logaddexp),
  ("hypot", torch.hypot, Tensor.hypot),
  ("clamp_tensor_bounds", lambda x, lo: x.clamp(lo, lo + 1), lambda x, lo: x.clamp(lo, lo + 1)),
  ("outer", lambda a, b: torch.outer(a[0], b[:, 0]), lambda a, b: a[0].outer(b[:, 0])),
], ids=lambda v: v if isinstance(v, str) else "")
def test_binary(name, torch_fn, tinychad_fn):
  helper_test_op([(3, 4), (3, 4)] if name != "outer" else [(2, 3), (4, 2)], torch_fn, tinychad_fn, atol=1e-6, rtol=2e-6)


@pytest.mark.parametrize("name, torch_fn, tinychad_fn, shape", [
  ("roll_flat", lambda x: torch.roll(x, 2), lambda x: x.roll(2), (3, 4)),
  ("roll_dims", lambda x: torch.roll(x, (1, -5), (0, 1)), lambda x: x.roll((1, -5), (0, 1)), (3, 4)),
  ("roll_0d", lambda x: torch.roll(x, 1), lambda x: x.roll(1), ()),
  ("roll_empty", lambda x: torch.roll(x, 1, 0), lambda x: x.roll(1, 0), (0, 2)),
  ("roll_noncontiguous", lambda x: torch.roll(x.T, 1, 1), lambda x: x.T.roll(1, 1), (3, 4)),
  ("repeat_interleave", lambda x: x.repeat_interleave(2), lambda x: x.repeat_interleave(2), (2, 3)),
  ("repeat_interleave_dim", lambda x: x.repeat_interleave(3, dim=1), lambda x: x.repeat_interleave(3, dim=1), (2, 3)),
  ("repeat_interleave_counts", lambda x: x.repeat_interleave(torch.tensor([2, 0, 1]), dim=1),
   lambda x: x.repeat_interleave(Tensor([2, 0, 1]), dim=1), (2, 3)),
  ("repeat_interleave_0d", lambda x: x.repeat_interleave(3), lambda x: x.repeat_interleave(3), ()),
  ("unfold", lambda x: x.unfold(1, 3, 2), lambda x: x.unfold(1, 3, 2), (2, 7, 3)),
  ("unfold_last", lambda x: x.unfold(-1, 2, 1), lambda x: x.unfold(-1, 2, 1), (2, 5)),
  ("unfold_0d", lambda x: x.unfold(0, 1, 1), lambda x: x.unfold(0, 1, 1), ()),
  ("cummax", lambda x: torch.cummax(x, 1).values, lambda x: x.cummax(1).values, (3, 6)),
  ("cummin", lambda x: torch.cummin(x, 0).values, lambda x: x.cummin(0).values, (5, 2)),
  ("cumprod", lambda x: torch.cumprod(x, 1), lambda x: x.cumprod(1), (3, 5)),
  ("logcumsumexp", lambda x: torch.logcumsumexp(x, 0), lambda x: x.logcumsumexp(0), (6, 2)),
  ("diag_vector", lambda x: torch.diag(x, -1), lambda x: x.diag(-1), (3,)),
  ("diag_matrix", lambda x: torch.diag(x, 1), lambda x: x.diag(1), (3, 4)),
  ("diagonal", lambda x: torch.diagonal(x, 0, 0, 2), lambda x: x.diagonal(0, 0, 2), (3, 2, 4)),
  ("trace", torch.trace, Tensor.trace, (4, 3)),
  ("clone", lambda x: x.clone() * 2, lambda x: x.clone() * 2, (2, 3)),
  ("norm", lambda x: x.norm(), lambda x: x.norm(), (2, 3)),
  ("norm_dim_p1", lambda x: x.norm(1, dim=1, keepdim=True), lambda x: x.norm(1, dim=1, keepdim=True), (2, 3)),
  ("norm_p3", lambda x: x.norm(3, dim=0), lambda x: x.norm(3, dim=0), (2, 3)),
  ("movedim", lambda x: x.movedim(0, -1), lambda x: x.movedim(0, -1), (2, 3, 4)),
  ("narrow", lambda x: x.narrow(1, 1, 2), lambda x: x.narrow(1, 1, 2), (2, 4)),
  ("index_select", lambda x: x.index_select(1, torch.tensor([2, 0, 2])), lambda x: x.index_select(1, Tensor([2, 0, 2])), (2, 3)),
  ("tile", lambda x: x.tile(2, 1, 2), lambda x: x.tile(2, 1, 2), (2, 3)),
  ("glu", lambda x: TF.glu(x, -1), lambda x: F.glu(x, -1), (3, 4)),
  ("normalize", lambda x: TF.normalize(x, dim=1), lambda x: F.normalize(x, dim=1), (3, 4)),
  ("softmin", lambda x: TF.softmin(x, 1), lambda x: F.softmin(x, 1), (3, 4)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_unary_structural(name, torch_fn, tinychad_fn, shape):
  helper_test_op([shape], torch_fn, tinychad_fn, atol=1e-5, rtol=1e-5, low=0.3 if "cumprod" in name else -2.0)


def test_cummax_indices_and_gradient_at_ties():
  x = np.array([[3, 1, 3, 2, 5, 5, 0], [1, 1, 1, 0, 0, 2, 2]], np.float32)
  for torch_fn, fn in [(torch.cummax, Tensor.cummax), (torch.cummin, Tensor.cummin)]:
    helper_test_op([x], lambda t: torch_fn(t, 1).values, lambda t: fn(t, 1).values)
    np.testing.assert_array_equal(fn(Tensor(x), 1).indices.numpy(), torch_fn(torch.tensor(x), 1).indices.numpy())
  ints = np.array([4, 2, 7, 7, 1], np.int32)
  np.testing.assert_array_equal(Tensor(ints).cummax(0).values.numpy(), torch.cummax(torch.tensor(ints), 0).values.numpy())


def test_clone_is_a_copy():
  a = Tensor([1.0, 2.0]).realize()
  b = a.clone().realize()
  a.assign(Tensor([5.0, 6.0])).realize()
  np.testing.assert_array_equal(b.numpy(), [1, 2])
  assert b.lazydata.base.realized is not a.lazydata.base.realized


def test_meshgrid():
  for indexing in ("ij", "xy"):
    want = torch.meshgrid(torch.tensor([1, 2, 3]), torch.tensor([4, 5]), torch.tensor([6]), indexing=indexing)
    got = Tensor.meshgrid(Tensor([1, 2, 3]), Tensor([4, 5]), Tensor([6]), indexing=indexing)
    for w, g in zip(want, got): np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_in_place_methods():
  x = Tensor([1.0, -2.0, 3.0])
  x.add_(1).mul_(2).sub_(Tensor([1.0, 1.0, 1.0]), alpha=2).clamp_(-1, 5).masked_fill_(Tensor([True, False, False]), 9)
  np.testing.assert_array_equal(x.numpy(), [9, -1, 5])
  np.testing.assert_array_equal(x.zero_().numpy(), [0, 0, 0])
  np.testing.assert_array_equal(x.fill_(7).numpy(), [7, 7, 7])
  np.testing.assert_array_equal(x.copy_(Tensor([1, 2, 3])).numpy(), [1, 2, 3])
  assert x.dtype == dtypes.float32


POOLS = [dict(kernel_size=2), dict(kernel_size=2, ceil_mode=True), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
         dict(kernel_size=(3, 2), stride=(2, 3), ceil_mode=True), dict(kernel_size=3, stride=2, dilation=2, ceil_mode=True)]


@pytest.mark.parametrize("kwargs", POOLS, ids=str)
def test_max_pool2d_ceil_mode_and_indices(kwargs):
  helper_test_op([(2, 2, 7, 6)], lambda x: TF.max_pool2d(x, **kwargs), lambda x: F.max_pool2d(x, **kwargs))
  x = np.random.default_rng(1).integers(0, 4, (2, 2, 7, 6)).astype(np.float32)   # ties: the first one's index
  want_values, want_indices = TF.max_pool2d(torch.tensor(x), return_indices=True, **kwargs)
  values, indices = F.max_pool2d(Tensor(x), return_indices=True, **kwargs)
  np.testing.assert_array_equal(values.numpy(), want_values.numpy())
  np.testing.assert_array_equal(indices.numpy(), want_indices.numpy())
  assert indices.dtype == dtypes.int64


@pytest.mark.parametrize("kwargs", POOLS[:4] + [dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)], ids=str)
def test_avg_pool2d_ceil_mode(kwargs):
  kwargs = {k: v for k, v in kwargs.items() if k != "dilation"}
  helper_test_op([(2, 2, 7, 6)], lambda x: TF.avg_pool2d(x, **kwargs), lambda x: F.avg_pool2d(x, **kwargs))


def test_pool1d():
  helper_test_op([(2, 3, 9)], lambda x: TF.max_pool1d(x, 3, 2, 1, ceil_mode=True), lambda x: x.max_pool1d(3, 2, 1, ceil_mode=True))
  helper_test_op([(2, 3, 9)], lambda x: TF.avg_pool1d(x, 4, 3, ceil_mode=True), lambda x: x.avg_pool1d(4, 3, ceil_mode=True))
  _, indices = F.max_pool1d(Tensor(np.arange(10.0).reshape(1, 10)), 3, return_indices=True)
  np.testing.assert_array_equal(indices.numpy(), [[2, 5, 8]])


@pytest.mark.parametrize("kwargs", [dict(kernel_size=2), dict(kernel_size=(2, 3), dilation=(1, 2), padding=1, stride=(2, 1))], ids=str)
def test_unfold_im2col(kwargs):
  helper_test_op([(2, 3, 6, 7)], lambda x: TF.unfold(x, **kwargs), lambda x: F.unfold(x, **kwargs))
  helper_test_op([(3, 5, 5)], lambda x: TF.unfold(x, **kwargs), lambda x: F.unfold(x, **kwargs))


def _labels(shape, classes, ignored=()):
  labels = np.random.default_rng(2).integers(0, classes, shape)
  for position, value in ignored: labels[position] = value
  return labels


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_sparse_categorical_crossentropy(reduction, label_smoothing):
  labels = _labels((4,), 5, [(1, -1)])
  helper_test_op([(4, 5)], lambda x: TF.cross_entropy(x, torch.tensor(labels), ignore_index=-1, reduction=reduction,
                                                      label_smoothing=label_smoothing),
                 lambda x: x.sparse_categorical_crossentropy(Tensor(labels), reduction=reduction, label_smoothing=label_smoothing))


def test_sparse_categorical_crossentropy_classes_last_and_ignore_index():
  labels = _labels((2, 3), 4, [((0, 1), 3)])
  # (B, T, C): tinygrad's classes are on the last dim, PyTorch's on dim 1; an explicit ignore_index is honoured
  helper_test_op([(2, 3, 4)], lambda x: TF.cross_entropy(x.permute(0, 2, 1), torch.tensor(labels), ignore_index=3),
                 lambda x: x.sparse_categorical_crossentropy(Tensor(labels), ignore_index=3))
  minus_one = _labels((3,), 4, [(0, -1)])
  helper_test_op([(3, 4)], lambda x: TF.cross_entropy(x, torch.tensor(minus_one), ignore_index=-1),
                 lambda x: x.sparse_categorical_crossentropy(Tensor(minus_one), ignore_index=-1))


def test_binary_crossentropy_tinygrad_names():
  target = np.random.default_rng(3).random((3, 4)).astype(np.float32)
  helper_test_op([(3, 4)], lambda x: TF.binary_cross_entropy(x.sigmoid(), torch.tensor(target)),
                 lambda x: x.sigmoid().binary_crossentropy(Tensor(target)))
  helper_test_op([(3, 4)], lambda x: TF.binary_cross_entropy_with_logits(x, torch.tensor(target), reduction="sum"),
                 lambda x: x.binary_crossentropy_logits(Tensor(target), reduction="sum"))


@pytest.mark.parametrize("name, torch_fn, tinychad_fn", [
  ("l1_loss", TF.l1_loss, F.l1_loss),
  ("smooth_l1_loss", lambda a, b: TF.smooth_l1_loss(a, b, beta=0.5), lambda a, b: F.smooth_l1_loss(a, b, beta=0.5)),
  ("huber_loss", lambda a, b: TF.huber_loss(a, b, delta=0.7), lambda a, b: F.huber_loss(a, b, delta=0.7)),
  ("kl_div", lambda a, b: TF.kl_div(a.log_softmax(1), b.softmax(1), reduction="batchmean"),
   lambda a, b: F.kl_div(a.log_softmax(1), b.softmax(1), reduction="batchmean")),
  ("cosine_similarity", TF.cosine_similarity, F.cosine_similarity),
], ids=lambda v: v if isinstance(v, str) else "")
def test_losses_and_similarity(name, torch_fn, tinychad_fn):
  helper_test_op([(3, 4), (3, 4)], torch_fn, tinychad_fn, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name, torch_fn, tinychad_fn, shapes", [
  ("copysign", torch.copysign, Tensor.copysign, [(3, 4), (3, 4)]),
  ("fmod", torch.fmod, Tensor.fmod, [(3, 4), (3, 4)]),
  ("xlogy", lambda x, y: torch.xlogy(x, y.abs()), lambda x, y: x.xlogy(y.abs()), [(3, 4), (3, 4)]),
  ("logit", lambda x: (x.sigmoid()).logit(), lambda x: x.sigmoid().logit(), [(3, 4)]),
  ("cross", lambda a, b: torch.cross(a, b, dim=0), lambda a, b: a.cross(b, 0), [(3, 4), (3, 4)]),
  ("diff", lambda x: torch.diff(x, 2, 1), lambda x: x.diff(2, 1), [(3, 5)]),
  ("nansum", lambda x: x.nansum(1), lambda x: x.nansum(1), [(3, 4)]),
  ("rot90", lambda x: x.rot90(1, (0, 1)), lambda x: x.rot90(1, (0, 1)), [(3, 4)]),
  ("rot90_3", lambda x: x.rot90(3, (1, 0)), lambda x: x.rot90(3, (1, 0)), [(3, 4)]),
  ("unbind", lambda x: x.unbind(1)[2], lambda x: x.unbind(1)[2], [(3, 4)]),
  ("select", lambda x: x.select(0, -1), lambda x: x.select(0, -1), [(3, 4)]),
  ("var_mean", lambda x: torch.var_mean(x, 1)[0] + torch.var_mean(x, 1)[1], lambda x: sum(x.var_mean(1)), [(3, 4)]),
  ("masked_select", lambda x: x.masked_select(x > 0), lambda x: x.masked_select(x > 0), [(3, 4)]),
  ("signbit", torch.signbit, Tensor.signbit, [np.array([-1.0, -0.0, 0.0, 2.0, -math.inf, math.nan], np.float32)]),
  ("fmod_int", torch.fmod, Tensor.fmod, [np.array([7, -7, 7, -7]), np.array([3, 3, -3, -3])]),
  ("heaviside", lambda x: torch.heaviside(x, torch.tensor(0.5)), lambda x: x.heaviside(Tensor(0.5)),
   [np.array([-1.0, 0.0, 2.0], np.float32)]),
], ids=lambda v: v if isinstance(v, str) else "")
def test_pytorch_conveniences(name, torch_fn, tinychad_fn, shapes):
  # signbit and heaviside: PyTorch has no derivative for them
  helper_test_op(shapes, torch_fn, tinychad_fn, atol=1e-6, rtol=1e-5, min_abs=0.1, grad=name not in ("signbit", "heaviside"))


def test_host_read_ops():
  m = np.array([[True, False, True], [False, False, True]])
  np.testing.assert_array_equal(Tensor(m).nonzero().numpy(), torch.tensor(m).nonzero().numpy())
  for got, want in zip(Tensor(m).nonzero(as_tuple=True), torch.tensor(m).nonzero(as_tuple=True)): np.testing.assert_array_equal(got.numpy(), want.numpy())
  values = np.array([[3, 1], [3, 2]])
  for got, want in zip(Tensor(values).unique(return_inverse=True, return_counts=True),
                       torch.tensor(values).unique(return_inverse=True, return_counts=True)):
    np.testing.assert_array_equal(got.numpy(), want.numpy())
  assert sorted(Tensor.randperm(6).tolist()) == list(range(6))
  x = Tensor.zeros(200, 300).uniform_(-2, 3)
  assert x.shape == (200, 300) and -2 <= x.min().item() and x.max().item() < 3 and abs(x.mean().item() - 0.5) < 0.05
  assert abs(Tensor.zeros(300, 300).normal_(1.0, 2.0).std().item() - 2.0) < 0.05


def _listed(section: str) -> set[str]:
  text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "api-coverage.md").read_text()
  body = text.split(f"## {section}")[1].split("\n## ")[0]
  return set(re.findall(r"^- `(\w+)`", body, re.M))


TINYGRAD_NAMES = pathlib.Path(__file__).with_name("tinygrad_tensor_names.txt")


def tinygrad_tensor_names() -> set[str]:
  """tinygrad.Tensor's public names: read from the installed tinygrad where there is one (bench's extra), which must
  then match the list kept beside this file; else that list (tinygrad is not a test dependency)."""
  kept = {line.strip() for line in TINYGRAD_NAMES.read_text().splitlines() if line.strip() and not line.startswith("#")}
  try:
    import tinygrad
  except ImportError:
    return kept
  names = {n for n in dir(tinygrad.Tensor) if not n.startswith("_")}
  assert names == kept, f"tinygrad {tinygrad.__version__ if hasattr(tinygrad, '__version__') else ''} differs from " \
    f"{TINYGRAD_NAMES.name}: new {sorted(names - kept)}, gone {sorted(kept - names)}"
  return names


def test_tinygrad_names_are_covered_or_listed():
  left_out, elsewhere = _listed("Left out: tinygrad's `Tensor`"), _listed("From other branches")
  names = tinygrad_tensor_names()
  missing = sorted(n for n in names if not hasattr(Tensor, n) and n not in left_out | elsewhere)
  assert not missing, f"tinygrad.Tensor names neither in tinychad nor in docs/api-coverage.md: {missing}"
  present = sorted(n for n in left_out if hasattr(Tensor, n))
  assert not present, f"docs/api-coverage.md lists as left out what tinychad has: {present}"


def test_tinygrad_initialisers_and_shape_helpers():
  x = Tensor([[1.0, 2.0], [3.0, 4.0]])
  np.testing.assert_array_equal(x.pad_to(3, None, value=7).numpy(), [[1, 2], [3, 4], [7, 7]])
  np.testing.assert_array_equal(x.shrink_to(1, None).numpy(), [[1, 2]])
  helper_test_op([(3, 4)], lambda t: TF.normalize(t, dim=0), lambda t: t.normalize(dim=0), atol=1e-6)
  assert abs(Tensor.kaiming_normal(400, 50).std().item() - math.sqrt(2 / (1 + 0.01 ** 2) / 50)) < 0.01
  assert Tensor.scaled_uniform(4, 4).abs().max().item() <= 0.25
  y = Tensor([1.0, 2.0])
  assert y.replace(Tensor([5, 6])).dtype == dtypes.int64 and y.tolist() == [5, 6]   # the dtype comes with the data


def test_uint8_labels_and_out_of_range_comparisons():
  # an int outside the dtype's range is compared exactly (it used to overflow: uint8 targets != ignore_index -100)
  u = Tensor(np.array([0, 156, 255], np.uint8))
  np.testing.assert_array_equal((u != -100).numpy(), [True, True, True])
  np.testing.assert_array_equal((u == 356).numpy(), [False, False, False])
  np.testing.assert_array_equal((u < 300).numpy(), [True, True, True])
  np.testing.assert_array_equal((u >= -1).numpy(), [True, True, True])
  labels = np.array([3, 255], np.uint8)
  helper_test_op([(2, 300)], lambda x: TF.cross_entropy(x, torch.tensor(labels.astype(np.int64))),
                 lambda x: x.cross_entropy(Tensor(labels)), atol=1e-6)


@pytest.mark.parametrize("kwargs, shape", [
  (dict(size=(6, 10), mode="nearest-exact"), (2, 3, 5, 7)), (dict(scale_factor=0.6, mode="nearest-exact"), (2, 3, 5, 7)),
  (dict(size=(9, 4), mode="bicubic"), (2, 3, 5, 7)), (dict(size=(9, 4), mode="bicubic", align_corners=True), (2, 3, 5, 7)),
  (dict(scale_factor=1.5, mode="bicubic"), (1, 2, 5, 7)), (dict(size=(3, 2), mode="area"), (2, 3, 5, 7)),
  (dict(size=(7, 12), mode="area"), (1, 2, 5, 7)), (dict(size=(4, 5, 7), mode="trilinear"), (1, 2, 3, 4, 5)),
  (dict(scale_factor=2, mode="trilinear", align_corners=True), (1, 2, 3, 4, 5)),
], ids=str)
def test_interpolate_more_modes(kwargs, shape):
  helper_test_op([shape], lambda x: TF.interpolate(x, **kwargs), lambda x: F.interpolate(x, **kwargs), atol=3e-6, rtol=1e-5)


@pytest.mark.parametrize("name, torch_fn, tinychad_fn, shape", [
  ("adaptive_avg_pool1d", lambda x: TF.adaptive_avg_pool1d(x, 3), lambda x: F.adaptive_avg_pool1d(x, 3), (2, 3, 7)),
  ("adaptive_max_pool2d", lambda x: TF.adaptive_max_pool2d(x, (2, 3)), lambda x: F.adaptive_max_pool2d(x, (2, 3)), (2, 3, 5, 7)),
  ("adaptive_max_pool2d_up", lambda x: TF.adaptive_max_pool2d(x, 6), lambda x: F.adaptive_max_pool2d(x, 6), (1, 2, 5, 4)),
  ("pixel_unshuffle", lambda x: TF.pixel_unshuffle(x, 2), lambda x: F.pixel_unshuffle(x, 2), (2, 3, 4, 6)),
  ("group_norm", lambda x: TF.group_norm(x, 2, torch.linspace(0.5, 1.5, 4), torch.linspace(-1, 1, 4)),
   lambda x: F.group_norm(x, 2, Tensor.linspace(0.5, 1.5, 4), Tensor.linspace(-1, 1, 4)), (2, 4, 3, 5)),
  ("rms_norm", lambda x: TF.rms_norm(x, (5,), torch.linspace(0.5, 1.5, 5)), lambda x: F.rms_norm(x, (5,), Tensor.linspace(0.5, 1.5, 5)), (3, 5)),
  ("batch_norm_eval", lambda x: TF.batch_norm(x, torch.linspace(-1, 1, 3), torch.linspace(0.5, 2, 3)),
   lambda x: F.batch_norm(x, Tensor.linspace(-1, 1, 3), Tensor.linspace(0.5, 2, 3)), (4, 3, 5)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_functional_more(name, torch_fn, tinychad_fn, shape):
  helper_test_op([shape], torch_fn, tinychad_fn, atol=1e-5, rtol=1e-5)


def test_batch_norm_training_updates_running_stats():
  x = np.random.default_rng(4).standard_normal((6, 3, 4)).astype(np.float32)
  torch_mean, torch_var = torch.zeros(3), torch.ones(3)
  mean, var = Tensor.zeros(3), Tensor.ones(3)
  helper_test_op([x], lambda t: TF.batch_norm(t, torch_mean, torch_var, training=True, momentum=0.2),
                 lambda t: F.batch_norm(t, mean, var, training=True, momentum=0.2), atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(mean.numpy(), torch_mean.numpy(), atol=1e-6)
  np.testing.assert_allclose(var.numpy(), torch_var.numpy(), atol=1e-6)
