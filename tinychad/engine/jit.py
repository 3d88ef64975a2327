"""TinyJit: capture the kernels a function runs, then replay them without Python graph building.

in: a function of Tensors that returns Tensors (a training step, a model forward)
out: the same function, faster. Call 1 runs normally (compiles kernels); call 2 runs normally while
recording every kernel and the buffers it touched; later calls with the same input shapes and dtypes
replay the recording with the new inputs' buffers, skipping the Tensor, autograd and scheduler layers.
A replay runs each stretch of consecutive CPU kernels as one native call (runtime/threads.py KernelList: the
kernels' addresses and arguments in C arrays made on the first replay; each replay writes only the arguments
whose buffers are new), so a kernel's launch costs ~0.1 us instead of a Python call's ~4 us.

Tensors are whatever has a `.lazydata` (this module sits below the front end and never imports
Tensor): outputs are rebuilt with the class of the tensors the function returned. Tensor.assign and
Tensor's random constructors call note_assign and note_random; the kernels of the recorded call come
from engine/realize.py's capture().
State: a tensor updated with `assign()` inside the function (parameters, optimizer moments) is
rebound to its freshly written buffer after each replay, so training steps work. A Python value the
function reads (say `optimizer.lr`) is baked into the kernels as a constant: the JIT snapshots the
plain numbers reachable from the function's arguments, closure and globals (not through a TinyJit: a
jitted `step` that calls `opt.step()` sees itself among its globals), and records afresh when one
changes rather than replaying a stale value.
Constant kernels: a kernel that reads only buffers from outside the call (weights of a model run for
inference: the channels-last copies a convolution makes of its weight), directly or through other such
kernels, wrote the same values on the last run, so a replay skips it while those buffers are the same
ones (a tensor assigned outside the call since rebinds them: the next replay runs them again) and no host step
(engine/realize.py's run_on_host: a broadcast, an all-reduce) has written a buffer in place since.
Views: a cat's piece is written into the cat's buffer (device.BufferView): a step writing a view writes its
buffer, and a buffer a replay replaces (a new output) takes its views along, each moved by its offset.
"""
from __future__ import annotations
import functools
import time
import types
import weakref
from typing import Any, Callable
from tinychad.device import Buffer, Device
from tinychad.engine.realize import HostCall, HostWrites, call_on_host, capture, loaded_program, realize, run_kernel
from tinychad.helpers import DEBUG
from tinychad.lazy import LazyBuffer
from tinychad.ops import LoadOps
from tinychad.runtime.compiled import Compiled, buffer_addresses
from tinychad.runtime.threads import KernelList
from tinychad.view import ShapeTracker


class _Recording:
  """What call 2 ran: kernels with their buffers, the tensors assigned, and the outputs."""
  def __init__(self):
    self.steps: list[tuple[Any, list[Buffer]]] = []      # (ScheduleItem, None for a copy or HostCall, buffers)
    self.assigned: dict[int, tuple[Any, Buffer]] = {}     # id(tensor) -> (tensor, buffer before the call)
    self.random: list[tuple[Buffer, Callable]] = []       # random buffers made in the call, and how to redraw them
    # filled in when the call ends:
    self.inputs: list[Buffer] = []                        # the argument tensors' buffers
    self.outputs: list[tuple] = []                        # (class, buffer, base shape, view) of each returned tensor
    self.assigned_after: list[tuple] = []                 # (tensor, buffer, base shape, view) after the call
    self.structure: Any = None                            # what the function returned, to rebuild on replay
    self.external: set[int] = set()                       # buffers read but not written by the recording
    self.rebound: dict[int, Any] = {}                     # external buffer -> tensor assigned since, outside
    self.constant: set[int] = set()                       # indices of the steps that read only external buffers
    self.constant_reads: list[Buffer] = []                # the external buffers those steps read
    self.constant_key: tuple[Buffer, ...] = ()            # the buffers they were last run on (held: ids can't recur)
    self.host_writes = 0                                  # HostWrites.count when they last ran
    # the steps made ready to replay (see _plan), with the constant steps (False) or without them (True)
    self.plans: dict[bool, tuple[list, dict[int, list[tuple[KernelList, int, int]]]]] = {}


_active: _Recording | None = None


_live_jits: weakref.WeakSet = weakref.WeakSet()


def _is_tensor(obj) -> bool: return hasattr(obj, "lazydata")


def note_assign(tensor) -> None:
  """Called by every Tensor.assign. Inside a recorded call: remember the buffer the tensor held before
  the call changed it. Outside: tell each recording that reads the tensor's buffer where its value now lives."""
  base = tensor.lazydata.base
  if _active is not None:
    if id(tensor) in _active.assigned: return
    if base.realized is None:
      raise RuntimeError("TinyJit: a tensor assigned inside a jitted function must be realized before the call")
    _active.assigned[id(tensor)] = (tensor, base.realized)
    return
  if base.realized is None: return
  for jit in _live_jits:
    if jit.recording is not None and id(base.realized) in jit.recording.external:
      jit.recording.rebound[id(base.realized)] = tensor


def note_random(tensor, redraw: Callable) -> None:
  """Called by Tensor._random: a replay must draw new numbers, not reuse the recorded ones."""
  if _active is not None: _active.random.append((tensor.lazydata.base.realized, redraw))


def _scalar_state(roots: list, depth: int = 2) -> tuple:
  """The plain numbers and strings reachable from `roots` (a shallow walk): the Python values a
  function can bake into kernels."""
  found, seen = [], set()

  def visit(obj, path: str, level: int) -> None:
    if isinstance(obj, (bool, int, float, str, type(None))):
      found.append((path, obj))
      return
    if level == 0 or id(obj) in seen or _is_tensor(obj): return
    # a TinyJit is no value a kernel bakes in, and its own call count changes every call: a jitted `step`
    # that calls `opt.step()` finds itself under the global name `step`, and must still replay
    if isinstance(obj, (LazyBuffer, Buffer, types.ModuleType, type, types.FunctionType, TinyJit)): return
    seen.add(id(obj))
    # a module's train/eval flags, its submodules' at any depth included: the shallow walk below would miss a
    # dropout three modules down switched by `body.eval()`. nn.Module counts the changes of any module's flag
    # (mode_version), so one number stands for all the flags, read without walking the model (another model's
    # eval() records afresh too: rare, and never a stale replay)
    if isinstance(getattr(type(obj), "mode_version", None), int) and hasattr(obj, "_training"):
      found.append(("modules' train/eval flags", type(obj).mode_version))
    if isinstance(obj, (list, tuple)):
      for i, item in enumerate(obj[:64]): visit(item, f"{path}[{i}]", level - 1)
    elif isinstance(obj, dict):
      for key in list(obj)[:64]: visit(obj[key], f"{path}[{key!r}]", level - 1)
    elif hasattr(obj, "__dict__"):
      for name, value in vars(obj).items(): visit(value, f"{path}.{name}", level - 1)

  for number, root in enumerate(roots): visit(root, f"#{number}", depth)
  return tuple(found)


class TinyJit:
  def __init__(self, fn: Callable):
    self.fn = fn
    self.calls = 0
    self.recording: _Recording | None = None
    self.key = None
    self.state = None
    self.tensor_type: type | None = None      # the class of the tensors it takes or returns (for its modes)
    functools.update_wrapper(self, fn)

  def __get__(self, obj, objtype=None):
    # used as a method decorator: bind like a function would
    return self if obj is None else functools.partial(self.__call__, obj)

  def reset(self) -> None:
    self.calls, self.recording, self.key, self.state = 0, None, None, None

  def _roots(self, args, kwargs) -> list:
    fn = self.fn
    roots = [a for a in args if not _is_tensor(a)] + [v for v in kwargs.values() if not _is_tensor(v)]
    code = getattr(fn, "__code__", None)
    if code is not None:
      roots += [cell.cell_contents for cell in (fn.__closure__ or ()) if _cell_filled(cell)]
      roots += [fn.__globals__[name] for name in code.co_names if name in fn.__globals__]
    return roots

  def _key(self, tensors: list) -> tuple:
    # train/eval mode and no_grad change which kernels a step runs, so they are part of the key
    cls = self.tensor_type
    modes = (cls.training, cls.no_grad) if cls is not None else ()
    return modes + tuple((t.shape, t.dtype, t.device, t.lazydata.st) for t in tensors)

  def __call__(self, *args, **kwargs):
    tensors = [a for a in args if _is_tensor(a)] + [v for v in kwargs.values() if _is_tensor(v)]
    if tensors:
      realize([t.lazydata for t in tensors])
      self.tensor_type = type(tensors[0])
    key = self._key(tensors)
    state = _scalar_state(self._roots(args, kwargs))
    if self.recording is not None and key == self.key and state == self.state:
      return self._replay(tensors)
    # new shapes, or a changed value that a recording baked in, start over; a value that changed before
    # anything was recorded (a first step that filled in an optimizer's momentum) is only what call 2 records,
    # so a training step replays from its third call
    if self.recording is not None or (self.key is not None and key != self.key): self.reset()
    self.calls += 1
    self.key, self.state = key, state
    if self.calls >= 2: return self._record(tensors, args, kwargs)
    out = self.fn(*args, **kwargs)
    if self.tensor_type is None:
      # a function of no tensors: its modes are read from the class of the tensors it returns
      self.tensor_type = next((type(t) for t in _flatten(out)), None)
      self.key = self._key(tensors)
    return out

  def _record(self, tensors: list, args, kwargs):
    global _active
    recording = _Recording()
    _active = recording
    try:
      with capture() as recording.steps:
        out = self.fn(*args, **kwargs)
        outs = _flatten(out)
        if outs: realize([t.lazydata for t in outs])
    finally:
      _active = None
    for t in outs:
      if t.lazydata.base.realized is None:
        raise RuntimeError("TinyJit: a returned tensor was not computed by a kernel (a constant?); return computed tensors")
    recording.inputs = [t.lazydata.base.realized for t in tensors]
    recording.outputs = [(type(t), t.lazydata.base.realized, t.lazydata.base.shape, t.lazydata.st) for t in outs]
    recording.assigned_after = [(t, t.lazydata.base.realized, t.lazydata.base.shape, t.lazydata.st) for t, _ in recording.assigned.values()]
    recording.structure = out
    # buffers the recording reads but did not write: tensors assigned later (outside) rebind them
    # (a step writing a view writes its buffer)
    written = {buf_id for _, bufs in recording.steps for buf_id in (id(bufs[0]), id(_root(bufs[0])))}
    recording.external = {id(b) for _, bufs in recording.steps for b in bufs[1:] if id(b) not in written}
    _find_constant_steps(recording)
    self.recording = recording
    _live_jits.add(self)
    return out

  def _replay(self, tensors: list):
    rec = self.recording
    swap: dict[int, Buffer] = {}
    for old, new in zip(rec.inputs, tensors): swap[id(old)] = new.lazydata.base.realized
    for tensor, before in rec.assigned.values(): swap[id(before)] = tensor.lazydata.base.realized
    for old_id, tensor in rec.rebound.items(): swap[old_id] = tensor.realize().lazydata.base.realized
    fresh: dict[int, Buffer] = {}
    for _, buf, _, _ in rec.outputs: _renew(buf, fresh)
    for _, after, _, _ in rec.assigned_after: _renew(after, fresh)
    swap.update(fresh)
    for buf, redraw in rec.random: swap[id(buf)] = Buffer(buf.device, buf.size, buf.dtype).copyin(redraw())
    constant_key = tuple(swap.get(id(b), b) for b in rec.constant_reads)
    same = len(constant_key) == len(rec.constant_key) and all(a is b for a, b in zip(constant_key, rec.constant_key))
    skip = bool(rec.constant) and same and rec.host_writes == HostWrites.count
    rec.constant_key, rec.host_writes = constant_key, HostWrites.count
    steps = [step for index, step in enumerate(rec.steps) if index not in rec.constant] if skip else rec.steps
    if DEBUG() >= 2: _run_steps(steps, swap, timed=True)
    else:
      if skip not in rec.plans: rec.plans[skip] = _plan(steps)
      plan, slots = rec.plans[skip]
      for old_id, buf in swap.items():
        for kernels, slot, shift in slots.get(old_id, ()): kernels.args[slot] = buf.allocate().address + shift
      for kernels, part in plan:
        if kernels is None or not kernels.run(): _run_steps(part, swap)
    for tensor, after, base_shape, st in rec.assigned_after:
      tensor.lazydata = _wrap(swap[id(after)], base_shape, st)
    outs = [cls.from_lazy(_wrap(swap[id(buf)], base_shape, st), None) for cls, buf, base_shape, st in rec.outputs]
    return _rebuild(rec.structure, iter(outs))


def _plan(steps: list) -> tuple[list, dict[int, list[tuple[KernelList, int, int]]]]:
  """The recorded steps as a replay runs them, in order, as (KernelList or None, steps): each run of consecutive
  kernels of a compiled CPU device as one KernelList (one native call for all of them), the other steps (copies,
  host steps, other devices' kernels) with None, to run one by one; and, for each buffer, the KernelList
  argument slots that take it, where a replay writes its new one's address (plus the kernel's shift of that
  argument, codegen/offsets.py)."""
  plan: list[tuple[KernelList | None, list]] = []
  slots: dict[int, list[tuple[KernelList, int, int]]] = {}
  pending: list[tuple[Any, list[Buffer], Any]] = []

  def close_list() -> None:
    if not pending: return
    kernels = KernelList([(k.address, buffer_addresses(k, bufs) + list(k.constants), k.parallel, item.points)
                          for item, bufs, k in pending])
    for (_, bufs, k), start in zip(pending, kernels.starts):
      for i, b in enumerate(bufs):
        shift = k.shifts[i] if i < len(k.shifts) else 0
        slots.setdefault(id(b), []).append((kernels, start + i, shift))
        # a view's slot follows its buffer too, should a replay replace that one
        if b.view_of is not None:
          slots.setdefault(id(b.view_of), []).append((kernels, start + i, shift + b.view_offset))
    plan.append((kernels, [(item, bufs) for item, bufs, _ in pending]))   # the steps: if the pool can't start
    pending.clear()

  for item, bufs in steps:
    device = None if item is None or isinstance(item, HostCall) else Device[item.output.device]
    # a device that runs kernels as Compiled.run does (the native thread pool over the kernel's address)
    if isinstance(device, Compiled) and type(device).run is Compiled.run:
      program = loaded_program(item)
      if KernelList.available(len(bufs) + len(program.constants)):
        pending.append((item, bufs, program))
        continue
    close_list()
    plan.append((None, [(item, bufs)]))
  close_list()
  return plan, slots


def _run_steps(steps: list, swap: dict[int, Buffer], timed: bool = False) -> None:
  """Recorded steps one by one on the replay's buffers (DEBUG>=2 prints each kernel's time)."""
  for item, bufs in steps:
    mapped = [_swapped(b, swap) for b in bufs]
    if item is None:
      mapped[0].copyin(mapped[1].as_numpy())
      continue
    if isinstance(item, HostCall):
      call_on_host(item.fn, mapped)
      continue
    start = time.perf_counter()
    run_kernel(item, mapped)
    if timed: print(f"  replay {item.name:30s} {item.output.device:6s} {(time.perf_counter() - start) * 1e6:9.1f} us")


def _root(buf: Buffer) -> Buffer:
  """The buffer whose memory `buf` is: itself, or what a view is of."""
  return buf.view_of or buf


def _renew(buf: Buffer, fresh: dict[int, Buffer]) -> None:
  """A new buffer for a replay's output `buf`, into `fresh`: for a view, a new one of what it is of, and a view."""
  root = _root(buf)
  if id(root) not in fresh: fresh[id(root)] = Buffer(root.device, root.size, root.dtype).allocate()
  if root is not buf: fresh[id(buf)] = buf.moved_to(fresh[id(root)])


def _swapped(buf: Buffer, swap: dict[int, Buffer]) -> Buffer:
  """What a replay runs in place of a recorded buffer: its replacement, a view of its buffer's, or itself."""
  new = swap.get(id(buf))
  if new is not None: return new
  root = buf.view_of
  if root is None or id(root) not in swap: return buf
  return buf.moved_to(swap[id(root)])


def _find_constant_steps(rec: _Recording) -> None:
  """Mark the steps whose every input is an external buffer or a constant step's output (not an input, an
  assigned tensor, a random draw, nor what a host step writes), writing no output of the call."""
  varying = {id(b) for b in rec.inputs} | {id(before) for _, before in rec.assigned.values()}
  varying |= {id(b) for b, _ in rec.random}
  fresh = {id(_root(buf)) for _, buf, _, _ in rec.outputs} | {id(_root(after)) for _, after, _, _ in rec.assigned_after}
  host_written = {id(bufs[0]) for item, bufs in rec.steps if isinstance(item, HostCall)}
  reads: dict[int, Buffer] = {}
  for index, (item, bufs) in enumerate(rec.steps):
    out, ins = bufs[0], bufs[1:]
    written_anew = id(_root(out)) in fresh or id(out) in host_written
    if isinstance(item, HostCall) or written_anew or any(id(b) in varying for b in ins):
      # a view written varies its buffer: a cat of a varying piece varies
      varying.update((id(out), id(_root(out))))
      continue
    rec.constant.add(index)
    reads.update((id(b), b) for b in ins if id(b) in rec.external)
  rec.constant_reads = list(reads.values())
  rec.constant_key = tuple(rec.constant_reads)           # the recorded call ran them on the buffers themselves
  rec.host_writes = HostWrites.count


def _cell_filled(cell) -> bool:
  try:
    cell.cell_contents
  except ValueError:
    return False
  return True


def _wrap(buf: Buffer, base_shape: tuple[int, ...], st: ShapeTracker) -> LazyBuffer:
  """A realized LazyBuffer over `buf`, seen through the view the recorded tensor had."""
  base = LazyBuffer(buf.device, ShapeTracker.from_shape(base_shape), buf.dtype, LoadOps.FROM_NUMPY)
  base.realized = buf
  return base if st == base.st else LazyBuffer(buf.device, st, buf.dtype, base=base)


def _flatten(out) -> list:
  if _is_tensor(out): return [out]
  if isinstance(out, (list, tuple)): return [t for o in out for t in _flatten(o)]
  if isinstance(out, dict): return [t for o in out.values() for t in _flatten(o)]
  return []


def _rebuild(structure, outs):
  if _is_tensor(structure): return next(outs)
  if isinstance(structure, (list, tuple)): return type(structure)(_rebuild(s, outs) for s in structure)
  if isinstance(structure, dict): return {k: _rebuild(v, outs) for k, v in structure.items()}
  return structure
