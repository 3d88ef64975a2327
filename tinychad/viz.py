"""Graph pictures: the lazy graph and the kernel graph as Graphviz files (GRAPH=1).

in: the LazyBuffers being realized and their schedule
out: `<dir>/realize_<n>_lazy.dot` and `..._kernels.dot` (and .svg next to them when Graphviz's `dot`
is installed), in GRAPH_DIR or the system temp dir. Open the .svg in a browser to follow a tensor.
"""
from __future__ import annotations
import os
import shutil
import subprocess
import tempfile
from tinychad.helpers import atomic_write
from tinychad.lazy import LazyBuffer

_counter = 0


def _label(lb: LazyBuffer) -> str:
  op = "realized" if lb.realized is not None else lb.op.name
  return f"{op}\\n{lb.shape} {lb.dtype.name}"


def lazy_graph_dot(outs: list[LazyBuffer]) -> str:
  """One node per base buffer; edges are labelled with the view when the read isn't plain."""
  lines, seen, stack = ["digraph lazy {", "  node [shape=box, fontname=monospace];"], set(), [o.base for o in outs]
  while stack:
    base = stack.pop()
    if id(base) in seen: continue
    seen.add(id(base))
    color = "lightblue" if base.realized is not None else "white"
    lines.append(f'  n{id(base)} [label="{_label(base)}", style=filled, fillcolor={color}];')
    for src in base.srcs:
      view = "" if src.st.contiguous and src.shape == src.base.shape else f' [label="view {src.shape}"]'
      lines.append(f"  n{id(src.base)} -> n{id(base)}{view};")
      stack.append(src.base)
  return "\n".join(lines + ["}"])


def kernel_graph_dot(items: list) -> str:
  """One node per kernel, edges where a kernel reads another's output."""
  lines = ["digraph kernels {", "  node [shape=box, fontname=monospace];"]
  producer = {}
  for number, item in enumerate(items):
    lines.append(f'  k{number} [label="{item.name}\\n-> {item.output.shape} {item.output.dtype.name}"];')
    producer[id(item.output)] = number
    for inp in item.inputs:
      if id(inp) in producer: lines.append(f"  k{producer[id(inp)]} -> k{number};")
      else:
        lines.append(f'  b{id(inp)} [label="buffer {inp.shape}", shape=ellipse];')
        lines.append(f"  b{id(inp)} -> k{number};")
  return "\n".join(lines + ["}"])


def save_graphs(outs: list[LazyBuffer], items: list) -> list[str]:
  """Write both graphs for one realize; returns the paths written."""
  global _counter
  _counter += 1
  directory = os.getenv("GRAPH_DIR") or os.path.join(tempfile.gettempdir(), "tinychad_graphs")
  os.makedirs(directory, exist_ok=True)
  written = []
  for kind, text in (("lazy", lazy_graph_dot(outs)), ("kernels", kernel_graph_dot(items))):
    path = os.path.join(directory, f"realize_{_counter}_{kind}.dot")
    atomic_write(path, text.encode())
    written.append(path)
    if shutil.which("dot"):
      subprocess.run(["dot", "-Tsvg", path, "-o", path[:-4] + ".svg"], check=False, capture_output=True)
      written.append(path[:-4] + ".svg")
  return written
