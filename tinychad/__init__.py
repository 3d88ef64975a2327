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
  6 engine/*, viz, export    graph in, kernels run: scheduling, realize, JIT, BEAM search, the graph's pictures
  7 function                 autograd: each primitive's forward and backward, on LazyBuffers
  8 tensor, indexing,        the front end users call; indexing and nn/functional define some of Tensor's
    nn/functional            methods, so they and tensor.py import each other (the only such pairs)
  9 nn/* (but functional),   libraries written with Tensor (layers, optimizers, state dicts, data sets),
    optim, data, datasets,   the runnable examples and this package's names: they use the front end,
    compat, examples/*,      nothing below them needs them
    models/*, __init__
"""
from tinychad.tensor import Tensor, no_grad
from tinychad.dtype import dtypes, DType
from tinychad.device import Device
from tinychad.helpers import GlobalCounters
from tinychad.engine.jit import TinyJit
from tinychad import compat  # noqa: F401 -- installs the seed's names (see compat.py)
from tinychad.nn import optim  # noqa: F401 -- the seed's `tinychad.optim` (see compat.py)

__all__ = ["Tensor", "no_grad", "dtypes", "DType", "Device", "GlobalCounters", "TinyJit"]
