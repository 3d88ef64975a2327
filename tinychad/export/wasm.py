"""A Plan as WebAssembly: a .wasm (wasm32, SIMD128) and an ES-module loader for browsers and Node.js.

in: a Plan lowered for 16-byte SIMD (export/plan.py), weights "embed" or "safetensors"
out: {filename: bytes}: <name>.wasm, <name>.js, <name>.d.ts and <name>.wasm.c (the C it was built from)
Route: the C target (export/c.py) compiled by clang-14 --target=wasm32 -msimd128 and linked by wasm-ld
(Debian's clang-14 and lld-14). The C renderer already writes every kernel with GCC vector extensions,
which clang maps onto SIMD128's v128 once the kernels are lowered for 16-byte registers; so the wasm
build shares the renderer, its tests and its semantics with the CPU device, and needs no new code
generator. (llvmlite's LLVM could emit a wasm object too, but its Python wheel carries no wasm-ld and
the IR path would bring nothing the C path lacks.) There is no libc: -DTINYCHAD_FREESTANDING swaps
<math.h> for export/libm.py's functions, -mbulk-memory turns memcpy into memory.copy, and nothing
else is imported, so the module instantiates with an empty import object.
The C is wrapped by a few exports for the loader: static input and output buffers (tc_input(i),
tc_output(i)), tc_run() running <name>_forward on them, and with weights="safetensors" a static area
the loader copies the weights file into (tc_weights()) before <name>_init reads it in place.
`load(wasm?, weights?)` takes a URL, path, ArrayBuffer or typed array for each; with none it reads
<name>.wasm (and the weights file) next to <name>.js: from disk in Node.js, with fetch in a browser.
"""
from __future__ import annotations
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from tinychad.dtype import dtypes
from tinychad.export.c import render_source, safetensors_bytes
from tinychad.export.libm import FREESTANDING_MATH
from tinychad.export.plan import Plan

STACK_BYTES = 1 << 20
JS_ARRAYS = {"float32": "Float32Array", "float64": "Float64Array", "int32": "Int32Array", "int16": "Int16Array",
             "int8": "Int8Array", "uint8": "Uint8Array", "bool": "Uint8Array", "int64": "BigInt64Array"}


def tool(names: tuple[str, ...], package: str) -> str:
  for name in names:
    found = shutil.which(name) or (name if os.path.isabs(name) and os.access(name, os.X_OK) else None)
    if found: return found
  raise RuntimeError(f"export: target 'wasm' needs {names[0]} (Debian: apt-get install {package}); "
                     f"none of {names} is on PATH")


def clang() -> str: return tool((os.getenv("WASM_CC", "clang-14"), "clang-14", "clang"), "clang-14")
def wasm_ld() -> str:
  return tool((os.getenv("WASM_LD", "wasm-ld-14"), "wasm-ld-14", "wasm-ld", "/usr/lib/llvm-14/bin/wasm-ld"), "lld-14")


def _glue(plan: Plan, weight_bytes: int) -> str:
  lines = ["/* the loader's side: parameter buffers in linear memory, and one call that runs the model */"]
  for kind, params in (("in", plan.inputs), ("out", plan.outputs)):
    for i, p in enumerate(params):
      lines.append(f"static {p.dtype.c_name} tc_{kind}{i}[{max(p.size, 1)}] __attribute__((aligned(64)));")
    cases = " ".join(f"case {i}: return tc_{kind}{i};" for i in range(len(params)))
    lines.append(f"void* tc_{kind}put(int i) {{ switch (i) {{ {cases} }} return 0; }}")   # tc_input, tc_output
  if weight_bytes:
    lines.append(f"static unsigned char tc_weight_file[{weight_bytes}] __attribute__((aligned(64)));")
    lines.append("void* tc_weights(void) { return tc_weight_file; }")
  args = [f"tc_in{i}" for i in range(len(plan.inputs))] + [f"tc_out{i}" for i in range(len(plan.outputs))]
  lines.append(f"void tc_run(void) {{ {plan.name}_forward({', '.join(args)}); }}")
  return "\n".join(lines) + "\n"


def compile_wasm(source: str, exports: list[str]) -> bytes:
  """The .wasm of a freestanding C source exporting `exports` (and its memory)."""
  with tempfile.TemporaryDirectory(prefix="tinychad-wasm-") as tmp:
    c, obj, out = Path(tmp) / "model.c", Path(tmp) / "model.o", Path(tmp) / "model.wasm"
    c.write_text(source)
    steps = [[clang(), "--target=wasm32", "-O2", "-msimd128", "-mbulk-memory", "-ffreestanding", "-nostdlib",
              "-DTINYCHAD_FREESTANDING", "-ffp-contract=off", "-c", str(c), "-o", str(obj)],
             [wasm_ld(), "--no-entry", "--strip-all", f"-zstack-size={STACK_BYTES}",
              *[f"--export={e}" for e in exports], str(obj), "-o", str(out)]]
    for cmd in steps:
      result = subprocess.run(cmd, capture_output=True, text=True)
      if result.returncode != 0:
        raise RuntimeError(f"export: {Path(cmd[0]).name} failed on the exported C ({result.returncode}):\n"
                           f"{result.stderr[-3000:]}")
    return out.read_bytes()


def build_wasm(plan: Plan, weights: str) -> dict[str, bytes]:
  for step in plan.steps:
    used = {u.dtype for u in step.program.uops} if step.program is not None else {step.args[0].dtype}
    if dtypes.float16 in used | {slot.dtype for slot in step.args}:
      name = step.program.name if step.program is not None else "a copy"
      raise ValueError(f"export: target 'wasm' has no float16 (clang's wasm32 has no _Float16), and kernel {name} "
                       "computes in it; cast the model to float32 first")
  for p in plan.inputs + plan.outputs:
    if p.dtype == dtypes.float16: raise ValueError(f"export: target 'wasm' has no float16, and {p.name} is float16")
  weight_bytes = len(safetensors_bytes(plan)) if weights == "safetensors" else 0
  source = render_source(plan, weights, FREESTANDING_MATH) + _glue(plan, weight_bytes)
  exports = [f"{plan.name}_init", "tc_input", "tc_output", "tc_run"] + (["tc_weights"] if weight_bytes else [])
  wasm = compile_wasm(source, exports)
  name = plan.name
  return {f"{name}.wasm": wasm, f"{name}.wasm.c": source.encode(),
          f"{name}.js": loader_js(plan, weights, weight_bytes).encode(), f"{name}.d.ts": loader_dts(plan).encode()}


def loader_js(plan: Plan, weights: str, weight_bytes: int) -> str:
  manifest = {"name": plan.name, "inputs": [p.manifest() for p in plan.inputs],
              "outputs": [p.manifest() for p in plan.outputs]}
  weights_file = json.dumps(f"{plan.name}.safetensors" if weights == "safetensors" else None)
  return f"""// {plan.name}.js: the model exported by tinychad, as an ES module for browsers and Node.js.
//   import {{ load }} from "./{plan.name}.js";
//   const m = await load();            // reads {plan.name}.wasm next to this file (fetch in a browser, disk in Node.js)
//   const out = m.forward(input);      // typed arrays in, a typed array out (an array of them for several outputs)
export const manifest = {json.dumps(manifest)};
const WASM_FILE = "{plan.name}.wasm";
const WEIGHTS_FILE = {weights_file};
const WEIGHT_BYTES = {weight_bytes};
const ARRAYS = {{ float32: Float32Array, float64: Float64Array, int32: Int32Array, int16: Int16Array, int8: Int8Array,
  uint8: Uint8Array, bool: Uint8Array, int64: BigInt64Array }};
const isNode = typeof process !== "undefined" && process.versions != null && process.versions.node != null;

async function bytesOf(source, fallback) {{
  if (source instanceof ArrayBuffer) return source;
  if (ArrayBuffer.isView(source)) return source.buffer.slice(source.byteOffset, source.byteOffset + source.byteLength);
  const url = source === undefined ? new URL(fallback, import.meta.url)
    : new URL(source, isNode ? new URL(`file://${{process.cwd()}}/`)
                             : (globalThis.location ? globalThis.location.href : import.meta.url));
  if (isNode && url.protocol === "file:") {{
    const {{ readFile }} = await import("node:fs/promises");
    const b = await readFile(url);
    return b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength);
  }}
  const response = await fetch(url);
  if (!response.ok) throw new Error(`{plan.name}.js: fetching ${{url}} failed: HTTP ${{response.status}}`);
  return await response.arrayBuffer();
}}

export async function load(wasm, weights) {{
  const {{ instance }} = await WebAssembly.instantiate(await bytesOf(wasm, WASM_FILE), {{}});
  const e = instance.exports;
  let init = 0;
  if (WEIGHTS_FILE !== null) {{
    const file = new Uint8Array(await bytesOf(weights, WEIGHTS_FILE));
    if (file.length !== WEIGHT_BYTES)
      throw new Error(`{plan.name}.js: the weights file has ${{file.length}} bytes; this model's has ${{WEIGHT_BYTES}}`);
    new Uint8Array(e.memory.buffer, e.tc_weights(), file.length).set(file);
    init = e.tc_weights();
  }}
  if (e.{plan.name}_init(init) !== 0)
    throw new Error("{plan.name}.js: the weights file is not the one exported with this model");
  const view = (p, address) => new ARRAYS[p.dtype](e.memory.buffer, address, p.size);
  function forward(...inputs) {{
    if (inputs.length !== manifest.inputs.length)
      throw new TypeError(`{plan.name}.forward takes ${{manifest.inputs.length}} inputs `
        + `(${{manifest.inputs.map(p => p.name).join(", ")}}), got ${{inputs.length}}`);
    manifest.inputs.forEach((p, i) => {{
      const x = inputs[i];
      if (x == null || x.length !== p.size)
        throw new RangeError(`{plan.name}.forward: input ${{p.name}} needs ${{p.size}} ${{p.dtype}} values `
          + `(shape [${{p.shape}}]), got ${{x == null ? x : x.length}}`);
      view(p, e.tc_input(i)).set(x);
    }});
    e.tc_run();
    const outs = manifest.outputs.map((p, i) => view(p, e.tc_output(i)).slice());
    return outs.length === 1 ? outs[0] : outs;
  }}
  return {{ forward, manifest, exports: e }};
}}
"""


def loader_dts(plan: Plan) -> str:
  def ts(p) -> str: return JS_ARRAYS[p.dtype.name]
  element = lambda p: "bigint" if p.dtype == dtypes.int64 else "number"
  params = ", ".join(f"{p.name}: {ts(p)} | ArrayLike<{element(p)}>" for p in plan.inputs)
  outs = [ts(p) for p in plan.outputs]
  result = outs[0] if len(outs) == 1 else f"[{', '.join(outs)}]"
  shapes = "; ".join(f"{p.name}: {p.dtype.name} [{', '.join(map(str, p.shape))}]" for p in plan.inputs + plan.outputs)
  return f"""// {plan.name}.d.ts: types of {plan.name}.js ({shapes})
export interface Param {{ name: string; shape: number[]; dtype: string; size: number }}
export declare const manifest: {{ name: string; inputs: Param[]; outputs: Param[] }};
export interface Model {{
  forward({params}): {result};
  manifest: typeof manifest;
  exports: WebAssembly.Exports;
}}
type Source = string | URL | ArrayBuffer | ArrayBufferView;
export declare function load(wasm?: Source, weights?: Source): Promise<Model>;
"""
