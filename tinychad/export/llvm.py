"""A Plan as one LLVM IR module: the founding notes' shape, a forward function that takes the buffers
and calls one function per kernel.

in: a Plan (export/plan.py), weights "embed" or "safetensors"
out: the text of `<name>.ll`, with
       i32 @<name>_init(ptr %weights)               0 when ready (embedded weights: pass null)
       void @<name>_forward(ptr %in0, ..., ptr %out0, ...)
     each kernel an internal function (the LLVM device's renderer, renderer/llvmir.py), the weights as
     internal constants of their exact bytes (or pointers into the safetensors file set by <name>_init),
     and one internal arena holding every intermediate at its planned offset. No target triple: the
     compiler that reads it (llvmlite, clang) picks the machine. Libm is called only for the math the
     renderer doesn't expand (sin, float64 exp2/log2, fmod), as llvm.* intrinsics.
Each kernel's module text is cut into its parts (declarations are shared, definitions renamed internal):
the renderer makes one module per kernel, and this keeps the text llvmlite's IR builder writes, which
older LLVMs (clang-14) still parse, rather than a newer LLVM's printout of a linked module.
"""
from __future__ import annotations
import re
from tinychad.export.c import safetensors_layout
from tinychad.export.plan import Plan, Slot
from tinychad.renderer.llvmir import render_llvm

_DEFINE = re.compile(r'^define void @"([^"]+)"')


def _bytes_literal(data: bytes) -> str:
  return "c\"" + "".join(f"\\{b:02X}" for b in data) + "\""


def _kernels(plan: Plan) -> tuple[list[str], list[str]]:
  """(declarations, definitions) of every kernel, each definition internal."""
  declarations: dict[str, None] = {}
  definitions = []
  for step in plan.steps:
    if step.program is None or step.args[0].size == 0: continue
    try:
      text = render_llvm(step.program)
    except NotImplementedError as e:
      raise ValueError(f"export: kernel {step.program.name} can't be written as LLVM IR: {e}") from e
    body: list[str] = []
    for line in text.splitlines():
      if line.startswith(("; ModuleID", "target ", "source_filename")) or not line.strip(): continue
      if line.startswith("declare"): declarations[line] = None
      elif _DEFINE.match(line): body.append(line.replace("define void", "define internal void", 1))
      else: body.append(line)
    definitions.append("\n".join(body))
  return list(declarations), definitions


def render_module(plan: Plan, weights: str) -> str:
  """<name>.ll (see the module docstring)."""
  declarations, definitions = _kernels(plan)
  lines = [f"; {plan.name}.ll: exported by tinychad ({len(definitions)} kernels, {plan.arena_bytes} bytes of scratch)"]
  if weights == "embed":
    for w in plan.weights:
      data = w.data.reshape(-1).view("uint8").tobytes() or b"\0"
      lines.append(f"@{w.name} = internal constant [{len(data)} x i8] {_bytes_literal(data)}, align 64")
  else:
    lines += [f"@{w.name} = internal global ptr null, align 8" for w in plan.weights]
  lines.append(f"@{plan.name}_arena = internal global [{max(plan.arena_bytes, 1)} x i8] zeroinitializer, align 64")
  lines += declarations + definitions + _init(plan, weights) + _forward(plan, weights)
  return "\n".join(lines) + "\n"


def _init(plan: Plan, weights: str) -> list[str]:
  if weights == "embed": return [f"define i32 @{plan.name}_init(ptr %weights) {{", "  ret i32 0", "}"]
  header_bytes, offsets = safetensors_layout(plan)
  lines = [f"define i32 @{plan.name}_init(ptr %weights) {{", "entry:",
           "  %null = icmp eq ptr %weights, null", "  br i1 %null, label %bad, label %check", "check:",
           # the file starts with its header's length, little-endian (as x86-64, aarch64 and wasm32 load it)
           "  %header = load i64, ptr %weights, align 1", f"  %ours = icmp eq i64 %header, {header_bytes}",
           "  br i1 %ours, label %set, label %bad", "set:"]
  for number, (w, at) in enumerate(offsets):
    lines += [f"  %p{number} = getelementptr inbounds i8, ptr %weights, i64 {8 + header_bytes + at}",
              f"  store ptr %p{number}, ptr @{w.name}, align 8"]
  return lines + ["  ret i32 0", "bad:", "  ret i32 -1", "}"]


def _forward(plan: Plan, weights: str) -> list[str]:
  params = [f"ptr noalias %{p.name}" for p in plan.inputs + plan.outputs]
  lines = [f"define void @{plan.name}_forward({', '.join(params)}) {{", "entry:"]
  refs: dict[int, str] = {}

  def ref(slot: Slot) -> str:
    if id(slot) in refs: return refs[id(slot)]
    name = f"%.s{len(refs)}"     # a dot: no parameter (an identifier) can have this name
    if slot.kind == "input": return f"%{slot.name}"
    if slot.kind == "scratch":
      lines.append(f"  {name} = getelementptr inbounds i8, ptr @{plan.name}_arena, i64 {slot.offset}")
    elif weights == "embed": return f"@{slot.name}"
    else: lines.append(f"  {name} = load ptr, ptr @{slot.name}, align 8")
    refs[id(slot)] = name
    return name

  copies = 0

  def copy(dst: str, src: str, nbytes: int) -> None:
    # a byte loop, not the memcpy intrinsic, whose name differs between LLVM versions; the optimizer
    # turns it into a memcpy
    nonlocal copies
    c = f".c{copies}"
    copies += 1
    lines.extend([f"  br label %{c}_pre", f"{c}_pre:", f"  br label %{c}_loop", f"{c}_loop:",
                  f"  %{c}_i = phi i64 [0, %{c}_pre], [%{c}_next, %{c}_loop]",
                  f"  %{c}_s = getelementptr inbounds i8, ptr {src}, i64 %{c}_i",
                  f"  %{c}_d = getelementptr inbounds i8, ptr {dst}, i64 %{c}_i", f"  %{c}_v = load i8, ptr %{c}_s",
                  f"  store i8 %{c}_v, ptr %{c}_d", f"  %{c}_next = add i64 %{c}_i, 1",
                  f"  %{c}_done = icmp eq i64 %{c}_next, {nbytes}", f"  br i1 %{c}_done, label %{c}_end, label %{c}_loop",
                  f"{c}_end:"])

  for step in plan.steps:
    out = step.args[0]
    if out.size == 0: continue
    if step.program is None:
      copy(ref(out), ref(step.args[1]), out.nbytes)
      continue
    args = [f"ptr {ref(step.args[g.arg[0]])}" for g in step.program.globals]
    args += ["i64 0", f"i64 {max(step.program.parallel, 1)}"]
    lines.append(f'  call void @"{step.program.name}"({", ".join(args)})')
  for p in plan.outputs:
    if p.size: copy(f"%{p.name}", ref(p.slot), p.size * p.dtype.itemsize)
  return lines + ["  ret void", "}"]
