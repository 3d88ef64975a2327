"""Mini-batches over numpy arrays, and each rank's share of them in data-parallel training.

in: one or more numpy arrays with the same first dimension (e.g. images and labels), a batch size, shuffling options
    (or a sampler: DistributedSampler gives each rank of a job its shard of every epoch)
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
               drop_last: bool = False, to_tensor: bool = True, sampler: DistributedSampler | None = None):
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
    if sampler is not None and shuffle: raise ValueError("DataLoader: shuffle=True with a sampler (the sampler shuffles)")
    if sampler is not None and sampler.num_samples != self.num_samples:
      raise ValueError(f"DataLoader: the sampler covers {sampler.num_samples} samples, the arrays have {self.num_samples}")
    self.sampler = sampler

  def __len__(self) -> int:
    rows = self.num_samples if self.sampler is None else len(self.sampler)
    if self.drop_last: return rows // self.batch_size
    return math.ceil(rows / self.batch_size)

  def __iter__(self) -> Iterator[tuple]:
    order = self.rng.permutation(self.num_samples) if self.shuffle else None
    if self.sampler is not None: order = self.sampler.indices()
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


class DistributedSampler:
  """Rank `rank`'s share of each epoch, as PyTorch's DistributedSampler: the epoch's order (a permutation
  seeded by seed + epoch when shuffling, the same on every rank) padded by repeating its start so that
  it divides evenly (or cut, with drop_last), then every num_replicas-th index from position rank.
  So the ranks' i-th batches together are the i-th batch of num_replicas times the size in the same
  order: data-parallel training sees what one process with the bigger batch would.
  num_replicas and rank default to the running job's (tinychad.distributed). Call set_epoch(e) before
  each epoch, or every epoch repeats the first one's order."""
  def __init__(self, num_samples: int, num_replicas: int | None = None, rank: int | None = None, shuffle: bool = True,
               seed: int = 0, drop_last: bool = False):
    if num_replicas is None or rank is None:
      from tinychad.distributed import comm      # here, so data loading alone never loads the MPI layer
      num_replicas = comm.world_size() if num_replicas is None else num_replicas
      rank = comm.rank() if rank is None else rank
    if num_replicas < 1 or not 0 <= rank < num_replicas:
      raise ValueError(f"DistributedSampler: rank {rank} is not in a world of {num_replicas}")
    self.num_samples, self.num_replicas, self.rank = num_samples, num_replicas, rank
    self.shuffle, self.seed, self.drop_last, self.epoch = shuffle, seed, drop_last, 0
    self.per_rank = num_samples // num_replicas if drop_last else math.ceil(num_samples / num_replicas)

  def set_epoch(self, epoch: int) -> None: self.epoch = epoch

  def __len__(self) -> int: return self.per_rank

  def indices(self) -> np.ndarray:
    order = np.random.default_rng(self.seed + self.epoch).permutation(self.num_samples) if self.shuffle else np.arange(self.num_samples)
    total = self.per_rank * self.num_replicas
    order = np.resize(order, total) if total > len(order) else order[:total]   # np.resize repeats from the start
    return order[self.rank::self.num_replicas]

  def __iter__(self) -> Iterator[int]: return iter(self.indices().tolist())
