"""tinychad.export (tinychad/export/): each target's artifact, built and run outside tinychad, computes what
tinychad computes (1e-5) on inputs the export never saw: C through cc + ctypes, LLVM IR through llvmlite and
clang-14, WebAssembly through Node.js. Models: the MNIST CNN and MLP of examples/mnist.py, a small GPT-style
forward (embedding gather, causal attention, layernorm, GELU), and corner cases (broadcast, reduce, pad,
gather, integer and several outputs). Then the memory plan, the manifest and weights files, and the errors."""
from __future__ import annotations
import ctypes
import json
import math
import re
import shutil
import subprocess
import numpy as np
import pytest
import safetensors.numpy
import tinychad
from tinychad import Tensor, TinyJit, dtypes, nn
from tinychad.engine.realize import capture
from tinychad.export.plan import capture_plan
from tinychad.examples.mnist import CNN, MLP
from tinychad.helpers import getenv
from tinychad.runtime.cc import find_c_compiler
from tinychad.runtime.ops_llvm import optimized_module

CC = find_c_compiler()
CLANG = shutil.which("clang-14") or shutil.which("clang")
NODE = shutil.which("node")
TARGETS = ["c", "llvm", "wasm"]


def _ctype_args(arrays: list[np.ndarray]) -> list[ctypes.c_void_p]:
  return [ctypes.c_void_p(a.ctypes.data) for a in arrays]


def _outputs(manifest: dict) -> list[np.ndarray]:
  return [np.zeros(p["shape"], dtype=dtypes.__dict__[p["dtype"]].np) for p in manifest["outputs"]]


def _weights_arg(out_dir, manifest) -> ctypes.Array | None:
  if manifest["weights"] != "safetensors": return None
  data = (out_dir / f"{manifest['name']}.safetensors").read_bytes()
  return ctypes.create_string_buffer(data, len(data))


def run_c(out_dir, manifest: dict, inputs: list[np.ndarray]) -> list[np.ndarray]:
  assert CC is not None, "the C target is tested with the CPU device's compiler (CC, clang or gcc)"
  name = manifest["name"]
  lib_path = out_dir / f"lib{name}.so"
  subprocess.run([CC, "-O2", "-shared", "-fPIC", str(out_dir / f"{name}.c"), "-o", str(lib_path), "-lm"],
                 check=True, capture_output=True)
  lib = ctypes.CDLL(str(lib_path))
  weights = _weights_arg(out_dir, manifest)
  assert lib[f"{name}_init"](weights) == 0
  outs = _outputs(manifest)
  lib[f"{name}_forward"](*_ctype_args([np.ascontiguousarray(x) for x in inputs] + outs))
  return outs


def run_llvm(out_dir, manifest: dict, inputs: list[np.ndarray], compiler: str = "llvmlite") -> list[np.ndarray]:
  name = manifest["name"]
  weights = _weights_arg(out_dir, manifest)
  outs = _outputs(manifest)
  args = _ctype_args([np.ascontiguousarray(x) for x in inputs] + outs)
  if compiler == "clang":
    lib_path = out_dir / f"lib{name}_ll.so"
    # clang-14 reads llvmlite's opaque pointers (`ptr`) only in that mode, still experimental in LLVM 14: its
    # LoopAccessAnalysis crashes on them, so its IR passes are skipped (the backend still compiles at -O2)
    flags = ["-mllvm", "-opaque-pointers", "-Xclang", "-disable-llvm-passes"] if "version 14" in compiler_version(CLANG) else []
    subprocess.run([CLANG, "-O2", *flags, "-shared", "-fPIC", str(out_dir / f"{name}.ll"), "-o", str(lib_path), "-lm"],
                   check=True, capture_output=True)
    lib = ctypes.CDLL(str(lib_path))
    assert lib[f"{name}_init"](weights) == 0
    lib[f"{name}_forward"](*args)
    return outs
  import llvmlite.binding as llvm
  llvm.initialize_native_target()
  llvm.initialize_native_asmprinter()
  module = llvm.parse_assembly((out_dir / f"{name}.ll").read_text())
  module.verify()
  engine = llvm.create_mcjit_compiler(module, llvm.Target.from_default_triple().create_target_machine(opt=2))
  engine.finalize_object()
  init = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(engine.get_function_address(f"{name}_init"))
  assert init(ctypes.cast(weights, ctypes.c_void_p) if weights is not None else None) == 0
  forward = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * len(args))(engine.get_function_address(f"{name}_forward"))
  forward(*args)
  run_llvm.engines.append(engine)     # the engine owns the code: keep it alive while outputs are read
  return outs


run_llvm.engines = []


def compiler_version(path: str) -> str:
  return subprocess.run([path, "--version"], capture_output=True, text=True).stdout


def run_wasm(out_dir, manifest: dict, inputs: list[np.ndarray]) -> list[np.ndarray]:
  assert NODE is not None, "the wasm target is tested in Node.js"
  name = manifest["name"]
  for i, x in enumerate(inputs): (out_dir / f"in{i}.bin").write_bytes(np.ascontiguousarray(x).tobytes())
  arrays = [f"new {ARRAYS[p['dtype']]}(readBin('in{i}.bin'))" for i, p in enumerate(manifest["inputs"])]
  script = f"""import {{ load }} from "./{name}.js";
import {{ readFileSync, writeFileSync }} from "node:fs";
const readBin = f => {{ const b = readFileSync(new URL(f, import.meta.url)); return b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength); }};
const m = await load();
let outs = m.forward({", ".join(arrays)});
if ({len(manifest["outputs"])} === 1) outs = [outs];
outs.forEach((o, i) => writeFileSync(new URL(`out${{i}}.bin`, import.meta.url), new Uint8Array(o.buffer)));
"""
  (out_dir / "run.mjs").write_text(script)
  result = subprocess.run([NODE, str(out_dir / "run.mjs")], capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  return [np.frombuffer((out_dir / f"out{i}.bin").read_bytes(), dtype=o.dtype).reshape(o.shape)
          for i, o in enumerate(_outputs(manifest))]


ARRAYS = {"float32": "Float32Array", "float64": "Float64Array", "int32": "Int32Array", "int64": "BigInt64Array",
          "bool": "Uint8Array", "uint8": "Uint8Array"}
RUN = {"c": run_c, "llvm": run_llvm, "wasm": run_wasm}


def check(fn, examples: list[Tensor], fresh: list[np.ndarray], target: str, tmp_path, weights: str = "embed",
          tol: float = 1e-5) -> dict:
  """Export fn, run the artifact on `fresh` inputs, compare with tinychad on them; returns the manifest."""
  manifest = tinychad.export(fn, examples, target=target, out_dir=tmp_path, weights=weights)
  got = RUN[target](tmp_path, manifest, fresh)
  want = fn(*[Tensor(x) for x in fresh])
  want = [want] if isinstance(want, Tensor) else list(want)
  assert len(got) == len(want)
  for g, w in zip(got, want):
    w = w.numpy()
    assert g.shape == w.shape and g.dtype == w.dtype
    if w.dtype.kind == "f": np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
    else: np.testing.assert_array_equal(g, w)
  return manifest


def _images(seed: int, n: int = 1) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal((n, 1, 28, 28), dtype=np.float32)


@pytest.mark.parametrize("target", TARGETS)
def test_mnist_cnn(target, tmp_path):
  Tensor.manual_seed(0)
  model = nn.eval(CNN())
  manifest = check(lambda x: model(x).softmax(axis=1), [Tensor(_images(0))], [_images(1)], target, tmp_path)
  assert manifest["inputs"] == [{"name": "input", "shape": [1, 1, 28, 28], "dtype": "float32", "size": 784}]
  assert manifest["outputs"] == [{"name": "output", "shape": [1, 10], "dtype": "float32", "size": 10}]


@pytest.mark.parametrize("target", TARGETS)
def test_mlp_batch_with_weights_file(target, tmp_path):
  Tensor.manual_seed(1)
  model = MLP()
  manifest = check(lambda x: model(x).log_softmax(axis=1), [Tensor(_images(2, 4))], [_images(3, 4)], target, tmp_path,
                   weights="safetensors")
  # the weights live beside the code, in a file any safetensors reader takes, and not in the code
  stored = safetensors.numpy.load((tmp_path / "model.safetensors").read_bytes())
  params = sorted(np.prod(p.shape) for p in nn.state.get_parameters(model))
  assert sorted(v.size for v in stored.values()) == params
  if target == "c": assert "static const float* w0;" in (tmp_path / "model.c").read_text()
  if target == "llvm": assert "@w0 = internal global ptr null" in (tmp_path / "model.ll").read_text()
  if target == "wasm": assert (tmp_path / "model.wasm").stat().st_size < manifest["weight_bytes"] // 4


def _gpt(vocab=17, dim=16, heads=2, seq=6):
  Tensor.manual_seed(2)
  emb, pos = nn.Embedding(vocab, dim), Tensor.randn(seq, dim) * 0.1
  ln1, ln2, ln3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
  qkv, proj, up, down = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
  head = nn.Linear(dim, vocab, bias=False)
  causal = Tensor(np.triu(np.full((seq, seq), -np.inf, dtype=np.float32), 1))

  def forward(tokens: Tensor) -> Tensor:
    b = tokens.shape[0]
    x = emb(tokens) + pos
    q, k, v = qkv(ln1(x)).reshape(b, seq, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
    att = ((q @ k.transpose(-1, -2)) / math.sqrt(dim // heads) + causal).softmax(axis=-1)
    x = x + proj((att @ v).transpose(1, 2).reshape(b, seq, dim))
    x = x + down(up(ln2(x)).gelu())
    return head(ln3(x)).log_softmax(axis=-1)
  return forward


@pytest.mark.parametrize("target", TARGETS)
def test_small_gpt_forward(target, tmp_path):
  rng = np.random.default_rng(4)
  tokens = lambda: rng.integers(0, 17, (2, 6)).astype(np.int32)
  check(_gpt(), [Tensor(tokens())], [tokens()], target, tmp_path)


def _corners(a: Tensor, b: Tensor, idx: Tensor):
  return [a + b,                                    # broadcast (3,1,4) + (5,1)
          a.sum(axis=2), b.max(), a.mean(axis=(0, 2)),   # reduces: axis, whole, several axes
          a.pad(((1, 0), (0, 0), (2, 1)), value=0.5),    # pad with a value
          b.reshape(-1)[idx], a.gather(2, idx.reshape(1, 1, 4).expand(3, 1, 4) % 4),   # gather by index tensor
          (a.exp2() + b.reshape(1, 5, 1).sin()).log2(),    # math the freestanding build brings its own of
          b.T.argmax(axis=1),                               # int64 output of a view
          a.double().sqrt().sum(axis=0)]                    # float64


@pytest.mark.parametrize("target", TARGETS)
def test_corner_cases(target, tmp_path):
  rng = np.random.default_rng(5)
  make = lambda: [np.abs(rng.standard_normal((3, 1, 4), dtype=np.float32)) + 0.1,
                  rng.standard_normal((5, 1), dtype=np.float32) * 3, rng.integers(0, 5, (4,)).astype(np.int32)]
  manifest = check(_corners, [Tensor(x) for x in make()], make(), target, tmp_path)
  assert [p["dtype"] for p in manifest["outputs"]][-2:] == ["int64", "float64"]


def test_llvm_module_through_clang(tmp_path):
  if CLANG is None: pytest.skip("no clang on PATH: the LLVM module is checked through llvmlite only")
  rng = np.random.default_rng(6)
  make = lambda: [rng.standard_normal((3, 1, 4), dtype=np.float32), rng.standard_normal((5, 1), dtype=np.float32),
                  rng.integers(0, 5, (4,)).astype(np.int32)]
  fn = lambda a, b, idx: [(a + b).softmax(axis=-1), b.reshape(-1)[idx] * 2]
  for weights in ("embed", "safetensors"):
    manifest = tinychad.export(fn, [Tensor(x) for x in make()], target="llvm", out_dir=tmp_path / weights, weights=weights)
    fresh = make()
    got = run_llvm(tmp_path / weights, manifest, fresh, compiler="clang")
    for g, w in zip(got, fn(*[Tensor(x) for x in fresh])): np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-5)
    text = (tmp_path / weights / "model.ll").read_text()
    # the founding notes' shape: a forward taking the buffers and calling one function per kernel
    assert text.count('define internal void @"model_k') == manifest["kernels"]
    assert "define void @model_forward(ptr noalias %input0, ptr noalias %input1, ptr noalias %input2" in text


def test_c_is_portable_and_declared(tmp_path):
  """The .c builds with strict warnings and no -march, and the header declares what the .c defines."""
  Tensor.manual_seed(3)
  model = MLP(hidden=32)
  tinychad.export(model, [Tensor(_images(7, 2))], target="c", out_dir=tmp_path, names={"inputs": ["image"], "outputs": ["logits"]},
                  name="mlp")
  header = (tmp_path / "mlp.h").read_text()
  assert "void mlp_forward(const float* image, float* logits);" in header and "#define MLP_IMAGE_SIZE 1568" in header
  main = tmp_path / "main.c"
  main.write_text('#include "mlp.h"\n#include <stdio.h>\nstatic float x[MLP_IMAGE_SIZE], y[MLP_LOGITS_SIZE];\n'
                  'int main(void) { if (mlp_init(0)) return 1; mlp_forward(x, y); printf("%f\\n", y[0]); return 0; }\n')
  subprocess.run([CC, "-O2", "-std=c11", "-Wall", "-Wno-unused-variable", "-Wno-psabi", "-Werror", str(tmp_path / "mlp.c"), str(main), "-lm",
                  "-o", str(tmp_path / "main")], check=True, capture_output=True)
  printed = float(subprocess.run([str(tmp_path / "main")], check=True, capture_output=True, text=True).stdout)
  assert printed == pytest.approx(float(model(Tensor(np.zeros((2, 1, 28, 28), np.float32))).numpy()[0, 0]), abs=1e-5)


def test_freestanding_math_matches_libm(tmp_path):
  """export/libm.py's functions (the wasm build has no libm) against tinychad's native kernels, which call
  the system's libm, in float64 over wide ranges and the special values; then float32 remainders."""
  if NODE is None or CLANG is None: pytest.skip("needs clang and node for the freestanding (wasm) build")
  special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-310, 5e-324, 1.0, 2.0, 0.5, 1e300, -7.25], np.float64)
  x = np.concatenate([special, np.random.default_rng(8).uniform(-700, 700, 500), np.geomspace(1e-300, 1e300, 200)])
  cases = [("exp2", lambda v: v.exp2(), x / 2), ("log2", lambda v: v.log2(), np.abs(x)),
           ("sin", lambda v: v.sin(), x[np.abs(x) < 1e5]), ("log2_negative", lambda v: v.log2(), -np.abs(x))]
  for label, fn, values in cases:
    with np.errstate(all="ignore"): check(fn, [Tensor(values)], [values], "wasm", tmp_path / label, tol=1e-13)
  a = np.array([5.5, -5.5, 7.0, -0.0, 1e10, 3.0, 2.0, -1e-3], np.float32)
  b = np.array([2.0, 2.0, -3.0, 1.0, 3.0, np.inf, 0.75, 7.0], np.float32)
  check(lambda p, q: p % q, [Tensor(a), Tensor(b)], [a, b], "wasm", tmp_path / "mod", tol=0)


def test_wasm_uses_simd128_and_its_loader_checks_input(tmp_path):
  Tensor.manual_seed(4)
  model = MLP(hidden=32)
  manifest = tinychad.export(model, [Tensor(_images(9))], target="wasm", out_dir=tmp_path)
  source = (tmp_path / "model.wasm.c").read_text()
  assert "vector_size(16)" in source and "vector_size(32)" not in source and manifest["simd_bytes"] == 16
  assert (tmp_path / "model.d.ts").read_text().count("forward(input: Float32Array") == 1
  (tmp_path / "bad.mjs").write_text('import { load } from "./model.js";\nconst m = await load();\n'
                                    'try { m.forward(new Float32Array(10)); } catch (e) { console.log(e.name + ": " + e.message); }\n')
  result = subprocess.run([NODE, str(tmp_path / "bad.mjs")], capture_output=True, text=True, timeout=60)
  assert "RangeError: model.forward: input input needs 784 float32 values (shape [1,1,28,28]), got 10" in result.stdout


def _most_accumulators(source: str) -> int:
  """The most vector accumulators one kernel function of exported C declares."""
  return max(len(re.findall(r"float32x4 acc\d+ =", f)) for f in source.split("TC_KERNEL")[1:])


def test_wasm_register_tiles_fit_the_engine(tmp_path, set_noopt):
  """The wasm export's kernels use codegen/opt.py's "wasm" tuning: V8 gives a function 15 xmm registers, so
  a conv's register tile is 4 x 2 vectors with its reduce loop not unrolled, where the C export for the same
  16-byte SIMD keeps the host's larger tiles (and the wasm still computes what tinychad computes)."""
  set_noopt("0")    # NOOPT=1 lowers plain loops: no tiles
  Tensor.manual_seed(6)
  model = nn.eval(CNN())
  fn = lambda x: model(x).softmax(axis=1)
  check(fn, [Tensor(_images(12, 8))], [_images(13, 8)], "wasm", tmp_path / "wasm")
  wasm_c = (tmp_path / "wasm" / "model.wasm.c").read_text()
  tinychad.export(fn, [Tensor(_images(12, 8))], target="c", out_dir=tmp_path / "c", simd_bytes=16)
  host_c = (tmp_path / "c" / "model.c").read_text()
  assert _most_accumulators(wasm_c) == 8 and "#pragma GCC unroll" not in wasm_c
  assert _most_accumulators(host_c) >= 24 and "#pragma GCC unroll 4" in host_c


def test_kernels_of_weights_only_are_folded(tmp_path):
  """The CNN's weight transposes and batchnorm scales read weights only: the export runs them once and keeps
  their outputs as weights (the output still equals tinychad's); a broadcast of a weight much bigger than the
  weight stays a kernel."""
  Tensor.manual_seed(7)
  model = nn.eval(CNN())
  fn = lambda x: model(x).softmax(axis=1)
  with capture() as captured: fn(Tensor(_images(14, 2))).realize()
  plan = capture_plan(fn, [Tensor(_images(14, 2))], "cnn", 16)
  assert len(plan.steps) < len([item for item, _ in captured if item is not None])
  for step in plan.steps: assert any(a.kind != "weight" for a in step.args[1:]), step.program.name
  names = [w.name for w in plan.weights]
  assert names == [f"w{i}" for i in range(len(names))]
  check(fn, [Tensor(_images(14, 2))], [_images(15, 2)], "c", tmp_path / "cnn")
  bias = Tensor(np.arange(8, dtype=np.float32))
  spread = lambda x: x + bias.reshape(8, 1).expand(8, 4096).contiguous()
  plan = capture_plan(spread, [Tensor(np.ones((8, 4096), np.float32))], "spread", 16)
  assert [w.size for w in plan.weights] == [8]
  check(spread, [Tensor(np.ones((8, 4096), np.float32))], [np.full((8, 4096), 2, np.float32)], "c", tmp_path / "spread")


def test_memory_plan_shares_the_arena():
  """Intermediates whose lifetimes overlap never share bytes; the arena is smaller than their sum."""
  Tensor.manual_seed(5)
  layers = [nn.Linear(64, 64) for _ in range(6)]

  def deep(x):
    for layer in layers: x = layer(x).relu().contiguous()
    return x.sum(axis=1)
  plan = capture_plan(deep, [Tensor(np.ones((8, 64), np.float32))], "deep", 16)
  assert plan.arena_bytes < sum(s.nbytes for s in plan.scratch) // 2
  for a in plan.scratch:
    assert a.offset % 64 == 0
    for b in plan.scratch:
      if a is not b and a.first <= b.last and b.first <= a.last:
        assert a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset, (a, b)


def test_jitted_function_exports_like_the_plain_one(tmp_path):
  w = Tensor(np.random.default_rng(9).standard_normal((5, 3), dtype=np.float32))
  jitted = TinyJit(lambda x: (x @ w).relu())
  for _ in range(3): jitted(Tensor(np.ones((2, 5), np.float32)))    # recorded and replaying
  check(jitted, [Tensor(np.ones((2, 5), np.float32))], [np.random.default_rng(10).standard_normal((2, 5), dtype=np.float32)],
        "c", tmp_path)


def test_manifest_file_and_callable_package(tmp_path):
  manifest = tinychad.export(lambda x: (x * 2, x.sum()), [Tensor(np.ones((2, 3), np.float32))], target="c", out_dir=tmp_path,
                             names={"inputs": ["x"], "outputs": ["doubled", "total"]}, name="tiny")
  on_disk = json.loads((tmp_path / "tiny.json").read_text())
  assert on_disk == manifest and manifest["files"] == ["tiny.c", "tiny.h", "tiny.json"]
  assert [p["name"] for p in manifest["outputs"]] == ["doubled", "total"] and manifest["outputs"][1]["shape"] == []
  assert tinychad.export.export_c is not None and callable(tinychad.export)


# ---- errors: a clear ValueError naming the problem, never an artifact computing something else ----

def test_data_dependent_control_flow_is_refused(tmp_path):
  def branchy(x):
    return x * 2 if x.sum().item() > 0 else x - 1
  with pytest.raises(ValueError, match="depends on tensor values|reads tensor values"):
    tinychad.export(branchy, [Tensor(np.ones(4, np.float32))], out_dir=tmp_path)
  def reads_a_value(x):              # a value read in Python becomes a constant of the kernels that follow
    return x * float(x.max().item())
  with pytest.raises(ValueError, match="depends on tensor values|reads tensor values"):
    tinychad.export(reads_a_value, [Tensor(np.arange(4, dtype=np.float32))], out_dir=tmp_path)
  state = [Tensor(np.float32(2.0))]

  def keeps_state(x):                # same kernels every call, other data: caught by replaying the recording
    out = x * state[0]
    state[0] = Tensor(np.float32(float(state[0].numpy()) + 1))
    return out
  with pytest.raises(ValueError, match="keeps state between calls"):
    tinychad.export(keeps_state, [Tensor(np.ones(4, np.float32))], out_dir=tmp_path)


def test_shape_changing_between_calls_is_refused(tmp_path):
  calls = []

  def growing(x):
    calls.append(1)
    return x[:len(calls)] * 2
  with pytest.raises(ValueError, match="different kernels or returns other shapes"):
    tinychad.export(growing, [Tensor(np.ones(8, np.float32))], out_dir=tmp_path)


def test_bad_arguments_are_named(tmp_path):
  x = Tensor(np.ones(3, np.float32))
  with pytest.raises(ValueError, match="target 'onnx' is not one of"): tinychad.export(lambda t: t, [x], target="onnx")
  with pytest.raises(ValueError, match="weights='zip'"): tinychad.export(lambda t: t, [x], weights="zip")
  with pytest.raises(ValueError, match="input name '2x' is not an identifier"):
    tinychad.export(lambda t: t + 1, [x], out_dir=tmp_path, names={"inputs": ["2x"]})
  with pytest.raises(TypeError, match="example input 0 must be a Tensor"): tinychad.export(lambda t: t, [np.ones(3)])
  with pytest.raises(TypeError, match="must return a Tensor"): tinychad.export(lambda t: 3, [x], out_dir=tmp_path)


def test_op_a_target_cannot_do_is_refused(tmp_path):
  with pytest.raises(ValueError, match="target 'wasm' has no float16"):
    tinychad.export(lambda t: (t.half() * 2).float(), [Tensor(np.ones(3, np.float32))], target="wasm", out_dir=tmp_path)


# ---- another CPU: aarch64 (NEON) under qemu-user ----

AARCH64_CC = shutil.which("aarch64-linux-gnu-gcc")
QEMU = shutil.which("qemu-aarch64")
MAIN_READING_FILE = r"""#include <stdio.h>
#include "model.h"
static float x[MODEL_INPUT_SIZE], y[MODEL_OUTPUT_SIZE];
int main(int argc, char** argv) {
  FILE* f = fopen(argv[1], "rb");
  if (!f || fread(x, sizeof(float), MODEL_INPUT_SIZE, f) != MODEL_INPUT_SIZE) return 2;
  fclose(f);
  if (model_init(0)) return 3;
  model_forward(x, y);
  for (int i = 0; i < MODEL_OUTPUT_SIZE; i++) printf("%.9g\n", y[i]);
  return 0;
}
"""


def test_aarch64_neon_build_under_qemu(tmp_path):
  """The MNIST CNN's C, lowered for 16-byte vectors (NEON's), cross-compiled for aarch64 and run under qemu,
  prints what the x86-64 build of the same C prints and what tinychad computes; its kernels use NEON."""
  if AARCH64_CC is None or QEMU is None:
    pytest.skip("needs aarch64-linux-gnu-gcc and qemu-aarch64 (Debian: gcc-aarch64-linux-gnu qemu-user; .ci/run installs them)")
  Tensor.manual_seed(6)
  model = nn.eval(CNN())
  fn = lambda x: model(x).softmax(axis=1)
  manifest = tinychad.export(fn, [Tensor(_images(10))], target="c", out_dir=tmp_path, simd_bytes=16)
  assert manifest["simd_bytes"] == 16
  (tmp_path / "main.c").write_text(MAIN_READING_FILE)
  image = _images(11)
  (tmp_path / "in.bin").write_bytes(image.tobytes())
  sources = [str(tmp_path / "model.c"), str(tmp_path / "main.c")]
  subprocess.run([AARCH64_CC, "-O2", "-static", *sources, "-lm", "-o", str(tmp_path / "arm")], check=True, capture_output=True)
  subprocess.run([CC, "-O2", *sources, "-lm", "-o", str(tmp_path / "x86")], check=True, capture_output=True)
  printed = {}
  for name, cmd in (("arm", [QEMU, str(tmp_path / "arm")]), ("x86", [str(tmp_path / "x86")])):
    result = subprocess.run(cmd + [str(tmp_path / "in.bin")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (name, result.returncode, result.stderr)
    printed[name] = np.array(result.stdout.split(), dtype=np.float32)
  want = fn(Tensor(image)).numpy().reshape(-1)
  np.testing.assert_allclose(printed["arm"], printed["x86"], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(printed["arm"], want, rtol=1e-5, atol=1e-5)
  asm = subprocess.run([AARCH64_CC, "-O2", "-S", "-o", "-", sources[0]], check=True, capture_output=True, text=True).stdout
  if not getenv("NOOPT", 0):     # NOOPT=1 lowers plain loops: no vectors to find
    assert len(re.findall(r"\bfmla\s+v\d+\.4s", asm)) >= 8, "the convolutions' multiply-adds are NEON vector FMAs"


def test_aarch64_llvm_module_under_qemu(tmp_path):
  """The CNN's LLVM module (16-byte vectors), compiled by llvmlite for aarch64 at -O2, linked with a C main
  by the cross gcc and run under qemu: tinychad's numbers, with NEON vector FMAs in its code."""
  if AARCH64_CC is None or QEMU is None:
    pytest.skip("needs aarch64-linux-gnu-gcc and qemu-aarch64 (Debian: gcc-aarch64-linux-gnu qemu-user; .ci/run installs them)")
  import llvmlite.binding as llvm
  llvm.initialize_all_targets()
  llvm.initialize_all_asmprinters()
  Tensor.manual_seed(7)
  model = nn.eval(CNN())
  fn = lambda x: model(x).softmax(axis=1)
  tinychad.export(fn, [Tensor(_images(12))], target="llvm", out_dir=tmp_path, simd_bytes=16)
  tm = llvm.Target.from_triple("aarch64-unknown-linux-gnu").create_target_machine(cpu="generic", features="+neon", opt=2,
                                                                                    reloc="static")
  module = optimized_module((tmp_path / "model.ll").read_text(), tm)
  (tmp_path / "model.o").write_bytes(tm.emit_object(module))
  if not getenv("NOOPT", 0): assert len(re.findall(r"\bfmla\s+v\d+\.4s", tm.emit_assembly(module))) >= 8
  (tmp_path / "main.c").write_text(MAIN_READING_FILE.replace('#include "model.h"', "#define MODEL_INPUT_SIZE 784\n"
                                   "#define MODEL_OUTPUT_SIZE 10\nint model_init(const void*);\nvoid model_forward(const float*, float*);"))
  subprocess.run([AARCH64_CC, "-O2", "-static", str(tmp_path / "main.c"), str(tmp_path / "model.o"), "-lm", "-o", str(tmp_path / "arm")],
                 check=True, capture_output=True)
  image = _images(13)
  (tmp_path / "in.bin").write_bytes(image.tobytes())
  result = subprocess.run([QEMU, str(tmp_path / "arm"), str(tmp_path / "in.bin")], capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  np.testing.assert_allclose(np.array(result.stdout.split(), dtype=np.float32), fn(Tensor(image)).numpy().reshape(-1),
                             rtol=1e-5, atol=1e-5)
