"""Export: a function of tensors as code that runs without Python or tinychad.

in: `export(fn, example_inputs, target=, out_dir=, weights=, names=, name=)`: a function of Tensors (a
    model's forward), tensors of the shapes and dtypes it will be called with
out: files in out_dir, each written whole or not at all:
  target "c"     <name>.c, <name>.h: `<name>_forward(const float* in, float* out)` (export/c.py)
  target "llvm"  <name>.ll: a module whose `<name>_forward(ptr, ...)` calls one function per kernel (export/llvm.py)
  target "wasm"  <name>.wasm (wasm32 + SIMD128), <name>.js (an ES module: `const m = await load();
                 m.forward(float32Array)`), <name>.d.ts, and the C it was built from (export/wasm.py)
  and for every target <name>.json, the manifest: named inputs and outputs with shapes and dtypes,
  kernel count, scratch and weight bytes; weights="safetensors" also writes <name>.safetensors, which
  the code reads in place (<name>_init) instead of carrying the weights inside it.
The function's kernels are captured from one call and planned ahead (export/plan.py): every size is
fixed, every buffer preallocated, intermediates share memory when their lifetimes don't overlap.
`tinychad.export(...)` is this package called: the package is callable, so its modules stay reachable as
tinychad.export.plan etc. export_c and PORT=1's write_port (export/program.py) write the older
standalone program of one realize.
"""
from __future__ import annotations
import json
import sys
import types
from pathlib import Path
from typing import Callable, Sequence
from tinychad.export.program import export_c, export_source, write_port
from tinychad.export.plan import Plan, capture_plan
from tinychad.export import c as c_target
from tinychad.export.libm import FREESTANDING_MATH
from tinychad.helpers import atomic_write
from tinychad.host import cpu_tuning, host_simd_bytes

TARGETS = ("c", "llvm", "wasm")
WEIGHTS = ("embed", "safetensors")


def export(fn: Callable, example_inputs: Sequence, target: str = "c", out_dir: str | Path = ".",
           weights: str = "embed", names: dict[str, Sequence[str]] | None = None, name: str = "model",
           simd_bytes: int | None = None) -> dict:
  """Write `fn` as code for `target` (see the module docstring); returns the manifest, with "files" added.
  names: {"inputs": [...], "outputs": [...]}, the parameters' names (default input/output, numbered).
  simd_bytes: the SIMD register width the kernels are made for: 16 for aarch64's NEON (or SSE), 32 for
  AVX2, 64 for AVX-512; by default this machine's for C and LLVM IR, and always 16 for WebAssembly's SIMD128."""
  if target not in TARGETS: raise ValueError(f"export: target {target!r} is not one of {TARGETS}")
  if weights not in WEIGHTS: raise ValueError(f"export: weights={weights!r} is not one of {WEIGHTS}")
  names = dict(names or {})
  unknown = set(names) - {"inputs", "outputs"}
  if unknown: raise ValueError(f"export: names has keys {sorted(unknown)}; it takes 'inputs' and 'outputs'")
  if simd_bytes not in (None, 16, 32, 64): raise ValueError(f"export: simd_bytes={simd_bytes} is not 16, 32 or 64")
  if target == "wasm" and simd_bytes not in (None, 16):
    raise ValueError(f"export: WebAssembly's SIMD registers are 16 bytes, not simd_bytes={simd_bytes}")
  simd = 16 if target == "wasm" else simd_bytes or host_simd_bytes()
  # WebAssembly's engines want smaller register tiles than a CPU of the same width (codegen/opt.py's TUNING)
  plan = capture_plan(fn, example_inputs, name, simd, names.get("inputs"), names.get("outputs"),
                      "wasm" if target == "wasm" else cpu_tuning(simd))
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  files: dict[str, bytes] = {}
  if target == "c":
    files[f"{name}.c"] = c_target.render_source(plan, weights, FREESTANDING_MATH).encode()
    files[f"{name}.h"] = c_target.render_header(plan, weights).encode()
  elif target == "llvm":
    from tinychad.export.llvm import render_module
    files[f"{name}.ll"] = render_module(plan, weights).encode()
  else:
    from tinychad.export.wasm import build_wasm
    files.update(build_wasm(plan, weights))
  if weights == "safetensors": files[f"{name}.safetensors"] = c_target.safetensors_bytes(plan)
  manifest = {**plan.manifest(), "target": target, "weights": weights, "simd_bytes": simd}
  manifest["files"] = sorted(files) + [f"{name}.json"]
  files[f"{name}.json"] = (json.dumps(manifest, indent=1) + "\n").encode()
  for filename, data in files.items():
    atomic_write(out / filename, data)
    (out / filename).chmod(0o644)      # files to serve or ship, not private temporaries
  return manifest


class _CallableModule(types.ModuleType):
  """`tinychad.export(...)` calls export(); the module's other names stay attributes."""
  def __call__(self, *args, **kwargs) -> dict: return export(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["export", "export_c", "export_source", "write_port", "Plan", "TARGETS", "WEIGHTS"]
