"""GRAPH=1 writes the lazy graph and the kernel graph as Graphviz files."""
from __future__ import annotations
import os
import subprocess
import sys


def test_graph_flag_writes_dot_files(tmp_path):
  code = "from tinychad import Tensor\nx = Tensor.randn(4, 4)\nprint(x.softmax(1).numpy().shape)"
  env = {**os.environ, "GRAPH": "1", "GRAPH_DIR": str(tmp_path)}
  result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  lazy = (tmp_path / "realize_1_lazy.dot").read_text()
  kernels = (tmp_path / "realize_1_kernels.dot").read_text()
  assert lazy.startswith("digraph lazy") and "MAX" in lazy and "SUM" in lazy
  assert kernels.startswith("digraph kernels") and kernels.count("label=\"r_") == 2 and "->" in kernels
