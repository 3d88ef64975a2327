"""Exported models against the runtimes people deploy with: WebAssembly in Node.js, and native C.

in: the MNIST CNN of tinychad/examples/mnist.py (seeded weights; timings don't depend on their values), its
    PyTorch twin with the same weights; npm packages in bench/.node_modules (not committed; installed on
    first run: onnxruntime-web, @tensorflow/tfjs-core, @tensorflow/tfjs-backend-wasm) and PyPI's onnx
out: two tables, every number from this one run (the machine is shared: compare ratios, not absolute times):
  wasm    per batch (1, 64): CPU ms per forward of tinychad's .wasm, ONNX Runtime Web (wasm backend, SIMD, 1
          thread; the model exported from PyTorch to ONNX) and TensorFlow.js's wasm backend (1 thread, the
          same layers written with tfjs-core ops), all in one Node.js process, one thread, best of 5 rounds;
          plus each runtime's download size (.wasm + weights/model file)
  native  per batch: the exported C (cc -O2 -march=native, one thread), tinychad itself and PyTorch (CPU
          threads as configured), in ms per forward
Every runtime's probabilities are checked against PyTorch's (1e-4) before it is timed.
  python -m bench.export [--resnet]     # --resnet: also ResNet-18 at 224x224, batch 1 (.wasm, ORT Web, TF.js)
  python -m bench.export --resnet-only  # that row alone
"""
from __future__ import annotations
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
import numpy as np
import torch
import tinychad
from tinychad import Tensor, nn
from tinychad.examples.mnist import CNN, MEAN, STD
from tinychad.nn.state import get_state_dict

NODE_DIR = Path(__file__).resolve().parent / ".node_modules"
NPM_PACKAGES = ["onnxruntime-web@1.30.0", "@tensorflow/tfjs-core@4.22.0", "@tensorflow/tfjs-backend-wasm@4.22.0"]
BATCHES = (1, 64)


def node_packages() -> None:
  if (NODE_DIR / "node_modules" / "onnxruntime-web").exists(): return
  NODE_DIR.mkdir(exist_ok=True)
  subprocess.run(["npm", "install", "--no-audit", "--no-fund", *NPM_PACKAGES], cwd=NODE_DIR, check=True,
                 env={**os.environ, "ONNXRUNTIME_NODE_INSTALL": "skip"})


class TorchCNN(torch.nn.Module):
  """The CNN in PyTorch, with the demo's normalization and softmax: pixels in [0, 1] -> probabilities."""
  def __init__(self, c1: int, c2: int):
    super().__init__()
    self.trunk = torch.nn.Sequential(torch.nn.Conv2d(1, c1, 5), torch.nn.BatchNorm2d(c1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                     torch.nn.Conv2d(c1, c2, 5), torch.nn.BatchNorm2d(c2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                     torch.nn.Flatten())
    self.head = torch.nn.Linear(c2 * 16, 10)

  def forward(self, x): return self.head(self.trunk((x - MEAN) / STD)).softmax(dim=1)


def models() -> tuple[nn.Module, TorchCNN, dict[str, np.ndarray]]:
  Tensor.manual_seed(0)
  model = nn.eval(CNN())
  rng = np.random.default_rng(0)
  # running statistics away from 0/1, so that batchnorm's arithmetic is exercised
  model.trunk[1].running_mean.assign(Tensor(rng.standard_normal(32).astype(np.float32) * 0.1)).realize()
  model.trunk[1].running_var.assign(Tensor(rng.uniform(0.5, 2, 32).astype(np.float32))).realize()
  state = {k: v.numpy() for k, v in get_state_dict(model).items()}
  twin = TorchCNN(32, 64).eval()
  twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()}, strict=True)
  return model, twin, state


class Block:
  """ResNet's basic block (tinychad): two 3x3 convs with batchnorm, and a projected shortcut when the shape changes."""
  def __init__(self, cin: int, cout: int, stride: int):
    self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout)
    self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout)
    self.down = [nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)] if stride != 1 or cin != cout else []

  def __call__(self, x: Tensor) -> Tensor:
    out = self.bn2(self.conv2(self.bn1(self.conv1(x)).relu()))
    return (out + (self.down[1](self.down[0](x)) if self.down else x)).relu()


class ResNet18:
  """ResNet-18 (torchvision's layout): 224x224 RGB -> 1000 logits."""
  def __init__(self):
    self.conv1, self.bn1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64)
    widths = [(64, 64, 1), (64, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2), (256, 256, 1), (256, 512, 2), (512, 512, 1)]
    self.blocks = [Block(*w) for w in widths]
    self.fc = nn.Linear(512, 1000)

  def __call__(self, x: Tensor) -> Tensor:
    x = self.bn1(self.conv1(x)).relu().max_pool2d(3, 2, 1)
    for block in self.blocks: x = block(x)
    return self.fc(x.mean(axis=(2, 3)))


class TorchBlock(torch.nn.Module):
  def __init__(self, cin: int, cout: int, stride: int):
    super().__init__()
    self.conv1, self.bn1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False), torch.nn.BatchNorm2d(cout)
    self.conv2, self.bn2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False), torch.nn.BatchNorm2d(cout)
    self.down = torch.nn.Sequential(*([torch.nn.Conv2d(cin, cout, 1, stride, bias=False), torch.nn.BatchNorm2d(cout)]
                                      if stride != 1 or cin != cout else []))

  def forward(self, x):
    out = self.bn2(self.conv2(self.bn1(self.conv1(x)).relu()))
    return (out + (self.down(x) if len(self.down) else x)).relu()


class TorchResNet18(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.conv1, self.bn1 = torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False), torch.nn.BatchNorm2d(64)
    widths = [(64, 64, 1), (64, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2), (256, 256, 1), (256, 512, 2), (512, 512, 1)]
    self.blocks = torch.nn.Sequential(*[TorchBlock(*w) for w in widths])
    self.fc = torch.nn.Linear(512, 1000)

  def forward(self, x):
    x = torch.nn.functional.max_pool2d(self.bn1(self.conv1(x)).relu(), 3, 2, 1)
    return self.fc(self.blocks(x).mean(dim=(2, 3)))


def resnet_row(tmp: Path) -> None:
  """ResNet-18 at 224x224, batch 1: tinychad's .wasm (weights in a safetensors file beside it) against ONNX
  Runtime Web and TF.js's wasm backend (the same layers in tfjs-core ops), same weights."""
  Tensor.manual_seed(1)
  model = ResNet18()
  nn.eval(model)
  twin = TorchResNet18().eval()
  state = {k: torch.from_numpy(np.array(v.numpy())) for k, v in get_state_dict(model).items()}
  twin.load_state_dict(state, strict=True)
  x = np.random.default_rng(3).random((1, 3, 224, 224), dtype=np.float32)
  start = time.perf_counter()
  manifest = tinychad.export(model, [Tensor(x)], target="wasm", out_dir=tmp / "resnet", weights="safetensors")
  export_s = time.perf_counter() - start
  torch.onnx.export(twin, (torch.from_numpy(x),), str(tmp / "resnet18.onnx"), input_names=["x"], output_names=["probs"],
                    dynamo=False, opset_version=17)
  (tmp / "resnet_x.bin").write_bytes(x.tobytes())
  # the weights for TF.js: one float32 file and an index of (name, shape, offset in floats)
  arrays = {k: v.numpy().astype(np.float32) for k, v in state.items() if "num_batches" not in k}
  index, at = {}, 0
  for k, v in arrays.items(): index[k], at = {"shape": list(v.shape), "offset": at}, at + v.size
  (tmp / "resnet_w.bin").write_bytes(b"".join(v.tobytes() for v in arrays.values()))
  (tmp / "resnet_w.json").write_text(json.dumps(index))
  with torch.no_grad(): (tmp / "resnet_want.bin").write_bytes(twin(torch.from_numpy(x)).numpy().tobytes())
  script = NODE_DIR / "bench_export_resnet.mjs"
  script.write_text(RESNET_JS)
  result = subprocess.run(["node", str(script), str(tmp)], capture_output=True, text=True, timeout=1200)
  if result.returncode != 0: raise RuntimeError(result.stderr[-3000:])
  r = json.loads(result.stdout.strip().splitlines()[-1])
  assert max(r["check"].values()) < 1e-3, r["check"]
  wasm_kb = (tmp / "resnet" / "model.wasm").stat().st_size / 1e3
  print(f"\nResNet-18 224x224 batch 1 in Node.js (one thread, CPU ms, best of 5): tinychad .wasm {r['tinychad']:.1f} | "
        f"ORT Web {r['ort']:.1f} | TF.js wasm {r['tfjs']:.1f} | ORT/tinychad {r['ort'] / r['tinychad']:.2f} | "
        f"TF.js/tinychad {r['tfjs'] / r['tinychad']:.2f} | max |diff| vs torch " + " / ".join(f"{v:.1e}" for v in r["check"].values())
        + f"; {manifest['kernels']} kernels, model.wasm {wasm_kb:.0f} kB + {manifest['weight_bytes'] / 1e6:.1f} MB weights; "
        f"export took {export_s:.0f} s")


RESNET_JS = r"""
import * as ort from "onnxruntime-web";
import * as tf from "@tensorflow/tfjs-core";
import { setThreadsCount } from "@tensorflow/tfjs-backend-wasm";
import { readFileSync } from "node:fs";
// CPU time of this process (one thread computes): the shared machine's load barely moves it, where wall time doubles
const cpuMs = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1000; };
const dir = process.argv[2];
ort.env.wasm.numThreads = 1;
const readF32 = f => { const b = readFileSync(f); return new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength)); };
const maxDiff = (a, b) => a.reduce((m, v, i) => Math.max(m, Math.abs(v - b[i])), 0);
const x = readF32(`${dir}/resnet_x.bin`), want = readF32(`${dir}/resnet_want.bin`);
const { load } = await import(`${dir}/resnet/model.js`);
const m = await load(`${dir}/resnet/model.wasm`, `${dir}/resnet/model.safetensors`);
const session = await ort.InferenceSession.create(`${dir}/resnet18.onnx`, { executionProviders: ["wasm"] });
const feeds = { x: new ort.Tensor("float32", x, [1, 3, 224, 224]) };
// ResNet-18 in tfjs-core ops, NHWC (functions only: the Node.js bundle has no chained ops)
setThreadsCount(1); await tf.setBackend("wasm"); await tf.ready();
const all = readF32(`${dir}/resnet_w.bin`), index = JSON.parse(readFileSync(`${dir}/resnet_w.json`));
const w = name => tf.tensor(all.subarray(index[name].offset, index[name].offset + index[name].shape.reduce((a, b) => a * b, 1)), index[name].shape);
const conv = (name, stride, pad) => { const f = tf.transpose(w(`${name}.weight`), [2, 3, 1, 0]); return h => tf.conv2d(h, f, stride, pad); };
const bn = name => { const [m, v, b, g] = ["running_mean", "running_var", "bias", "weight"].map(k => w(`${name}.${k}`)); return h => tf.batchNorm(h, m, v, b, g, 1e-5); };
const widths = [[64, 64, 1], [64, 64, 1], [64, 128, 2], [128, 128, 1], [128, 256, 2], [256, 256, 1], [256, 512, 2], [512, 512, 1]];
const blocks = widths.map(([cin, cout, s], i) => ({
  c1: conv(`blocks.${i}.conv1`, s, 1), b1: bn(`blocks.${i}.bn1`), c2: conv(`blocks.${i}.conv2`, 1, 1), b2: bn(`blocks.${i}.bn2`),
  down: s !== 1 || cin !== cout ? [conv(`blocks.${i}.down.0`, s, 0), bn(`blocks.${i}.down.1`)] : null }));
const stem = conv("conv1", 2, 3), stemBn = bn("bn1"), fcW = tf.transpose(w("fc.weight")), fcB = w("fc.bias");
const tfForward = input => tf.tidy(() => {
  let h = tf.maxPool(tf.relu(stemBn(stem(tf.transpose(input, [0, 2, 3, 1])))), 3, 2, 1);
  for (const b of blocks) {
    const out = b.b2(b.c2(tf.relu(b.b1(b.c1(h)))));
    h = tf.relu(tf.add(out, b.down ? b.down[1](b.down[0](h)) : h));
  }
  return tf.add(tf.matMul(tf.mean(h, [1, 2]), fcW), fcB);
});
const tx = tf.tensor(x, [1, 3, 224, 224]);
const check = { tinychad: maxDiff(m.forward(x), want), ort: maxDiff((await session.run(feeds)).probs.data, want),
                tfjs: maxDiff(tfForward(tx).dataSync(), want) };
let tc = Infinity, o = Infinity, tj = Infinity;
for (let round = 0; round < 5; round++) {
  let t = cpuMs(); m.forward(x); tc = Math.min(tc, cpuMs() - t);
  t = cpuMs(); await session.run(feeds); o = Math.min(o, cpuMs() - t);
  t = cpuMs(); const y = tfForward(tx); y.dataSync(); y.dispose(); tj = Math.min(tj, cpuMs() - t);
}
console.log(JSON.stringify({ check, tinychad: tc, ort: o, tfjs: tj }));
"""


def probabilities(model: nn.Module):
  return lambda x: model((x - MEAN) / STD).softmax(axis=1)


JS = r"""
import * as ort from "onnxruntime-web";
import * as tf from "@tensorflow/tfjs-core";
import { setThreadsCount } from "@tensorflow/tfjs-backend-wasm";
import { readFileSync } from "node:fs";
// CPU time of this process (one thread computes): the shared machine's load barely moves it, where wall time doubles
const cpuMs = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1000; };
const dir = process.argv[2], batches = JSON.parse(process.argv[3]);
const W = JSON.parse(readFileSync(`${dir}/weights.json`));
ort.env.wasm.numThreads = 1; ort.env.wasm.simd = true;
setThreadsCount(1); await tf.setBackend("wasm"); await tf.ready();
const t = (name, shape) => tf.tensor(W[name].data, shape ?? W[name].shape);
// the CNN with tfjs-core ops, NHWC; batchnorm with its running statistics; flattened in PyTorch's (C, H, W) order
// tfjs-core's Node.js bundle has no chained ops (x.add): functions only
const norm = (x, i) => tf.batchNorm(x, t(`trunk.${i}.running_mean`), t(`trunk.${i}.running_var`), t(`trunk.${i}.bias`), t(`trunk.${i}.weight`), 1e-5);
const convW = {}, convB = {};
for (const i of [0, 4]) { convW[i] = tf.transpose(t(`trunk.${i}.weight`), [2, 3, 1, 0]); convB[i] = t(`trunk.${i}.bias`); }
const headW = tf.transpose(t("head.weight")), headB = t("head.bias");
const tfForward = x => tf.tidy(() => {
  let h = tf.div(tf.sub(tf.transpose(x, [0, 2, 3, 1]), 0.1307), 0.3081);
  for (const [c, b] of [[0, 1], [4, 5]]) h = tf.maxPool(tf.relu(norm(tf.add(tf.conv2d(h, convW[c], 1, "valid"), convB[c]), b)), 2, 2, "valid");
  return tf.softmax(tf.add(tf.matMul(tf.reshape(tf.transpose(h, [0, 3, 1, 2]), [x.shape[0], -1]), headW), headB));
});
function best(fn, reps) {
  for (let i = 0; i < Math.max(3, reps / 10); i++) fn();
  let bestMs = Infinity;
  for (let round = 0; round < 5; round++) {
    const start = cpuMs();
    for (let i = 0; i < reps; i++) fn();
    bestMs = Math.min(bestMs, (cpuMs() - start) / reps);
  }
  return bestMs;
}
async function bestAsync(fn, reps) {
  for (let i = 0; i < Math.max(3, reps / 10); i++) await fn();
  let bestMs = Infinity;
  for (let round = 0; round < 5; round++) {
    const start = cpuMs();
    for (let i = 0; i < reps; i++) await fn();
    bestMs = Math.min(bestMs, (cpuMs() - start) / reps);
  }
  return bestMs;
}
const readF32 = f => { const b = readFileSync(f); return new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength)); };
const maxDiff = (a, b) => a.reduce((m, v, i) => Math.max(m, Math.abs(v - b[i])), 0);
const results = {};
for (const b of batches) {
  const x = readF32(`${dir}/x${b}.bin`), want = readF32(`${dir}/want${b}.bin`);
  const reps = b === 1 ? 200 : 10;
  const { load } = await import(`${dir}/b${b}/model.js`);
  const m = await load();
  const session = await ort.InferenceSession.create(`${dir}/cnn${b}.onnx`, { executionProviders: ["wasm"] });
  const feeds = { x: new ort.Tensor("float32", x, [b, 1, 28, 28]) };
  const tx = tf.tensor(x, [b, 1, 28, 28]);
  const check = {
    tinychad: maxDiff(m.forward(x), want),
    ort: maxDiff((await session.run(feeds)).probs.data, want),
    tfjs: maxDiff(tfForward(tx).dataSync(), want),
  };
  results[b] = {
    check,
    tinychad: best(() => m.forward(x), reps),
    ort: await bestAsync(() => session.run(feeds), reps),
    tfjs: best(() => { const y = tfForward(tx); y.dataSync(); y.dispose(); }, reps),
  };
}
console.log(JSON.stringify(results));
"""


def wasm_table(model: nn.Module, twin: TorchCNN, state: dict[str, np.ndarray], tmp: Path) -> None:
  node_packages()
  rng = np.random.default_rng(1)
  sizes = {}
  (tmp / "weights.json").write_text(json.dumps({k: {"shape": list(v.shape), "data": np.asarray(v, np.float32).reshape(-1).tolist()}
                                                for k, v in state.items() if "num_batches" not in k}))
  for b in BATCHES:
    x = rng.random((b, 1, 28, 28), dtype=np.float32)
    (tmp / f"x{b}.bin").write_bytes(x.tobytes())
    with torch.no_grad(): (tmp / f"want{b}.bin").write_bytes(twin(torch.from_numpy(x)).numpy().tobytes())
    tinychad.export(probabilities(model), [Tensor(x)], target="wasm", out_dir=tmp / f"b{b}")
    torch.onnx.export(twin, (torch.from_numpy(x),), str(tmp / f"cnn{b}.onnx"), input_names=["x"], output_names=["probs"],
                      dynamo=False, opset_version=17)
    sizes[b] = (tmp / f"b{b}" / "model.wasm").stat().st_size
  script = NODE_DIR / "bench_export.mjs"
  script.write_text(JS)
  result = subprocess.run(["node", str(script), str(tmp), json.dumps(list(BATCHES))], capture_output=True, text=True, timeout=1200)
  if result.returncode != 0: raise RuntimeError(result.stderr[-3000:])
  times = json.loads(result.stdout.strip().splitlines()[-1])
  ort_wasm = (NODE_DIR / "node_modules/onnxruntime-web/dist/ort-wasm-simd-threaded.wasm").stat().st_size
  tfjs_wasm = (NODE_DIR / "node_modules/@tensorflow/tfjs-backend-wasm/dist/tfjs-backend-wasm-simd.wasm").stat().st_size
  weights = sum(np.asarray(v).nbytes for k, v in state.items() if "num_batches" not in k)
  print("\nMNIST CNN in Node.js", subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip(),
        "(WebAssembly, one thread; CPU ms per forward, best of 5 rounds)")
  print(f"{'batch':>5} {'tinychad .wasm':>15} {'ORT Web':>9} {'TF.js wasm':>11}   {'ORT/tinychad':>12} {'TF.js/tinychad':>14}   max |diff| vs torch")
  for b in BATCHES:
    r = times[str(b)]
    check = " ".join(f"{k} {v:.1e}" for k, v in r["check"].items())
    print(f"{b:5d} {r['tinychad']:15.3f} {r['ort']:9.3f} {r['tfjs']:11.3f}   {r['ort'] / r['tinychad']:12.2f} "
          f"{r['tfjs'] / r['tinychad']:14.2f}   {check}")
    assert max(r["check"].values()) < 1e-4, r["check"]
  onnx_bytes = (tmp / "cnn1.onnx").stat().st_size
  print(f"download: tinychad model.wasm (weights inside) {sizes[1] / 1e3:.0f} kB | ORT Web .wasm {ort_wasm / 1e6:.1f} MB "
        f"+ .onnx {onnx_bytes / 1e3:.0f} kB | TF.js wasm {tfjs_wasm / 1e3:.0f} kB + weights {weights / 1e3:.0f} kB (+ its JS)")


def native_table(model: nn.Module, twin: TorchCNN, tmp: Path) -> None:
  cc = shutil.which(os.getenv("CC", "cc")) or "cc"
  print(f"\nMNIST CNN native (ms per forward, best of 5): exported C ({Path(cc).name} -O2 -march=native, 1 thread), "
        f"tinychad ({os.cpu_count()} cores), PyTorch ({torch.get_num_threads()} threads)")
  print(f"{'batch':>5} {'exported C':>11} {'tinychad':>9} {'PyTorch':>8}   {'tinychad/C':>10} {'PyTorch/C':>9}")
  fn = probabilities(model)
  for b in BATCHES:
    x = np.random.default_rng(2).random((b, 1, 28, 28), dtype=np.float32)
    out = tmp / f"c{b}"
    tinychad.export(fn, [Tensor(x)], target="c", out_dir=out)
    subprocess.run([cc, "-O2", "-march=native", "-shared", "-fPIC", str(out / "model.c"), "-o", str(out / "model.so"), "-lm"],
                   check=True, capture_output=True)
    lib = ctypes.CDLL(str(out / "model.so"))
    y = np.zeros((b, 10), np.float32)
    run_c = lambda: lib.model_forward(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(y.ctypes.data))
    xt, tx = Tensor(x), torch.from_numpy(x)
    reps = 200 if b == 1 else 10

    def torch_run():
      with torch.no_grad(): twin(tx)
    c_ms, tc_ms, torch_ms = (_best(f, reps) for f in (run_c, lambda: fn(xt).numpy(), torch_run))
    with torch.no_grad(): assert np.abs(y - twin(tx).numpy()).max() < 1e-4
    print(f"{b:5d} {c_ms:11.3f} {tc_ms:9.3f} {torch_ms:8.3f}   {tc_ms / c_ms:10.2f} {torch_ms / c_ms:9.2f}")


def _best(fn, reps: int) -> float:
  for _ in range(max(3, reps // 10)): fn()
  rounds = []
  for _ in range(5):
    start = time.perf_counter()
    for _ in range(reps): fn()
    rounds.append((time.perf_counter() - start) / reps * 1e3)
  return min(rounds)


def main() -> None:
  model, twin, state = models()
  with tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
    if "--resnet-only" not in sys.argv:
      wasm_table(model, twin, state, Path(tmp))
      native_table(model, twin, Path(tmp))
    if "--resnet" in sys.argv or "--resnet-only" in sys.argv:
      node_packages()
      resnet_row(Path(tmp))


if __name__ == "__main__":
  main()
