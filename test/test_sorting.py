"""Tensor.topk, sort, argsort and multinomial against PyTorch: values, indices, gradients, sampling statistics.

Sorting is stable in tinychad (ties keep their order), so PyTorch is called with stable=True; topk breaks ties
by the earlier index, which inputs with repeated values check explicitly.
"""
from __future__ import annotations
import numpy as np
import pytest
import torch
from scipy import stats
from tinychad import Tensor
from torch_reference import compare, random_inputs


def with_ties(shape, seed: int = 0) -> np.ndarray:
  # few distinct values: every row has ties
  return np.random.default_rng(seed).integers(-3, 4, shape).astype(np.float32)


@pytest.mark.parametrize("dim", [-1, 0, 1])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_values_indices_and_gradient(dim, descending):
  for x in (random_inputs((4, 6, 5))[0], with_ties((4, 6, 5))):
    compare([x], lambda t: torch.sort(t, dim=dim, descending=descending, stable=True),
            lambda t: t.sort(dim, descending))


@pytest.mark.parametrize("descending", [False, True])
def test_argsort_is_stable(descending):
  x = with_ties((5, 9), seed=1)
  got = Tensor(x).argsort(-1, descending=descending).numpy()
  want = torch.sort(torch.tensor(x), dim=-1, descending=descending, stable=True).indices.numpy()
  np.testing.assert_array_equal(got, want)
  assert Tensor(x).argsort().dtype.name == "int64"


@pytest.mark.parametrize("k,dim,largest", [(1, -1, True), (3, -1, True), (3, 0, False), (9, 1, True), (2, 1, False)])
def test_topk_values_indices_and_gradient(k, dim, largest):
  compare([(4, 9)], lambda t: torch.topk(t, k, dim=dim, largest=largest), lambda t: t.topk(k, dim, largest))
  x = with_ties((4, 9), seed=2)
  got = Tensor(x).topk(k, dim, largest).indices.numpy()
  want = torch.sort(torch.tensor(x), dim=dim, descending=largest, stable=True).indices.narrow(dim, 0, k).numpy()
  np.testing.assert_array_equal(got, want)


def test_sorting_errors_name_the_op():
  with pytest.raises(ValueError, match="topk: k=5 is out of range for dim 1 of size 4"): Tensor.ones(2, 4).topk(5)
  with pytest.raises(IndexError): Tensor.ones(2, 4).sort(2)
  with pytest.raises(ValueError, match="sort: dim 0 has 9000 elements"): Tensor.ones(9000).sort()


def test_multinomial_with_replacement_follows_the_weights():
  weights = np.array([0.1, 0.0, 0.6, 0.3, 0.0], np.float32)
  Tensor.manual_seed(0)
  draws = Tensor(weights * 7).multinomial(20000, replacement=True).numpy()   # unnormalised weights are fine
  assert draws.shape == (20000,) and draws.dtype == np.int64
  counts = np.bincount(draws, minlength=5)
  assert counts[1] == counts[4] == 0   # zero weight: never drawn, not even last
  nonzero = weights > 0
  w = weights[nonzero].astype(np.float64)
  expected = 20000 * w / w.sum()
  assert stats.chisquare(counts[nonzero], expected).pvalue > 1e-3


def test_multinomial_without_replacement_draws_one_after_another():
  weights = np.array([0.1, 0.0, 0.6, 0.3])
  Tensor.manual_seed(1)
  draws = Tensor(np.tile(weights, (6000, 1)).astype(np.float32)).multinomial(2).numpy()
  assert draws.shape == (6000, 2)
  assert (draws[:, 0] != draws[:, 1]).all() and (draws != 1).all()
  # the second draw: P(j) = sum_i w_i * w_j / (1 - w_i) over i != j
  second = np.array([sum(weights[i] * weights[j] / (1 - weights[i]) for i in range(4) if i != j) for j in range(4)])
  counts = np.bincount(draws[:, 1], minlength=4)
  expected = 6000 * second[[0, 2, 3]] / second[[0, 2, 3]].sum()
  assert stats.chisquare(counts[[0, 2, 3]], expected).pvalue > 1e-3


def test_multinomial_is_seeded():
  weights = Tensor([0.2, 0.3, 0.5])
  Tensor.manual_seed(5)
  first = weights.multinomial(50, replacement=True).numpy()
  Tensor.manual_seed(5)
  np.testing.assert_array_equal(weights.multinomial(50, replacement=True).numpy(), first)


def test_multinomial_errors():
  with pytest.raises(ValueError, match="multinomial: cannot draw 4 samples from 3 categories without replacement"):
    Tensor([0.2, 0.3, 0.5]).multinomial(4)
  with pytest.raises(TypeError, match="multinomial: weights must be floats"): Tensor([1, 2]).multinomial(1)
  with pytest.raises(ValueError, match="1-d or 2-d"): Tensor.ones(2, 2, 2).multinomial(1)
