"""Model state: find a model's tensors by name, load them back, and store them in safetensors files.

in: a model (any object whose attributes, lists, tuples and dicts hold Tensors), a state dict, a file path
out: get_state_dict -> {"layers.0.weight": Tensor, ...} with PyTorch's dotted names, so PyTorch's
     state_dict() and ours agree key for key; get_parameters -> the trainable Tensors;
     load_state_dict -> the model's tensors replaced in place; safe_save -> a .safetensors file written
     atomically; safe_load -> {name: Tensor}; load_weights -> a file's (or a state dict's) tensors loaded into
     a model by name (renamed first when a checkpoint's names differ from the model's), with one error listing
     every missing, unexpected and mis-shaped name.
Files use the safetensors format through the `safetensors` library: it is well kept, PyTorch, JAX and
tinygrad read and write it, and unlike torch.save's pickles a file can't run code when loaded, so we never
unpickle anything.
"""
from __future__ import annotations
import os
from collections.abc import Callable
import numpy as np
from safetensors import SafetensorError
import safetensors.numpy
from tinychad.dtype import dtypes
from tinychad.helpers import atomic_write
from tinychad.tensor import Tensor
# the model walkers live with Module (nn/module.py); nn.state is where tinygrad users look for them
from tinychad.nn.module import (LoadResult, _contiguous, get_parameters, get_state_dict, load_state_dict,  # noqa: F401
                                walk_modules, walk_tensors)

# numpy dtypes a tinychad Tensor can hold; a file with anything else is refused by name
_SUPPORTED = {np.dtype(d.np) for d in dtypes.all()}


def safe_save(state_dict: dict[str, Tensor], path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
  """Write state_dict to a .safetensors file, atomically: the bytes go to a temporary file in the same folder,
  which replaces `path` only when complete and flushed, so a crash mid-save leaves the old file whole."""
  arrays = {}
  for key, value in state_dict.items():
    if not isinstance(value, Tensor): raise TypeError(f"safe_save: {key} is a {type(value).__name__}, not a Tensor")
    arrays[key] = _contiguous(value.numpy())
  data = safetensors.numpy.save(arrays, metadata=metadata)
  atomic_write(path, data)


def safe_load(path: str | os.PathLike, device: str | None = None) -> dict[str, Tensor]:
  """Read a .safetensors file into {name: Tensor}; ValueError naming the file if it is not a whole, valid one."""
  with open(path, "rb") as f: data = f.read()
  if data[:1] == b"\x80" or data[:2] == b"PK":
    raise ValueError(f"{path}: this looks like a pickle or zip (torch.save) file, not safetensors; tinychad never unpickles "
                     "files, since loading a pickle can run arbitrary code. Save with safetensors.torch.save_file instead")
  try:
    arrays = safetensors.numpy.load(data)
  except KeyError as e:  # safetensors.numpy's dtype table has no numpy type for it (bfloat16, float8)
    raise ValueError(f"{path}: holds tensors of dtype {e}, which tinychad does not support "
                     f"(supported: {sorted(d.name for d in dtypes.all())})") from e
  except (SafetensorError, ValueError, TypeError) as e:
    raise ValueError(f"{path}: not a valid safetensors file ({len(data)} bytes; truncated or corrupt?): {e}") from e
  out = {}
  for key, array in arrays.items():
    if array.dtype not in _SUPPORTED:
      raise ValueError(f"{path}: tensor {key!r} has dtype {array.dtype}, which tinychad does not support "
                       f"(supported: {sorted(d.name for d in dtypes.all())})")
    out[key] = Tensor(array, device=device)
  return out


def load_weights(model, weights: str | os.PathLike | dict, strict: bool = True,
                 rename: Callable[[str], str | None] | None = None) -> LoadResult:
  """Load a checkpoint into model by name: a .safetensors file (PyTorch's safetensors.torch.save_file, or our
  safe_save) or an in-memory state dict ({name: Tensor or numpy array}).

  rename, if given, maps each checkpoint name to the model's name for it, or to None to leave that tensor out
  (a checkpoint's extra heads, a buffer the model doesn't keep). Then as load_state_dict: the model's tensors
  keep their identity, dtype and device; RuntimeError (naming the file) listing every missing and unexpected
  name (when strict) and every shape mismatch, before anything is copied.
  """
  if isinstance(weights, dict): state, source = weights, "state dict"
  elif isinstance(weights, (str, os.PathLike)): state, source = safe_load(weights), os.fspath(weights)
  else: raise TypeError(f"load_weights: weights must be a .safetensors path or a state dict, got {type(weights).__name__}")
  if rename is not None:
    renamed = {}
    for key, value in state.items():
      if (new := rename(key)) is not None: renamed[new] = value
    state = renamed
  try:
    return load_state_dict(model, state, strict)
  except RuntimeError as e:
    raise RuntimeError(f"{source}: {e}") from None
