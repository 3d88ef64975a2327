"""tinychad.distributed: data-parallel training over MPI (mpi4py), as PyTorch's torch.distributed + DDP.

in: the same script started on N processes (`mpirun -np N python train.py`), on one machine or many
out: each rank trains on its share of every batch; gradients are averaged over ranks before each step,
so all ranks hold the same weights, those of one process training on the whole batch.
  comm.py      the job (init, rank, world_size) and collectives on tensors (all_reduce, broadcast,
               all_gather, barrier), with deadlines and abort-on-exception
  parallel.py  DistributedDataParallel, allreduce_gradients (bucketed, overlapped with the backward pass)
tinychad.data.DistributedSampler gives each rank its shard of each epoch; nn.SyncBatchNorm computes batch
statistics over all ranks. Without a launcher everything here works as a world of one. docs/distributed.md
shows how to launch on several machines and what the all-reduce costs.
"""
from tinychad.distributed.comm import (DistributedTimeout, all_gather, all_reduce, all_reduce_sum, barrier, broadcast, init,
                                       is_main, launched, rank, world_size)
from tinychad.distributed.parallel import DistributedDataParallel, allreduce_gradients, broadcast_parameters

__all__ = ["DistributedTimeout", "all_gather", "all_reduce", "all_reduce_sum", "barrier", "broadcast", "init", "is_main",
           "launched", "rank", "world_size", "DistributedDataParallel", "allreduce_gradients", "broadcast_parameters"]
