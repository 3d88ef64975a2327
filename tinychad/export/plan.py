"""Plan an export: the kernels of one call of a function, and where every buffer they touch lives.

in: a function of Tensors, example input Tensors, the SIMD width of the target machine and its kernel tuning
out: a Plan: the call's kernels lowered to linear IR (codegen) in order, each with its argument buffers;
     every buffer classified as an input, a weight (read but never written: its data is kept), or
     scratch (written by a kernel), scratch placed at an offset of one arena, buffers whose lifetimes
     don't overlap sharing bytes; and each output's source buffer. Sizes are all known: nothing is
     allocated when the exported code runs.
The call is captured with engine/realize.py's capture(), as TinyJit records. The function runs three
times: once to realize lazy weights and build kernels, once recorded, and once recorded on other input
values (a permutation of the examples' values, plus noise for floats). The two recordings must run the
same kernels, every buffer computed must be used by a later kernel or returned (one that isn't was read
by Python: `.item()`, `.numpy()`), and replaying the first recording on the third call's inputs must
give the third call's outputs exactly; else the function's Python control flow or shapes depend on
tensor values, or it keeps state, and exporting it would freeze one path silently. (Python reading an
input directly, with no kernel, is caught only when the other values send it down another path.)
Kernels that read weights only (the weights' packing and transposes, a batchnorm's folded scale) are run
once here, and their outputs become weights: the exported code doesn't redo them on every call.
"""
from __future__ import annotations
import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence
import numpy as np
from tinychad.codegen import Program, lower_item
from tinychad.device import Buffer
from tinychad.dtype import DType
from tinychad.engine.jit import TinyJit
from tinychad.engine.realize import capture, realize, run_kernel
from tinychad.engine.schedule_cache import CatsInPlace
from tinychad.host import target_simd_bytes

ALIGN = 64    # bytes: every arena slot starts at a multiple, as tinychad's own buffers do (SIMD, streaming stores)
FOLD_MIN_BYTES = 4096   # a folded kernel's output may be this big whatever it reads (_foldable)
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(eq=False)
class Slot:
  """One buffer of the exported code. kind: "input", "weight" or "scratch"."""
  kind: str
  size: int
  dtype: DType
  name: str
  data: np.ndarray | None = None      # a weight's values
  offset: int = 0                     # a scratch buffer's byte offset in the arena
  first: int = 0                      # a scratch buffer's lifetime: first and last step using it
  last: int = 0

  @property
  def nbytes(self) -> int: return max(self.size, 1) * self.dtype.itemsize


@dataclass
class Step:
  """One kernel call (program set) or a copy from the buffer `args[1]` to `args[0]`."""
  program: Program | None
  args: list[Slot]


@dataclass
class Param:
  """A named input or output of the exported function."""
  name: str
  shape: tuple[int, ...]
  dtype: DType
  slot: Slot

  @property
  def size(self) -> int: return int(np.prod(self.shape, dtype=np.int64))

  def manifest(self) -> dict:
    return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype.name, "size": self.size}


@dataclass
class Plan:
  name: str
  inputs: list[Param]
  outputs: list[Param]
  steps: list[Step]
  weights: list[Slot]
  arena_bytes: int
  scratch: list[Slot] = field(default_factory=list)

  def manifest(self) -> dict:
    kernels = sum(1 for s in self.steps if s.program is not None)
    return {"name": self.name, "inputs": [p.manifest() for p in self.inputs],
            "outputs": [p.manifest() for p in self.outputs], "kernels": kernels, "arena_bytes": self.arena_bytes,
            "weight_bytes": sum(w.nbytes for w in self.weights)}


def _flatten(result: Any) -> list:
  if hasattr(result, "lazydata"): return [result]
  if isinstance(result, (list, tuple)) and result and all(hasattr(r, "lazydata") for r in result): return list(result)
  raise TypeError(f"export: the function must return a Tensor or a list/tuple of Tensors, not {type(result).__name__}")


def _call(fn: Callable, inputs: list) -> list:
  """fn on `inputs`, its outputs made whole row-major buffers and realized."""
  outs = [out.contiguous() for out in _flatten(fn(*inputs))]
  realize([out.lazydata for out in outs])
  return outs


def _other_values(t) -> Any:
  """A tensor like `t` with other values: its values permuted (valid indices stay valid), floats nudged."""
  values = t.numpy()
  flat = values.reshape(-1)[np.random.default_rng(0).permutation(values.size)].reshape(values.shape)
  if values.dtype.kind == "f":
    finite = np.abs(values[np.isfinite(values)])
    scale = float(finite.mean()) if finite.size else 1.0
    flat = flat + np.random.default_rng(1).uniform(-0.25, 0.25, values.shape).astype(values.dtype) * (scale or 1.0)
  return type(t)(np.ascontiguousarray(flat), device=t.device, dtype=t.dtype)


def _signature(steps: list) -> list:
  return [(item.ast, item.name) if item is not None else ("copy", bufs[0].size) for item, bufs in steps]


def _check_replay(steps: list, inputs: list[Buffer], others: list[Buffer], outs: list[Buffer], expected: list) -> None:
  """Run the recorded kernels with `others` in place of `inputs`; the outputs must be `expected`."""
  swap = {id(a): b for a, b in zip(inputs, others)}
  for item, bufs in steps:
    for b in bufs[1:]: swap.setdefault(id(b), b)
    fresh = Buffer(bufs[0].device, bufs[0].size, bufs[0].dtype).allocate()
    swap[id(bufs[0])] = fresh
    args = [fresh] + [swap[id(b)] for b in bufs[1:]]
    if item is None: fresh.copyin(args[1].as_numpy())
    else: run_kernel(item, args)
  for number, (out, want) in enumerate(zip(outs, expected)):
    got = swap.get(id(out), out).as_numpy()
    if not np.array_equal(got, want.reshape(-1), equal_nan=True):
      raise ValueError(f"export: output {number} of the function on other input values is not what its recorded kernels "
                       "compute: its Python code reads tensor values (.item(), .numpy(), .tolist(), a comparison in an "
                       "`if`), draws random numbers, or keeps state between calls, so no fixed program computes it")


def _check_all_used(steps: list, outs: list[Buffer]) -> None:
  """Every buffer the call computed is read by a later kernel or returned: one that isn't was made for
  Python to look at (`.item()`, `.numpy()`), and the exported code couldn't do what Python did with it."""
  used = {id(b) for b in outs} | {id(b) for _, bufs in steps for b in bufs[1:]}
  for item, bufs in steps:
    if id(bufs[0]) not in used:
      what = f"kernel {item.name}" if item is not None else "a copy"
      raise ValueError(f"export: {what} computes a {bufs[0].dtype.name} buffer of {bufs[0].size} elements that nothing "
                       "returned uses: the function reads tensor values in Python (.item(), .numpy(), .tolist(), a "
                       "comparison in an `if`), which the exported code can't do; compute with tensors only")


def _names(given: Sequence[str] | None, count: int, default: str, what: str) -> list[str]:
  names = list(given) if given is not None else [f"{default}{i}" if count > 1 else default for i in range(count)]
  if len(names) != count: raise ValueError(f"export: {len(names)} {what} names given for {count} {what}s")
  for n in names:
    if not NAME.match(n): raise ValueError(f"export: {what} name {n!r} is not an identifier (C, LLVM and JS use it)")
  if len(set(names)) != len(names): raise ValueError(f"export: {what} names {names} repeat")
  return names


def capture_plan(fn: Callable, example_inputs: Sequence, name: str, simd: int, input_names=None,
                 output_names=None, tuning: str = "host") -> Plan:
  """The Plan of `fn` on tensors shaped like `example_inputs` (see the module docstring), its kernels
  lowered for `simd`-byte registers with the tuning table's row `tuning` (codegen/opt.py's TUNING)."""
  if not NAME.match(name): raise ValueError(f"export: name {name!r} is not an identifier")
  # a jitted function replays kernels without realizing them, which capture() records only once
  if isinstance(fn, TinyJit): fn = fn.fn
  if hasattr(example_inputs, "lazydata"): example_inputs = [example_inputs]
  for number, x in enumerate(example_inputs):
    if not hasattr(x, "lazydata"):
      raise TypeError(f"export: example input {number} must be a Tensor, not {type(x).__name__}")
  inputs = [x.contiguous() for x in example_inputs]
  realize([x.lazydata for x in inputs])
  input_bufs = [x.lazydata.base.realized for x in inputs]
  if len({id(b) for b in input_bufs}) != len(input_bufs):
    raise ValueError("export: the same tensor is given as two inputs")
  # every kernel writes a buffer of its own: a plan has no views of one buffer in another (a cat's pieces)
  with CatsInPlace.off():
    _call(fn, inputs)                                  # realizes lazy weights and builds the kernels
    with capture() as steps:
      outs = _call(fn, inputs)
    others = [_other_values(x) for x in inputs]
    with capture() as other_steps:
      other_outs = _call(fn, others)
  if _signature(steps) != _signature(other_steps) or [o.shape for o in outs] != [o.shape for o in other_outs]:
    raise ValueError("export: the function runs different kernels or returns other shapes on other input values of the "
                     "same shapes: its Python control flow depends on tensor values, which a fixed program can't follow")
  out_bufs = [o.lazydata.base.realized for o in outs]
  _check_all_used(steps, out_bufs)
  _check_replay(steps, input_bufs, [x.lazydata.base.realized for x in others], out_bufs,
                [o.numpy() for o in other_outs])

  slots: dict[int, Slot] = {}
  in_names = _names(input_names, len(inputs), "input", "input")
  for x, buf, n in zip(inputs, input_bufs, in_names): slots[id(buf)] = Slot("input", buf.size, buf.dtype, n)
  plan_steps: list[Step] = []
  weights: list[Slot] = []

  def slot_of(buf: Buffer, index: int) -> Slot:
    if id(buf) not in slots:       # read before anything in the call wrote it: data the export keeps
      slot = slots[id(buf)] = Slot("weight", buf.size, buf.dtype, f"w{len(weights)}", buf.as_numpy().copy())
      weights.append(slot)
    slot = slots[id(buf)]
    slot.last = index
    return slot

  with target_simd_bytes(simd, tuning):
    for index, (item, bufs) in enumerate(steps):
      args = [slot_of(b, index) for b in bufs[1:]]
      out = bufs[0]
      if id(out) in slots: raise ValueError("export: the function writes a tensor that existed before the call (assign)")
      if _foldable(args, out):
        slots[id(out)] = _fold(item, out, args)
        weights.append(slots[id(out)])
        continue
      slots[id(out)] = Slot("scratch", out.size, out.dtype, f"b{index}", first=index, last=index)
      program = None
      if item is not None:
        program = lower_item(item)
        program = dataclasses.replace(program, name=f"{name}_k{index}_{program.name}")
      plan_steps.append(Step(program, [slots[id(out)]] + args))
  out_names = _names(output_names, len(outs), "output", "output")
  outputs = []
  for o, buf, n in zip(outs, out_bufs, out_names):
    slot = slot_of(buf, len(steps))                  # outputs live to the end
    outputs.append(Param(n, tuple(o.shape), o.dtype, slot))
  params = [Param(n, tuple(x.shape), x.dtype, slots[id(b)]) for x, b, n in zip(inputs, input_bufs, in_names)]
  scratch = [s for s in slots.values() if s.kind == "scratch"]
  # weights only folded kernels read are gone from the code; the rest are numbered afresh
  read = {id(slot) for step in plan_steps for slot in step.args[1:]} | {id(p.slot) for p in outputs}
  weights = [w for w in weights if id(w) in read]
  for number, w in enumerate(weights): w.name = f"w{number}"
  return Plan(name, params, outputs, plan_steps, weights, _place(scratch), scratch)


def _foldable(args: list[Slot], out: Buffer) -> bool:
  """A kernel (or copy) that reads weights only computes the same on every call: the export runs it once and
  keeps its output as a weight (the scheduler's packed and transposed weights, a batchnorm's scale), unless
  that output is much bigger than what it reads (a broadcast: cheaper computed than stored)."""
  return all(a.kind == "weight" for a in args) and \
    out.size * out.dtype.itemsize <= max(sum(a.nbytes for a in args), FOLD_MIN_BYTES)


def _fold(item, out: Buffer, args: list[Slot]) -> Slot:
  """The weight slot holding the output of a foldable kernel (item) or copy (None), run here on the host."""
  sources = []
  for a in args:
    buf = Buffer(out.device, a.size, a.dtype).allocate()
    buf.copyin(np.ascontiguousarray(a.data).reshape(-1))
    sources.append(buf)
  result = Buffer(out.device, out.size, out.dtype).allocate()
  if item is None: result.copyin(sources[0].as_numpy())
  else: run_kernel(item, [result] + sources)
  return Slot("weight", out.size, out.dtype, "", result.as_numpy().copy())


def _place(scratch: list[Slot]) -> int:
  """Offsets for the scratch buffers in one arena, buffers alive at the same time apart: biggest first,
  each at the lowest offset clear of the placed buffers whose lifetimes overlap its own. Returns its size."""
  placed: list[Slot] = []
  for slot in sorted(scratch, key=lambda s: (-s.nbytes, s.first)):
    busy = sorted((p.offset, p.offset + p.nbytes) for p in placed if p.first <= slot.last and slot.first <= p.last)
    offset = 0
    for lo, hi in busy:
      if offset + slot.nbytes <= lo: break
      offset = max(offset, -(-hi // ALIGN) * ALIGN)
    slot.offset = offset
    placed.append(slot)
  return max((s.offset + s.nbytes for s in placed), default=0)
