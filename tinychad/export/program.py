"""The kernels of one realize as a standalone C program with a main() (the seed's PORT=1, and export_c).

in: the tensors to compute, and optionally realized tensors that become the program's inputs
out: C99 source holding every kernel of their schedule (the CPU device's own lowering and renderer),
     the data of every other buffer the kernels read (weights, constants) as arrays, a function
       void tinychad_forward(const T* input0, ..., T* output0, ...)
     that runs the kernels in order on one thread, and a main() that runs it on the inputs' current
     values and prints every output element, one per line (-DTINYCHAD_NO_MAIN leaves main out, to
     link the model into another program). Build: cc -O2 -march=native model.c -lm
`PORT=1` writes this program for every realize, before running it, to $PORT_FILE (default
tinychad_port.c): the seed's PORT=1 wrote its LLVM module to a file the same way.
"""
from __future__ import annotations
import dataclasses
import os
from pathlib import Path
import numpy as np
from tinychad.codegen import lower_item
from tinychad.dtype import DType
from tinychad.helpers import atomic_write
from tinychad.engine.schedule import ScheduleItem, create_schedule
from tinychad.lazy import LazyBuffer
from tinychad.ops import LoadOps
from tinychad.renderer.cstyle import CRenderer, render_const

VALUES_PER_LINE = 8


def _array(name: str, data: np.ndarray, dtype: DType, const: bool) -> str:
  # the kernels' own literals: exact in the dtype, NaN and inf included
  values = [render_const(v, dtype) for v in data.reshape(-1).tolist()] or ["0"]
  rows = [", ".join(values[i:i + VALUES_PER_LINE]) for i in range(0, len(values), VALUES_PER_LINE)]
  body = ",\n  ".join(rows)
  return f"static {'const ' if const else ''}{dtype.c_name} {name}[{len(values)}] = {{\n  {body}\n}};"


def _print_line(name: str, dtype: DType) -> str:
  if dtype.is_float: return f'printf("%.9g\\n", (double){name}[i]);'
  return f'printf("%lld\\n", (long long){name}[i]);'


class _Program:
  """Collects the pieces of the exported source while walking the schedule."""
  def __init__(self, inputs: list[LazyBuffer]):
    self.names: dict[LazyBuffer, str] = {x: f"input{i}" for i, x in enumerate(inputs)}
    self.placed: dict[LazyBuffer, tuple[str, int]] = {}   # a cat's piece: (the array it lies in, its element offset)
    self.data: list[str] = []          # arrays: embedded data, then scratch buffers
    self.functions: list[str] = []     # one C function per kernel
    self.calls: list[str] = []         # the body of tinychad_forward
    self.typedefs: dict[str, str] = {}
    self.helpers: dict[str, str] = {}

  def buffer(self, base: LazyBuffer) -> str:
    """The C name of a buffer a kernel reads: an input, an earlier kernel's output or embedded data."""
    if base not in self.names:
      if base.realized is None: raise ValueError(f"export: buffer {base.shape} {base.dtype} is neither computed nor realized")
      self.names[base] = f"data{len(self.names)}"
      self.data.append(_array(self.names[base], base.realized.as_numpy(), base.dtype, const=True))
    return self.names[base]

  def item(self, number: int, item: ScheduleItem) -> None:
    out = item.output
    name = self.names[out] = f"buf{number}"
    if item.ast.op is LoadOps.COPY:
      # a copy from another device: its source exists now, so the copy is data
      self.data.append(_array(name, item.inputs[0].realized.as_numpy(), out.dtype, const=False))
      return
    if item.into is not None:
      # a cat's piece, written in place: a pointer into the array the cat lies in
      cat, start = item.into
      array, offset = self.placed.get(cat, (self.names[cat], 0))
      self.placed[out] = (array, offset + start)
      self.data.append(f"static {out.dtype.c_name}* const {name} = {array} + {offset + start};")
    else:
      # aligned as tinychad's own buffers are: a kernel's SIMD and streaming stores assume it
      self.data.append(f"static {out.dtype.c_name} {name}[{max(out.size, 1)}] __attribute__((aligned(64)));")
    if not item.is_kernel or out.size == 0: return
    program = lower_item(item)
    program = dataclasses.replace(program, name=f"k{number}_{program.name}")
    renderer = CRenderer(program)
    self.functions.append(renderer.render_function())
    self.typedefs.update(renderer.typedefs)
    self.helpers.update(renderer.helpers)
    args = [name if g.arg[0] == 0 else self.buffer(item.inputs[g.arg[0] - 1]) for g in program.globals]
    # every call runs the kernel's whole parallel loop on this thread
    self.calls.append(f"  {program.name}({', '.join(args)}, 0, {max(program.parallel, 1)});")


def export_source(outputs: list[LazyBuffer], items: list[ScheduleItem], inputs: list[LazyBuffer] = ()) -> str:
  """The program computing the bases of `outputs` with the schedule `items` (see the module docstring)."""
  bases = [out.base for out in outputs]
  inputs = [x.base for x in inputs]
  for x in inputs:
    if x.realized is None: raise ValueError(f"export: input {x.shape} {x.dtype} must be realized first")
  prog = _Program(inputs)
  for number, item in enumerate(items): prog.item(number, item)
  params = [f"const {x.dtype.c_name}* restrict input{i}" for i, x in enumerate(inputs)]
  params += [f"{x.dtype.c_name}* restrict output{i}" for i, x in enumerate(bases)]
  copies = [f"  memcpy(output{i}, {prog.buffer(x)}, {x.size * x.dtype.itemsize});" for i, x in enumerate(bases)]
  forward = [f"void tinychad_forward({', '.join(params) or 'void'}) {{", *prog.calls, *copies, "}"]
  examples = [_array(f"example{i}", x.realized.as_numpy(), x.dtype, const=True) for i, x in enumerate(inputs)]
  main = ["#ifndef TINYCHAD_NO_MAIN", *examples]
  main += [f"static {x.dtype.c_name} result{i}[{max(x.size, 1)}];" for i, x in enumerate(bases)]
  args = [f"example{i}" for i in range(len(inputs))] + [f"result{i}" for i in range(len(bases))]
  main += ["int main(void) {", f"  tinychad_forward({', '.join(args)});"]
  main += [f"  for (long long i = 0; i < {x.size}; i++) {_print_line(f'result{i}', x.dtype)}" for i, x in enumerate(bases)]
  main += ["  return 0;", "}", "#endif"]
  head = ["/* exported by tinychad: every kernel of one realize, its data, and the function running them */",
          "#include <math.h>", "#include <stdio.h>", "#include <string.h>"]
  parts = head + list(prog.typedefs.values()) + list(prog.helpers.values()) + prog.data + prog.functions + forward + main
  return "\n".join(parts) + "\n"


def export_c(outputs, inputs=(), path: str | Path | None = None) -> str:
  """C source of a standalone program computing `outputs` (Tensors) from `inputs` (realized Tensors,
  which become tinychad_forward's parameters; everything else is embedded). Written to `path` (whole or
  not at all) when given. Tensors are taken by their `.lazydata`: this module sits below the front end."""
  outputs = [outputs] if hasattr(outputs, "lazydata") else list(outputs)
  # the program's outputs are whole buffers in row-major order, as numpy() shows them
  outs = [t.contiguous().lazydata for t in outputs]
  source = export_source(outs, create_schedule(outs), [t.lazydata for t in inputs])
  if path is not None: atomic_write(path, source.encode())
  return source


def write_port(outs: list[LazyBuffer], items: list[ScheduleItem]) -> Path:
  """PORT=1: the program of this realize, written to $PORT_FILE."""
  path = Path(os.getenv("PORT_FILE", "tinychad_port.c"))
  atomic_write(path, export_source(outs, items).encode())
  kernels = sum(1 for item in items if item.is_kernel)
  print(f"port: wrote {path} ({kernels} kernels, {len(outs)} outputs)")
  return path
