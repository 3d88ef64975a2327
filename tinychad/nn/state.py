"""Model state: find a model's tensors by name, load them back, and store them in safetensors files.

in: a model (any object whose attributes, lists, tuples and dicts hold Tensors), a state dict, a file path
out: get_state_dict -> {"layers.0.weight": Tensor, ...} with PyTorch's dotted names, so PyTorch's
     state_dict() and ours agree key for key; get_parameters -> the trainable Tensors;
     load_state_dict -> the model's tensors replaced in place; safe_save -> a .safetensors file written
     atomically; safe_load -> {name: Tensor}.
Files use the safetensors format through the `safetensors` library: it is well kept, PyTorch, JAX and
tinygrad read and write it, and unlike torch.save's pickles a file can't run code when loaded, so we never
unpickle anything.
"""
from __future__ import annotations
import os
from typing import Any, NamedTuple
import numpy as np
from safetensors import SafetensorError
import safetensors.numpy
from tinychad.dtype import dtypes
from tinychad.helpers import atomic_write
from tinychad.tensor import Tensor

# numpy dtypes a tinychad Tensor can hold; a file with anything else is refused by name
_SUPPORTED = {np.dtype(d.np) for d in dtypes.all()}


def get_state_dict(obj: Any, prefix: str = "") -> dict[str, Tensor]:
  """Every Tensor reachable from obj, named by the path to it: attributes, list indices and dict keys joined by dots.

  Attributes starting with "_" are private and skipped; None attributes (a layer built with bias=False) are skipped,
  as PyTorch leaves them out of its state_dict too. Each object is visited once, so cycles are harmless.
  """
  out: dict[str, Tensor] = {}
  _walk(obj, prefix, out, set())
  return out


def _walk(obj: Any, name: str, out: dict[str, Tensor], seen: set[int]) -> None:
  if isinstance(obj, Tensor):
    out[name] = obj
    return
  if id(obj) in seen: return
  if isinstance(obj, (list, tuple)): items = [(str(i), v) for i, v in enumerate(obj)]
  elif isinstance(obj, dict): items = [(str(k), v) for k, v in obj.items()]
  elif hasattr(obj, "__dict__") and not isinstance(obj, type): items = [(k, v) for k, v in vars(obj).items() if not k.startswith("_")]
  else: return
  seen.add(id(obj))
  for key, value in items: _walk(value, f"{name}.{key}" if name else key, out, seen)


def get_parameters(obj: Any) -> list[Tensor]:
  """The model's trainable Tensors (requires_grad not False), each once even when shared (tied weights).

  Running statistics (BatchNorm's running_mean, ...) and frozen tensors (requires_grad=False) are left out,
  so `SGD(get_parameters(model))` trains exactly what should be trained.
  """
  unique: dict[int, Tensor] = {}
  for t in get_state_dict(obj).values():
    if t.requires_grad is not False: unique.setdefault(id(t), t)
  return list(unique.values())


class LoadResult(NamedTuple):
  """What load_state_dict(strict=False) skipped, as PyTorch's _IncompatibleKeys."""
  missing_keys: list[str]
  unexpected_keys: list[str]


def load_state_dict(model: Any, state_dict: dict[str, Any], strict: bool = True) -> LoadResult:
  """Copy each value of state_dict (Tensors or numpy arrays) into the model's tensor of the same name.

  The model's tensors keep their identity (an optimizer holding them still works) and their dtype and device:
  values are cast as PyTorch's load_state_dict does. Shape mismatches always raise; missing and unexpected
  keys raise when strict, else they are returned. One error lists every problem, not just the first.
  """
  own = get_state_dict(model)
  missing = [k for k in own if k not in state_dict]
  unexpected = [k for k in state_dict if k not in own]
  problems = []
  for key, target in own.items():
    if key not in state_dict: continue
    shape = tuple(state_dict[key].shape)
    if shape != target.shape: problems.append(f"{key}: the file has shape {shape}, the model {target.shape}")
  if strict and missing: problems.append(f"missing keys (in the model, not in the state dict): {missing}")
  if strict and unexpected: problems.append(f"unexpected keys (in the state dict, not in the model): {unexpected}")
  if problems: raise RuntimeError(f"load_state_dict into {type(model).__name__}:\n  " + "\n  ".join(problems))
  loaded = []
  for key, target in own.items():
    if key not in state_dict: continue
    value = state_dict[key]
    value = value.to(target.device) if isinstance(value, Tensor) else Tensor(_contiguous(np.asarray(value)), device=target.device)
    loaded.append(target.assign(value.detach().cast(target.dtype)))
  if loaded: Tensor.realize(*loaded)
  return LoadResult(missing, unexpected)


def _contiguous(array: np.ndarray) -> np.ndarray:
  # np.ascontiguousarray alone turns a 0-d array (BatchNorm's num_batches_tracked) into a 1-d one
  return np.ascontiguousarray(array).reshape(array.shape)


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
