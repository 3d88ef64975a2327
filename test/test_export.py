"""Export (tinychad/export.py, the seed's PORT=1): the standalone C program computes what tinychad does."""
from __future__ import annotations
import os
import subprocess
import sys
import numpy as np
import pytest
from tinychad import Tensor, dtypes
from tinychad.runtime.cc import find_c_compiler
from tinychad.export import export_c

CC = find_c_compiler()


def _build(source: str, tmp_path, extra: str = "", flags: tuple[str, ...] = ()) -> str:
  assert CC is not None, "the exported program needs a C compiler (CC, clang or gcc), as the CPU device does"
  (tmp_path / "model.c").write_text(source)
  files = [str(tmp_path / "model.c")]
  if extra:
    (tmp_path / "extra.c").write_text(extra)
    files.append(str(tmp_path / "extra.c"))
  binary = str(tmp_path / "model")
  subprocess.run([CC, "-O2", *flags, *files, "-lm", "-o", binary], check=True, capture_output=True)
  return subprocess.run([binary], check=True, capture_output=True, text=True).stdout


def _mlp(x: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
  return (x @ w1).relu().matmul(w2).log_softmax(axis=1)


def test_exported_program_prints_what_tinychad_computes(tmp_path):
  rng = np.random.default_rng(0)
  x, w1, w2 = (Tensor(rng.standard_normal(s, dtype=np.float32)) for s in ((8, 64), (64, 96), (96, 10)))
  out = _mlp(x, w1, w2)
  printed = _build(export_c(out, inputs=[x]), tmp_path)
  np.testing.assert_allclose(np.array(printed.split(), dtype=np.float32).reshape(8, 10), out.numpy(), rtol=1e-5, atol=1e-5)


def test_inputs_are_parameters_and_weights_are_embedded(tmp_path):
  rng = np.random.default_rng(1)
  x, w1, w2 = (Tensor(rng.standard_normal(s, dtype=np.float32)) for s in ((4, 32), (32, 48), (48, 5)))
  source = export_c(_mlp(x, w1, w2), inputs=[x])
  # another program links the model and runs it on an input the export never saw
  other = rng.standard_normal((4, 32), dtype=np.float32)
  values = ", ".join(repr(float(v)) for v in other.reshape(-1))
  caller = f"""#include <stdio.h>
void tinychad_forward(const float* input0, float* output0);
static const float x[] = {{{values}}};
int main(void) {{ float out[20]; tinychad_forward(x, out); for (int i = 0; i < 20; i++) printf("%.9g\\n", out[i]); return 0; }}
"""
  printed = _build(source, tmp_path, extra=caller, flags=("-DTINYCHAD_NO_MAIN",))
  want = _mlp(Tensor(other), w1, w2).numpy()
  np.testing.assert_allclose(np.array(printed.split(), dtype=np.float32).reshape(4, 5), want, rtol=1e-5, atol=1e-5)


def test_several_outputs_views_and_integers(tmp_path):
  a = Tensor(np.arange(24, dtype=np.float32).reshape(4, 6) - 11.5)
  # a transposed view comes out in the order numpy() shows it; argmax is int64
  outs = [(a * 2).T, a.argmax(axis=1), (a > 0).sum()]
  printed = _build(export_c(outs), tmp_path).split()
  want = np.concatenate([t.numpy().reshape(-1).astype(np.float64) for t in outs])
  assert outs[1].dtype == dtypes.int64
  np.testing.assert_array_equal(np.array(printed, dtype=np.float64), want)


def test_export_is_written_whole(tmp_path):
  path = tmp_path / "net.c"
  source = export_c(Tensor([1.0, 2.0]).exp(), path=path)
  assert path.read_text() == source and "void tinychad_forward(float* restrict output0)" in source


def test_unrealized_input_is_a_clear_error():
  x = Tensor([1.0, 2.0]) + 1
  with pytest.raises(ValueError, match="export: input .* must be realized"):
    export_c(x * 2, inputs=[x])


def test_port_flag_writes_the_program_of_each_realize(tmp_path):
  # the seed's API with PORT=1: the realize runs as usual and leaves its program in PORT_FILE
  code = """
from tinychad.tensor import tensor, Linear
x = tensor.randn(3,28,28).reshape(-1,784)
out = Linear(784, 10)(x).relu().logsoftmax(axis=1)
print(" ".join(repr(float(v)) for v in out.numpy().reshape(-1)))
"""
  path = tmp_path / "port.c"
  env = {**os.environ, "PORT": "1", "PORT_FILE": str(path)}
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
  assert result.returncode == 0, result.stderr
  assert f"port: wrote {path}" in result.stdout
  computed = np.array(result.stdout.splitlines()[-1].split(), dtype=np.float32)
  printed = _build(path.read_text(), tmp_path)
  np.testing.assert_allclose(np.array(printed.split(), dtype=np.float32), computed, rtol=1e-5, atol=1e-5)


def test_embedded_data_keeps_special_values_exactly(tmp_path):
  # NaN, -inf, -0, a denormal, the int64 extremes and bools read back as the same values
  f = Tensor(np.array([np.nan, -np.inf, 0.1, -0.0, 3e-45], dtype=np.float32))
  i = Tensor(np.array([-2 ** 63, 5, 2 ** 63 - 1], dtype=np.int64))
  b = Tensor(np.array([True, False]))
  outs = [f * 1, i + 0, b.logical_not()]
  printed = _build(export_c(outs), tmp_path).split()
  np.testing.assert_array_equal(np.array(printed[:5], dtype=np.float32), outs[0].numpy())
  assert [int(v) for v in printed[5:8]] == outs[1].numpy().tolist()
  assert [int(v) for v in printed[8:]] == outs[2].numpy().astype(int).tolist()


@pytest.mark.parametrize("flags", [(), ("-march=native",)], ids=["portable", "native"])
def test_streaming_stores_export(tmp_path, monkeypatch, set_noopt, flags):
  """A kernel with streaming stores (forced here for a small output) exports to a program that gives
  tinychad's numbers whether it is built for this CPU (the AVX store, buffers aligned for it) or not
  (plain stores)."""
  import importlib
  from tinychad.host import simd_bytes
  set_noopt("0")    # NOOPT=1 streams nothing
  monkeypatch.setattr(importlib.import_module("tinychad.codegen.linearize"), "stream_min_bytes", lambda: 0)
  x = Tensor(np.random.default_rng(2).standard_normal((16, 64), dtype=np.float32))
  out = (x * 2).exp() + 1
  source = export_c(out)
  assert ("tc_stream_" in source) == (simd_bytes() >= 32)
  printed = _build(source, tmp_path, flags=flags)
  np.testing.assert_allclose(np.array(printed.split(), dtype=np.float32).reshape(16, 64), out.numpy(), rtol=1e-5, atol=1e-5)


def test_a_cat_written_in_place_exports(tmp_path, set_noopt):
  set_noopt("0")     # NOOPT=1 writes no cat in place
  # 20 pieces: two levels of cats (function.cat's groups), each piece a pointer into the one array they fill
  rng = np.random.default_rng(2)
  rows = [Tensor(rng.standard_normal((1, 16), dtype=np.float32)) for _ in range(20)]
  out = Tensor.cat(*[(r * 2).exp() for r in rows], dim=0)
  source = export_c(out)
  assert source.count("* const buf") == 20 + 4
  printed = _build(source, tmp_path)
  np.testing.assert_allclose(np.array(printed.split(), dtype=np.float32).reshape(20, 16), out.numpy(), rtol=1e-6)
