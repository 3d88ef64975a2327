"""Prototypes of every OpenCL C builtin function that the OPENCL dialect's kernels call (renderer/gpu.py), so
that a program can be compiled without the platform's whole builtin header.

in: the OPENCL dialect (its value types, vector widths) and the op table's C math templates
out: BUILTIN_DECLARATIONS, OpenCL C 1.2 prototypes, each as clang's opencl-c.h declares it (overloadable,
     global pointers only), so calls mangle to the same names the platform's builtin library defines.
Types, `as_<type>` and INFINITY/NAN are not here: they come from opencl-c-base.h, a short header every
platform's compiler includes. runtime/ops_opencl.py uses this on PoCL, test_opencl.py builds a broad set of
kernels with it.
"""
from __future__ import annotations
import re
from tinychad.dtype import dtypes
from tinychad.ops import OP_INFO
from tinychad.renderer.gpu import OPENCL

_OVERLOADABLE = "__attribute__((overloadable))"
_CONST = "__attribute__((overloadable, const))"
_PURE = "__attribute__((overloadable, pure))"
# the float math functions of the op table (`exp2{f}({0})`, `fmod{f}({0}, {1})`) and of the float16 rounding
_MATH_TEMPLATE = re.compile(r"(\w+)\{f\}\((.*)\)")
_HALF_ROUND_MATH = {"fabs": 1, "rint": 1, "copysign": 2}
_VECTOR_WIDTHS = (2, 4, 8, 16)         # GPURenderer.vector_access's vloadN / vstoreN


def _math_functions() -> dict[str, int]:
  """name -> number of arguments, of every float math function a kernel may call."""
  found = dict(_HALF_ROUND_MATH)
  for info in OP_INFO.values():
    template = info.c[dtypes.float32.category] if info.c else None
    if template and (match := _MATH_TEMPLATE.fullmatch(template)): found[match[1]] = match[2].count("{")
  return found


def _declarations() -> str:
  lines = [f"size_t {_CONST} get_{kind}_id(uint);" for kind in ("global", "local", "group")]
  lines.append("void __attribute__((overloadable, convergent)) barrier(cl_mem_fence_flags);")
  lines.append(f"float {_PURE} vload_half(size_t, const __global half*);")
  lines.append(f"void {_OVERLOADABLE} vstore_half_rte(float, size_t, __global half*);")
  for name, arity in _math_functions().items():
    lines += [f"{t} {_CONST} {name}({', '.join([t] * arity)});" for t in ("float", "double")]
  vector_types = sorted({name for dtype, name in OPENCL.types.items() if dtype not in (dtypes.bool, dtypes.float16)})
  for t in vector_types:
    for n in _VECTOR_WIDTHS:
      lines.append(f"{t}{n} {_PURE} vload{n}(size_t, const __global {t}*);")
      lines.append(f"void {_OVERLOADABLE} vstore{n}({t}{n}, size_t, __global {t}*);")
  return "\n".join(lines) + "\n"


BUILTIN_DECLARATIONS = _declarations()
