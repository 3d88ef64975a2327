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
from pathlib import Path
from collections.abc import Iterator
from typing import Any, NamedTuple
import numpy as np
from safetensors import SafetensorError
import safetensors.numpy
from tinychad.dtype import dtypes
from tinychad.helpers import atomic_write
from tinychad.tensor import Tensor
from tinychad.nn.module import Module, Parameter

# numpy dtypes a tinychad Tensor can hold; a file with anything else is refused by name
_SUPPORTED = {np.dtype(d.np) for d in dtypes.all()}


def get_state_dict(obj: Any, prefix: str = "") -> dict[str, Tensor]:
  """Every Tensor of obj's state, named by the path to it: attributes, list indices and dict keys joined by dots.

  Attributes starting with "_" are private and skipped; None attributes (a layer built with bias=False) are skipped,
  as PyTorch leaves them out of its state_dict too. Each object is visited once, so cycles are harmless. Inside an
  nn.Module only parameters and persistent buffers are state (nn/module.py's rule); elsewhere every tensor is.
  """
  return {name: t for name, t, kind in walk_tensors(obj, prefix) if kind in ("parameter", "buffer", "state")}


def walk_tensors(obj: Any, prefix: str = "") -> Iterator[tuple[str, Tensor, str]]:
  """(name, tensor, kind) for each tensor reachable from obj, in attribute order. kind: "parameter" (trainable
  unless requires_grad is False), "buffer" / "temporary buffer" (a Module's register_buffer, persistent or not),
  "plain" (a Module's other tensor attributes: neither trained nor saved), "state" (a plain object's tensor with
  requires_grad=False: saved, not trained)."""
  yield from _walk(obj, prefix, None, None, set())


def _walk(obj: Any, name: str, owner: Any, attr: str | None, seen: set[int]) -> Iterator[tuple[str, Tensor, str]]:
  if isinstance(obj, Tensor):
    yield name, obj, _kind(obj, owner, attr)
    return
  if id(obj) in seen: return
  if isinstance(obj, (list, tuple)): items = [(str(i), v, None) for i, v in enumerate(obj)]
  elif isinstance(obj, dict): items = [(str(k), v, None) for k, v in obj.items()]
  elif hasattr(obj, "__dict__") and not isinstance(obj, type): items = [(k, v, k) for k, v in vars(obj).items() if not k.startswith("_")]
  else: return
  seen.add(id(obj))
  # tensors in a list or dict belong to the object holding it; an object with attributes (or a Module list) owns its own
  if isinstance(obj, Module) or not isinstance(obj, (list, tuple, dict)): owner = obj
  if isinstance(obj, Module):
    if isinstance(obj, (list, tuple, dict)): items += [(k, v, k) for k, v in vars(obj).items() if not k.startswith("_")]
    # PyTorch's order: a module's own parameters, then its buffers, then its submodules
    buffers = obj.__dict__.get("_buffers", {})
    items.sort(key=lambda item: 2 if not isinstance(item[1], Tensor) else 1 if item[2] in buffers else 0)
  for key, value, attr_name in items:
    yield from _walk(value, f"{name}.{key}" if name else key, owner, attr_name, seen)


def _kind(t: Tensor, owner: Any, attr: str | None) -> str:
  if not isinstance(owner, Module): return "state" if t.requires_grad is False else "parameter"
  buffers = owner.__dict__.get("_buffers", {})
  if attr is not None and attr in buffers: return "buffer" if buffers[attr] else "temporary buffer"
  if isinstance(t, Parameter) or t.requires_grad is not None: return "parameter"
  return "plain"


def walk_modules(obj: Any, prefix: str = "") -> Iterator[tuple[str, Module]]:
  """(name, module) for obj (if a Module) and each Module reachable from it, each once, depth first."""
  seen: set[int] = set()
  stack = [(prefix, obj)]
  while stack:
    name, node = stack.pop()
    if id(node) in seen or isinstance(node, (Tensor, type)): continue
    seen.add(id(node))
    if isinstance(node, Module): yield name, node
    if isinstance(node, (list, tuple)): items = [(str(i), v) for i, v in enumerate(node)]
    elif isinstance(node, dict): items = [(str(k), v) for k, v in node.items()]
    else: items = []
    if hasattr(node, "__dict__"): items += [(k, v) for k, v in vars(node).items() if not k.startswith("_")]
    stack.extend((f"{name}.{key}" if name else key, value) for key, value in reversed(items))


def get_parameters(obj: Any) -> list[Tensor]:
  """The model's trainable Tensors (parameters whose requires_grad is not False), each once even when shared.

  Buffers (BatchNorm's running_mean, register_buffer), frozen tensors (requires_grad=False) and a Module's plain
  tensor attributes are left out, so `SGD(get_parameters(model))` trains exactly what should be trained.
  """
  unique: dict[int, Tensor] = {}
  for _, t, kind in walk_tensors(obj):
    if kind == "parameter" and t.requires_grad is not False: unique.setdefault(id(t), t)
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
