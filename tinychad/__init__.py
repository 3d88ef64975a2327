"""tinychad: a small deep learning framework that compiles.

in: user code calling Tensor ops  ->  out: numbers, computed by generated C or LLVM IR kernels.
Tensor (tensor.py) -> autograd Functions (function.py) -> lazy graph (lazy.py) -> kernels
(engine/schedule.py) -> linear IR (codegen/) -> C or LLVM IR (renderer/) -> compiled and run (runtime/).
Start reading at docs/from-micrograd.md, then tensor.py.

Layers, lowest first. Data flows down the pipeline; a module imports only modules of its own layer or
lower ones (at module level or inside functions), so each layer can be read, tested and replaced
knowing only what is below it. test/test_layers.py holds the same order and enforces it.
  0 helpers, dtype, ops,     facts every layer shares: flags, counters, dtypes, the primitive op set,
    host                     the host CPU's SIMD width
  1 view                     shapes, strides, masks: how a buffer is read, no data
  2 codegen/*                a kernel tree in, linear IR out: pure compilation, knows no device
  3 renderer/*               linear IR in, C or LLVM IR text out: one file per language
  4 runtime/*, device        source in, compiled code run on buffers out: devices know nothing of graphs
  5 lazy                     the graph of primitive ops that Tensor records; runs nothing itself
  6 engine/*, viz,          graph in, kernels run: scheduling, realize, JIT, BEAM search, the graph's pictures,
    export/*                 a function exported as C, LLVM IR or WebAssembly
  7 function                 autograd: each primitive's forward and backward, on LazyBuffers
  8 tensor, indexing,        the front end users call; indexing and nn/functional define some of Tensor's
    nn/functional,           methods, so they and tensor.py import each other (the only such pairs);
    distributed/comm         MPI collectives on tensors (nn's SyncBatchNorm uses them)
  9 nn/* (but functional),   libraries written with Tensor (layers, optimizers, state dicts, data sets),
    optim, data, datasets,   the models, the runnable examples and this package's names: they use the
    compat, models/*,        front end, nothing below them needs them
    examples/*,
    distributed/*, __init__
"""
from tinychad.helpers import GlobalCounters, relax_gc
from tinychad.tensor import Tensor, no_grad
from tinychad.dtype import dtypes, DType
from tinychad.device import Device, empty_cache, max_memory_allocated, memory_allocated, memory_pooled, memory_reserved, reset_peak_memory_stats
from tinychad.engine.jit import TinyJit
from tinychad import export  # noqa: F401 -- tinychad.export(fn, inputs, target=...): export/__init__.py
from tinychad import compat  # noqa: F401 -- installs the seed's names (see compat.py)
from tinychad.nn import optim  # noqa: F401 -- the seed's `tinychad.optim` (see compat.py)

# an eager step records thousands of short-lived objects: collect cycles less often (helpers.relax_gc says why)
relax_gc()

__all__ = ["Tensor", "no_grad", "dtypes", "DType", "Device", "GlobalCounters", "TinyJit", "memory_allocated", "max_memory_allocated",
           "reset_peak_memory_stats", "memory_pooled", "memory_reserved", "empty_cache"]
