"""The generic strided copy: a kernel that only moves data (codegen/copy.py's CopyPlan) run by one function
compiled once, its geometry passed as data, so a new shape costs no compile.

in: a CopyPlan (codegen/copy.py) and the number of input buffers of its kernel
out: a Kernel (runtime/compiled.py) whose one constant argument, after the buffers, is the plan's geometry as
     int64s: itemsize, elements, zero_all, the boxes' count, the pieces, then per box its buffer number (0: a box
     of zeros), source and output offsets, dimension count and (count, source stride, output stride) per dimension
Its parallel loop is over pieces: piece i copies the i'th part of every source's outermost dimension, so the
thread pool splits a big copy as it splits a compiled kernel's loop. Each innermost run is one memcpy (a plan's
innermost dimension runs along both buffers).
"""
from __future__ import annotations
import ctypes
from typing import Any
from tinychad.runtime.cc import helper_library
from tinychad.runtime.compiled import Kernel, kernel_function
from tinychad.runtime.threads import MIN_PARALLEL_WORK, POOL_MAX_ARGS, c_array

MAX_INPUTS = POOL_MAX_ARGS - 2      # the output and the geometry take two of the pool's argument slots
PIECES = 16                         # a big copy's parallel extent: the thread pool splits it as a kernel's loop


def _entry_points() -> str:
  """tc_copy_<n> for n inputs: each the signature the thread pool calls a kernel of n + 2 pointers with."""
  out = []
  for n in range(1, MAX_INPUTS + 1):
    params = ", ".join(f"char* s{i}" for i in range(1, n + 1))
    sources = ", ".join(f"s{i}" for i in range(1, n + 1))
    out.append(f"void tc_copy_{n}(char* out, {params}, const long long* p, long long start, long long end) {{\n"
               f"  char* sources[] = {{0, {sources}}};\n  copy(out, sources, p, start, end);\n}}")
  return "\n".join(out)


COPY_SOURCE = """#include <string.h>

// the box of dims[0..nd) (count, source stride, output stride, in elements), outermost first; its innermost
// dimension runs along both buffers (codegen/copy.py), so it is one memcpy
static void copy_box(char* out, const char* src, const long long* dims, int nd, long long size) {
  long long count = dims[0], src_step = dims[1] * size, out_step = dims[2] * size;
  if (nd == 1) { memcpy(out, src, count * size); return; }
  for (long long i = 0; i < count; i++) copy_box(out + i * out_step, src + i * src_step, dims + 3, nd - 1, size);
}

// zeros over the box of dims[0..nd), as copy_box's output side
static void zero_box(char* out, const long long* dims, int nd, long long size) {
  long long count = dims[0], out_step = dims[2] * size;
  if (nd == 1 && out_step == size) { memset(out, 0, count * size); return; }
  for (long long i = 0; i < count; i++) {
    if (nd == 1) memset(out + i * out_step, 0, size);
    else zero_box(out + i * out_step, dims + 3, nd - 1, size);
  }
}

// pieces [start, end) of p[4] (the parallel extent): piece i does the i'th part of each box's outermost dimension
static void copy(char* out, char** sources, const long long* p, long long start, long long end) {
  long long size = p[0], elements = p[1], zero_all = p[2], count = p[3], pieces = p[4];
  if (zero_all) memset(out, 0, elements * size);     // only with one piece: see copy_kernel
  p += 5;
  for (long long s = 0; s < count; s++) {
    long long buffer = p[0], src_offset = p[1], out_offset = p[2], nd = p[3];
    long long rows = p[4], lo = rows * start / pieces, hi = rows * end / pieces;
    long long dims[3 * nd];
    memcpy(dims, p + 4, sizeof(dims));
    dims[0] = hi - lo;
    char* to = out + (out_offset + lo * p[6]) * size;
    if (hi > lo && buffer == 0) zero_box(to, dims, (int)nd, size);
    else if (hi > lo) copy_box(to, sources[buffer] + (src_offset + lo * p[5]) * size, dims, (int)nd, size);
    p += 4 + 3 * nd;
  }
}

%ENTRY_POINTS%
""".replace("%ENTRY_POINTS%", _entry_points())


def geometry(plan: Any, pieces: int) -> list[int]:
  """A codegen/copy.py CopyPlan as the int64s the function reads (module docstring); a device imports no codegen,
  so the plan comes as it is, from engine/realize.py."""
  out = [plan.itemsize, plan.elements, int(plan.zero_all), len(plan.sources), pieces]
  for source in plan.sources:
    out += [source.buffer, source.source_offset, source.output_offset, len(source.dims)]
    for dim in source.dims: out += list(dim)
  return out


def copy_kernel(plan: Any, inputs: int) -> Kernel | None:
  """The generic copy for a kernel of `inputs` input buffers, or None (no C compiler, or too many inputs)."""
  if not 1 <= inputs <= MAX_INPUTS or (library := helper_library(COPY_SOURCE, "generic copy")) is None: return None
  # a copy that zeroes its whole output first runs in one piece, so no piece can zero another's copied rows
  pieces = PIECES if not plan.zero_all and plan.elements >= MIN_PARALLEL_WORK else 1
  numbers = geometry(plan, pieces)
  params = c_array(ctypes.c_longlong, numbers)
  address = ctypes.cast(getattr(library, f"tc_copy_{inputs}"), ctypes.c_void_p).value
  fn = kernel_function(address, inputs + 2)
  # the Kernel holds the geometry (its owner) as long as anything can run it
  return Kernel(fn, pieces, address, (library, params), (ctypes.addressof(params),))
