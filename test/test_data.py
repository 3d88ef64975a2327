"""Tests for tinychad.data.DataLoader: batching, len, drop_last, shuffling, and the Tensor conversion.

in: small numpy arrays made here  ->  out: pass/fail.
"""
import sys
import types
import numpy as np
import pytest
from tinychad.data import DataLoader


def make_pairs(n: int = 10) -> tuple[np.ndarray, np.ndarray]:
  """Features whose first column is the sample index, and labels that are ten times it, so pairing is checkable."""
  features = np.stack([np.arange(n), np.arange(n) + 100], axis=1)
  return features, np.arange(n) * 10


def epoch_indices(loader: DataLoader) -> list[int]:
  return [int(i) for features, _ in loader for i in features[:, 0]]


@pytest.mark.parametrize("n, batch_size, drop_last, expected", [(10, 3, False, 4), (10, 3, True, 3), (9, 3, False, 3),
                                                                  (9, 3, True, 3), (2, 5, False, 1), (2, 5, True, 0),
                                                                  (0, 4, False, 0)])
def test_len_is_the_number_of_batches(n, batch_size, drop_last, expected):
  loader = DataLoader(*make_pairs(n), batch_size=batch_size, drop_last=drop_last, to_tensor=False)
  assert len(loader) == expected and len(list(loader)) == expected


def test_unshuffled_batches_are_in_order_with_a_short_last_batch():
  features, labels = make_pairs(10)
  batches = list(DataLoader(features, labels, batch_size=4, to_tensor=False))
  assert [len(batch_features) for batch_features, _ in batches] == [4, 4, 2]
  assert np.array_equal(np.concatenate([batch_features for batch_features, _ in batches]), features)
  assert np.array_equal(np.concatenate([batch_labels for _, batch_labels in batches]), labels)
  # contiguous batches are views into the dataset, not copies
  assert all(np.shares_memory(batch_features, features) for batch_features, _ in batches)


def test_drop_last_drops_only_the_short_batch():
  batches = list(DataLoader(*make_pairs(10), batch_size=4, drop_last=True, to_tensor=False))
  assert [len(batch_features) for batch_features, _ in batches] == [4, 4]
  assert [int(i) for batch_features, _ in batches for i in batch_features[:, 0]] == list(range(8))


def test_single_array_still_yields_tuples():
  batches = list(DataLoader(np.arange(5), batch_size=2, to_tensor=False))
  assert all(isinstance(batch, tuple) and len(batch) == 1 for batch in batches)
  assert [batch.tolist() for (batch,) in batches] == [[0, 1], [2, 3], [4]]


def test_shuffle_sees_every_sample_once_per_epoch_and_keeps_pairs_aligned():
  features, labels = make_pairs(23)
  loader = DataLoader(features, labels, batch_size=5, shuffle=True, seed=0, to_tensor=False)
  for _ in range(3):
    seen = []
    for batch_features, batch_labels in loader:
      assert np.array_equal(batch_labels, batch_features[:, 0] * 10) and np.array_equal(batch_features[:, 1], batch_features[:, 0] + 100)
      seen.extend(batch_features[:, 0].tolist())
    assert sorted(seen) == list(range(23)) and seen != list(range(23))


def test_shuffle_is_reproducible_per_seed_and_new_each_epoch():
  def three_epochs(seed):
    loader = DataLoader(*make_pairs(50), batch_size=8, shuffle=True, seed=seed, to_tensor=False)
    return [epoch_indices(loader) for _ in range(3)]
  first_run, second_run = three_epochs(7), three_epochs(7)
  assert first_run == second_run
  assert first_run[0] != first_run[1] != first_run[2]
  assert three_epochs(8) != first_run


def test_shuffle_with_drop_last_sees_distinct_full_batches():
  loader = DataLoader(*make_pairs(10), batch_size=3, shuffle=True, seed=1, drop_last=True, to_tensor=False)
  indices = epoch_indices(loader)
  assert len(indices) == 9 and len(set(indices)) == 9


def test_rejects_bad_arguments():
  with pytest.raises(ValueError, match="at least one"): DataLoader(batch_size=2)
  with pytest.raises(ValueError, match="differ"): DataLoader(np.zeros(4), np.zeros(5), batch_size=2)
  with pytest.raises(ValueError, match="first dimension"): DataLoader(np.float32(1.0), batch_size=1)
  for bad in (0, -1, 2.5, True):
    with pytest.raises(ValueError, match="batch_size"): DataLoader(np.zeros(4), batch_size=bad)


def test_to_tensor_wraps_each_batch_in_tinychad_tensor(monkeypatch):
  # a stand-in tinychad.tensor module, so this checks the loader's side of the contract: Tensor(np_array) per batch
  class RecordingTensor:
    def __init__(self, data): self.data = data
  fake_module = types.ModuleType("tinychad.tensor")
  fake_module.Tensor = RecordingTensor
  monkeypatch.setitem(sys.modules, "tinychad.tensor", fake_module)
  features, labels = make_pairs(5)
  batches = list(DataLoader(features, labels, batch_size=2))
  assert all(isinstance(item, RecordingTensor) for batch in batches for item in batch)
  assert np.array_equal(np.concatenate([batch_labels.data for _, batch_labels in batches]), labels)
