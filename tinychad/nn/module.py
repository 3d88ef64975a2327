"""nn.Module with PyTorch's habits, nn.Parameter, and the containers ModuleList / ModuleDict.

in: a model's class (subclassing Module is optional: nn.state walks any object's attributes)
out: PyTorch's Module methods on it: `model(x)` calls forward; parameters/named_parameters, buffers/named_buffers,
     modules/named_modules/children, zero_grad, requires_grad_, to(dtype)/double()/half()/float(), register_buffer,
     train()/eval() per module, state_dict()/load_state_dict().

Which tensors of a Module are what (PyTorch's rule; nn/state.py applies it):
  - parameters: nn.Parameter instances and tensors with requires_grad=True (every layer's weights). A frozen
    parameter (requires_grad_(False)) stays a parameter: in the state dict and in parameters(), not trained.
  - buffers: tensors given to register_buffer. Never trained (requires_grad=False); in the state dict when
    persistent, neither saved nor expected by a strict load when not.
  - any other tensor attribute (requires_grad None, Tensor(...)'s default: a rotary table, a causal mask) is
    neither: not trained, not saved, as a plain tensor attribute in PyTorch.
A plain object that is not a Module keeps tinygrad's rule: each tensor attribute is state, and trained unless
its requires_grad is False.

Train/eval: each module has its own flag, as in PyTorch (`body.eval(); head.train()` leaves body in eval).
train(mode) sets it on the module and its submodules, and also sets the global Tensor.training (tinygrad's switch,
read by the functional Tensor.dropout), so code written for either keeps working. A module that no train()/eval()
call has reached follows Tensor.training, so setting Tensor.training = True still switches such a model.
"""
from __future__ import annotations
from collections.abc import Iterator
from typing import Any, NamedTuple
import numpy as np
from tinychad.dtype import DType, dtypes
from tinychad.tensor import Tensor


class Parameter(Tensor):
  """A tensor that is a module's parameter: requires_grad=True unless told otherwise (torch.nn.Parameter).
  Shares its data with `data`; the ops on it give plain Tensors."""
  __slots__ = ()

  def __init__(self, data: Any = None, requires_grad: bool = True):
    super().__init__(data if data is not None else Tensor.empty(0), requires_grad=requires_grad)


class Module:
  """Optional base for layers and models; needs no super().__init__() call (the built-in layers make none)."""
  # bumped whenever any module's train/eval flag changes: TinyJit reads this one number on every call instead
  # of walking the model's modules for their flags (~0.3 ms a call for a 4-layer GPT)
  mode_version = 0

  @property
  def _training(self) -> bool | None:
    """None until a train()/eval() reaches this module: then Tensor.training rules."""
    return self.__dict__.get("_training_flag")

  @_training.setter
  def _training(self, mode: bool | None) -> None:
    if self.__dict__.get("_training_flag") is not mode: Module.mode_version += 1
    self.__dict__["_training_flag"] = mode

  def __call__(self, *args, **kwargs):
    forward = getattr(type(self), "forward", None)
    if forward is None: raise NotImplementedError(f"{type(self).__name__}: define forward() (or __call__)")
    return forward(self, *args, **kwargs)

  # ---- train / eval ----
  @property
  def training(self) -> bool: return Tensor.training if self._training is None else self._training

  @training.setter
  def training(self, mode: bool) -> None: self._training = bool(mode)

  def train(self, mode: bool = True) -> Module:
    for module in self.modules(): module._training = bool(mode)
    Tensor.training = bool(mode)
    return self

  def eval(self) -> Module: return self.train(False)

  # ---- submodules ----
  def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
    """This module and every Module inside it (attributes, lists, tuples, dicts), each once, depth first."""
    yield from walk_modules(self, prefix)

  def modules(self) -> Iterator[Module]:
    for _, module in self.named_modules(): yield module

  def named_children(self) -> Iterator[tuple[str, Module]]:
    for name, module in self.named_modules():
      if name and name.count(".") == 0: yield name, module

  def children(self) -> Iterator[Module]:
    for _, module in self.named_children(): yield module

  def apply(self, fn) -> Module:
    for module in self.modules(): fn(module)
    return self

  # ---- parameters and buffers ----
  def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
    seen: set[int] = set()
    for name, t, kind in walk_tensors(self, prefix):
      if kind == "parameter" and id(t) not in seen:
        seen.add(id(t))
        yield name, t

  def parameters(self) -> list[Tensor]:
    """Every parameter, frozen ones included (as PyTorch); optimizers skip those with requires_grad=False."""
    return [t for _, t in self.named_parameters()]

  def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
    for name, t, kind in walk_tensors(self, prefix):
      if kind in ("buffer", "temporary buffer"): yield name, t

  def buffers(self) -> list[Tensor]: return [t for _, t in self.named_buffers()]

  def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
    """A tensor of the module's state that is never trained (running statistics, a causal mask, a rotary table).
    persistent=False keeps it out of the state dict."""
    if "." in name or not name: raise KeyError(f"register_buffer: invalid buffer name {name!r}")
    if tensor is not None and not isinstance(tensor, Tensor):
      raise TypeError(f"register_buffer: {name} must be a Tensor or None, got {type(tensor).__name__}")
    if tensor is not None: tensor.requires_grad = False
    self.__dict__.setdefault("_buffers", {})[name] = persistent
    setattr(self, name, tensor)

  def register_parameter(self, name: str, param: Tensor | None) -> None:
    setattr(self, name, param if param is None or isinstance(param, Parameter) else Parameter(param))

  def zero_grad(self, set_to_none: bool = True) -> None:
    for p in self.parameters(): p.grad = None if set_to_none or p.grad is None else p.grad.zeros_like()

  def requires_grad_(self, requires_grad: bool = True) -> Module:
    for p in self.parameters(): p.requires_grad = requires_grad
    return self

  # ---- dtype and device ----
  def to(self, dtype_or_device: DType | str) -> Module:
    """Cast the floating-point parameters and buffers to a dtype, or move them all to a device, in place (the
    tensors keep their identity, so an optimizer made before still holds them)."""
    seen: set[int] = set()
    is_dtype = isinstance(dtype_or_device, DType)
    for _, t, kind in walk_tensors(self, ""):
      if kind == "plain" or id(t) in seen: continue
      seen.add(id(t))
      if is_dtype and not t.dtype.is_float: continue
      new = t.detach().cast(dtype_or_device) if is_dtype else t.detach().to(dtype_or_device)
      t.lazydata = new.realize().lazydata
      if t.grad is not None: t.grad = None
    return self

  def double(self) -> Module: return self.to(dtypes.float64)
  def float(self) -> Module: return self.to(dtypes.float32)
  def half(self) -> Module: return self.to(dtypes.float16)

  # ---- state ----
  def state_dict(self) -> dict[str, Tensor]:
    return get_state_dict(self)

  def load_state_dict(self, state_dict: dict, strict: bool = True):
    return load_state_dict(self, state_dict, strict)


class ModuleList(Module, list):
  """A list of modules; its items are named `0`, `1`, ... (`layers.0.weight`), as in PyTorch."""
  def __init__(self, modules=()):
    list.__init__(self, modules)

  def __getitem__(self, index):
    out = list.__getitem__(self, index)
    return ModuleList(out) if isinstance(index, slice) else out


class ModuleDict(Module, dict):
  """A dict of modules; its items are named by their keys (`heads.a.weight`), as in PyTorch."""
  def __init__(self, modules=None):
    dict.__init__(self, modules or {})


# ---- walking a model's modules and tensors: what state dicts, parameters and loading are built on ----
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
