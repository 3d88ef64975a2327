"""A Plan as C: one .c and one .h, depending on nothing but libm (and on nothing at all when built with
-DTINYCHAD_FREESTANDING, as the WebAssembly build is: export/libm.py then defines the math it calls).

in: a Plan (export/plan.py), weights "embed" or "safetensors"
out: the source of `<name>.c`: every kernel as a static function (the CPU device's renderer), the
     weights as const arrays (or pointers into a safetensors file given to <name>_init), one static arena
     holding every intermediate buffer at its planned offset, and
       int <name>_init(const void* weights);         0 when ready (embedded weights: pass NULL)
       void <name>_forward(const T* in0, ..., T* out0, ...);
     which runs the kernels in order on one thread (not reentrant: the arena is shared); and `<name>.h`
     declaring them with each parameter's shape and element count.
Vector types are GCC/clang vector extensions, which any target compiles (as narrower vectors or lanes
where it has no such registers); the x86 streaming stores are under #ifdef __AVX__, so `cc -O2` builds
it anywhere and -march= only makes it faster.
"""
from __future__ import annotations
import json
import numpy as np
from tinychad.dtype import DType
from tinychad.export.plan import Plan, Slot
from tinychad.renderer.cstyle import CRenderer, render_const

VALUES_PER_LINE = 8


def c_array(name: str, data: np.ndarray, dtype: DType, const: bool) -> str:
  """A C array holding `data` exactly (the kernels' own literals: NaN and inf included), 64-byte aligned."""
  values = [render_const(v, dtype) for v in data.reshape(-1).tolist()] or ["0"]
  rows = [", ".join(values[i:i + VALUES_PER_LINE]) for i in range(0, len(values), VALUES_PER_LINE)]
  body = ",\n  ".join(rows)
  qualifier = "const " if const else ""
  return f"static {qualifier}{dtype.c_name} {name}[{len(values)}] __attribute__((aligned(64))) = {{\n  {body}\n}};"


def safetensors_layout(plan: Plan) -> tuple[int, list[tuple[Slot, int]]]:
  """Where each weight sits in the exported safetensors file: (header bytes, [(weight, data offset)]).
  Widest elements first, so each is aligned to its size, and the header padded with spaces so the data
  starts at a multiple of 64: the code reads the weights in place."""
  order = sorted(plan.weights, key=lambda w: -w.dtype.itemsize)
  offsets, at = [], 0
  for w in order:
    offsets.append((w, at))
    at += w.size * w.dtype.itemsize
  header = safetensors_header(offsets)
  return len(header), offsets


_ST_DTYPES = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
              "float16": "F16", "float32": "F32", "float64": "F64"}


def safetensors_header(offsets: list[tuple[Slot, int]]) -> bytes:
  """The JSON header naming each weight (w0, w1, ...) with its dtype, flat shape and byte range."""
  meta = {w.name: {"dtype": _ST_DTYPES[w.dtype.name], "shape": [w.size],
                   "data_offsets": [at, at + w.size * w.dtype.itemsize]} for w, at in offsets}
  text = json.dumps({"__metadata__": {"format": "tinychad-export"}, **meta}, separators=(",", ":")).encode()
  return text + b" " * ((-(8 + len(text))) % 64)


def safetensors_bytes(plan: Plan) -> bytes:
  """The weights file: the safetensors format (header length, JSON header, data), laid out as above."""
  _, offsets = safetensors_layout(plan)
  header = safetensors_header(offsets)
  parts = [len(header).to_bytes(8, "little"), header]
  parts += [np.ascontiguousarray(w.data).view(np.uint8).tobytes() for w, _ in offsets]
  return b"".join(parts)


# Each kernel stays a function of its own. Inlined into <name>_forward, the kernels make one huge function
# that V8 compiles badly (the MNIST CNN at batch 64 in Node.js: 221 ms inlined, 70-90 ms not). gcc also
# gets no interprocedural liberties (noipa): gcc 12's aarch64 build, specializing each kernel for its one
# call (IPA constant propagation), computed wrong probabilities for the MNIST CNN under qemu, where
# -fno-ipa-cp, -O1 and clang were right.
KERNEL_MACRO = """#if defined(__GNUC__) && !defined(__clang__)
#define TC_KERNEL static __attribute__((noipa))
#else
#define TC_KERNEL static __attribute__((noinline))
#endif"""


def slot_ref(plan: Plan, slot: Slot) -> str:
  """The C expression of a buffer's address."""
  if slot.kind == "scratch": return f"(({slot.dtype.c_name}*)({plan.name}_arena + {slot.offset}))"
  return slot.name


def kernel_functions(plan: Plan) -> tuple[list[str], list[str], list[str]]:
  """(typedefs, helpers, functions) of every kernel of the plan, rendered once each."""
  typedefs: dict[str, str] = {}
  helpers: dict[str, str] = {}
  functions = []
  for step in plan.steps:
    if step.program is None or step.args[0].size == 0: continue
    try:
      renderer = CRenderer(step.program)
      functions.append("TC_KERNEL " + renderer.render_function())
    except NotImplementedError as e:
      raise ValueError(f"export: kernel {step.program.name} can't be written as C: {e}") from e
    typedefs.update(renderer.typedefs)
    helpers.update(renderer.helpers)
  return list(typedefs.values()), list(helpers.values()), functions


def forward_body(plan: Plan) -> list[str]:
  """The statements of <name>_forward: the kernel calls and copies, then each output copied out."""
  lines = []
  for step in plan.steps:
    out = step.args[0]
    if out.size == 0: continue
    if step.program is None:
      lines.append(f"  __builtin_memcpy({slot_ref(plan, out)}, {slot_ref(plan, step.args[1])}, {out.nbytes});")
      continue
    args = [slot_ref(plan, step.args[g.arg[0]]) for g in step.program.globals]
    # the kernel's whole parallel loop, on this thread
    lines.append(f"  {step.program.name}({', '.join(args)}, 0, {max(step.program.parallel, 1)});")
  for p in plan.outputs:
    if p.size: lines.append(f"  __builtin_memcpy({p.name}, {slot_ref(plan, p.slot)}, {p.size * p.dtype.itemsize});")
  return lines


def signature(plan: Plan, restrict: bool = True) -> str:
  r = " restrict" if restrict else ""
  params = [f"const {p.dtype.c_name}*{r} {p.name}" for p in plan.inputs]
  params += [f"{p.dtype.c_name}*{r} {p.name}" for p in plan.outputs]
  return f"void {plan.name}_forward({', '.join(params) or 'void'})"


def render_source(plan: Plan, weights: str, freestanding_math: str) -> str:
  """<name>.c (see the module docstring)."""
  typedefs, helpers, functions = kernel_functions(plan)
  data = []
  if weights == "embed":
    data += [c_array(w.name, w.data, w.dtype, const=True) for w in plan.weights]
    init = [f"int {plan.name}_init(const void* weights) {{ (void)weights; return 0; }}"]
  else:
    header_bytes, offsets = safetensors_layout(plan)
    data += [f"static const {w.dtype.c_name}* {w.name};" for w in plan.weights]
    base = 8 + header_bytes
    init = [f"int {plan.name}_init(const void* weights) {{",
            "  const unsigned char* file = (const unsigned char*)weights;",
            "  unsigned long long header = 0;",
            "  if (!file) return -1;",
            "  for (int i = 7; i >= 0; i--) header = header << 8 | file[i];",
            f"  if (header != {header_bytes}ULL) return -1;   /* not the file exported with this code */"]
    init += [f"  {w.name} = (const {w.dtype.c_name}*)(file + {base + at});" for w, at in offsets]
    init += ["  return 0;", "}"]
  data.append(f"static unsigned char {plan.name}_arena[{max(plan.arena_bytes, 1)}] __attribute__((aligned(64)));")
  head = [f"/* {plan.name}.c: exported by tinychad ({len(functions)} kernels, {plan.arena_bytes} bytes of scratch). */",
          "#ifdef TINYCHAD_FREESTANDING", freestanding_math.rstrip(), "#else", "#include <math.h>", "#endif",
          KERNEL_MACRO]
  forward = [signature(plan) + " {", *forward_body(plan), "}"]
  return "\n".join(head + typedefs + helpers + data + functions + init + forward) + "\n"


def render_header(plan: Plan, weights: str) -> str:
  """<name>.h: the entry points, with the shapes of their parameters."""
  upper = plan.name.upper()
  lines = [f"/* {plan.name}.h: the function exported by tinychad. Call {plan.name}_init once ("
           + ("NULL: the weights are in the code" if weights == "embed" else
              f"the bytes of {plan.name}.safetensors, kept alive, 8-byte aligned") + "), then",
           f"   {plan.name}_forward as often as needed (one call at a time: it shares one scratch arena).", ""]
  for kind, params in (("input", plan.inputs), ("output", plan.outputs)):
    for p in params: lines.append(f"   {kind} {p.name}: {p.dtype.name} {list(p.shape)} ({p.size} elements)")
  lines += ["*/", f"#ifndef {upper}_H", f"#define {upper}_H", "#ifdef __cplusplus", 'extern "C" {', "#endif"]
  for p in plan.inputs + plan.outputs: lines.append(f"#define {upper}_{p.name.upper()}_SIZE {p.size}")
  lines += [f"int {plan.name}_init(const void* weights);", signature(plan, restrict=False) + ";",
            "#ifdef __cplusplus", "}", "#endif", "#endif"]
  return "\n".join(lines) + "\n"
