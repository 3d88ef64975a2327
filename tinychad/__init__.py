"""tinychad: a small deep learning framework that compiles.

Tensor (tensor.py) -> lazy graph (lazy.py) -> kernels (engine/schedule.py) -> linear IR (codegen/)
-> C or LLVM IR (renderer/) -> run (runtime/). Start reading at tensor.py.
"""
from tinychad.tensor import Tensor, no_grad
from tinychad.dtype import dtypes, DType
from tinychad.device import Device
from tinychad.helpers import GlobalCounters
from tinychad.engine.jit import TinyJit
from tinychad import compat  # noqa: F401 -- installs the seed's names (see compat.py)

__all__ = ["Tensor", "no_grad", "dtypes", "DType", "Device", "GlobalCounters", "TinyJit"]
