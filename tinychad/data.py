"""Mini-batches over numpy arrays.

in: one or more numpy arrays with the same first dimension (e.g. images and labels), a batch size, shuffling options
out: per batch, a tuple with one slice of each array along that first dimension, as Tensors (or numpy arrays)
"""
from __future__ import annotations
import math
from typing import Iterator
import numpy as np


class DataLoader:
  """Iterates `arrays` in batches of `batch_size` rows, one epoch per `for` loop.

  With shuffle=True every epoch draws a new permutation from one np.random.default_rng(seed), so a given
  seed replays the same sequence of epochs. Only the rows of the current batch are gathered; the dataset
  itself is never copied. Each batch is a tuple even for a single array, so unpacking looks the same always.
  """
  def __init__(self, *arrays: np.ndarray, batch_size: int = 1, shuffle: bool = False, seed: int | None = None,
               drop_last: bool = False, to_tensor: bool = True):
    if not arrays: raise ValueError("DataLoader needs at least one array")
    if not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) or batch_size < 1:
      raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    self.arrays = tuple(np.asarray(array) for array in arrays)
    if any(array.ndim == 0 for array in self.arrays): raise ValueError("DataLoader arrays need a first dimension to batch along")
    lengths = [len(array) for array in self.arrays]
    if len(set(lengths)) != 1: raise ValueError(f"DataLoader arrays differ in first dimension: {lengths}")
    self.num_samples = lengths[0]
    self.batch_size, self.shuffle, self.drop_last, self.to_tensor = int(batch_size), shuffle, drop_last, to_tensor
    self.rng = np.random.default_rng(seed)

  def __len__(self) -> int:
    if self.drop_last: return self.num_samples // self.batch_size
    return math.ceil(self.num_samples / self.batch_size)

  def __iter__(self) -> Iterator[tuple]:
    order = self.rng.permutation(self.num_samples) if self.shuffle else None
    for batch_index in range(len(self)):
      start = batch_index * self.batch_size
      # unshuffled batches are contiguous slices, so they are views; shuffled ones gather just their rows
      rows = slice(start, start + self.batch_size) if order is None else order[start:start + self.batch_size]
      yield tuple(self._convert(array[rows]) for array in self.arrays)

  def _convert(self, batch: np.ndarray):
    if not self.to_tensor: return batch
    # imported here so the loader (and numpy-only code using it) works without loading the Tensor machinery
    from tinychad.tensor import Tensor
    return Tensor(batch)
