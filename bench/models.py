"""Workload: models as users write them (issue 22's table), tinychad eager and TinyJit beside PyTorch eager.

`python bench/models.py [--quick]` prints one table, every number from the same run, each library at 2
threads: ResNet-18 inference and SGD-momentum train step (batch 8, 3x96x96), a GPT (4 layers, d 256, 4 heads,
T 128, batch 8) AdamW train step, GPT generation (prompt 16, 256 new tokens, batch 1, a user-written loop
whose KV cache concatenates keys and values), an LSTM language model (2 layers, hidden 256, T 64, batch 16)
SGD-momentum train step, a ViT (6 layers, d 192, 3 heads, 32x32 images, patch 4) AdamW train step (batch
16), and bench/small_ops.py's 1000 tiny realized ops.

Each model is written once, in `define(lib)`, the way a PyTorch user writes it (nn layers, `forward`), and
built twice from the same text: with torch.nn and with tinychad.nn (what porting means: the imports
change). A worker process per variant (tinychad eager, tinychad TinyJit, torch, tinygrad) lives through the run.
At each workload every worker prepares it: the first call (timed; the tinychad eager worker goes first, over an
empty kernel cache, so its first call is the compile time, and the TinyJit worker runs over that cache), then in
the eager worker a check (the torch twin's weights loaded by name from its state dict, one output compared), then
two warm-up calls (TinyJit records on its second or third call). Then the workers take turns, each turn a call
that warms the caches the other workers' turns left cold and a timed call, and each variant's time is the median
of its timed calls: a shared machine whose speed drifts moves every variant alike instead of the one that
happened to run during a slow minute.
--parallel prepares the variants at once (a busy machine; the timed calls still take turns); --quick: small
models and 2 rounds (its smoke test: test/test_bench_models.py). tinygrad runs the ResNet-18 rows and the GPT training
row through bench/tinygrad_port.py (the few torch.nn classes tinygrad 0.14 lacks, written as a porting user would),
under its TinyJit (its best, as the last column compares tinychad's best), and the tiny-ops row eagerly; the LSTM
and ViT use layers it has no counterpart for (LSTM, TransformerEncoderLayer), and its generation compiles new kernels
at every token: each row says why.
"""
from __future__ import annotations
import argparse
import json
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

if __package__ in (None, ""): sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import REPO_ROOT, describe, limit_threads, tinygrad_realize, unavailable_reason, worker_env

THREADS = 2
VARIANTS = ("tinychad eager", "tinychad TinyJit", "torch eager", "tinygrad")
# each workload's time is the median of this many calls per variant, taken in turns (generation too: one call of
# 256 tokens moved by 1.4x between runs on a shared VM)
TIMED_CALLS = 5
# the longest one command may take a worker (a first call compiles every kernel of a model)
WORKER_TIMEOUT_S = 1800
# between two workers' turns: torch's OpenMP threads spin a little after a call before they sleep
TURN_PAUSE_S = 0.05
# torch's TransformerEncoder warns that norm_first layers take its plain path: the path a tinychad user ports
warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
# one output of the tinychad model against its torch twin: float32 through up to ~20 layers
CHECK_ATOL, CHECK_RTOL = 2e-3, 2e-3


# ---- the models, written once for torch.nn and tinychad.nn ----

def library(name: str) -> SimpleNamespace:
  """What the model code needs from a library: nn, F, and the few tensor functions whose names differ."""
  if name == "torch":
    import torch
    from torch import nn
    import torch.nn.functional as F
    return SimpleNamespace(name=name, nn=nn, F=F, optim=torch.optim, cat=lambda ts, dim: torch.cat(ts, dim),
                           arange=torch.arange, zeros=torch.zeros, randn=torch.randn, randint=torch.randint,
                           no_grad=torch.no_grad)
  if name == "tinygrad":
    from bench.tinygrad_port import library as tinygrad_library
    return tinygrad_library()
  from tinychad import Tensor, nn, no_grad
  from tinychad.nn import functional as F, optim
  return SimpleNamespace(name=name, nn=nn, F=F, optim=optim, cat=lambda ts, dim: ts[0].cat(*ts[1:], dim=dim),
                         arange=Tensor.arange, zeros=Tensor.zeros, randn=Tensor.randn,
                         randint=lambda low, high, size: Tensor.randint(low, high, size=size), no_grad=no_grad)


def define(lib: SimpleNamespace) -> SimpleNamespace:
  """The model classes, in the library's nn (torchvision's ResNet-18, a nanoGPT, an LSTM LM, a ViT)."""
  nn, F = lib.nn, lib.F

  class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
      super().__init__()
      self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
      self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
      self.downsample = None
      if stride != 1 or cin != cout:
        self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
      out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
      return F.relu(out + (x if self.downsample is None else self.downsample(x)))

  class ResNet18(nn.Module):
    def __init__(self, classes: int = 1000):
      super().__init__()
      self.conv1, self.bn1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64)
      self.maxpool = nn.MaxPool2d(3, 2, 1)
      widths = (64, 128, 256, 512)
      for i, width in enumerate(widths):
        cin, stride = widths[max(i - 1, 0)], 1 if i == 0 else 2
        setattr(self, f"layer{i + 1}", nn.Sequential(BasicBlock(cin, width, stride), BasicBlock(width, width, 1)))
      self.avgpool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(512, classes)

    def forward(self, x):
      x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
      x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
      return self.fc(self.avgpool(x).flatten(1))

  class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
      super().__init__()
      self.heads, self.c_attn, self.c_proj = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x, cache=None):
      batch, steps, dim = x.shape
      q, k, v = (t.reshape(batch, steps, self.heads, dim // self.heads).transpose(1, 2)
                 for t in self.c_attn(x).chunk(3, dim=2))
      if cache is not None: k, v = lib.cat([cache[0], k], 2), lib.cat([cache[1], v], 2)
      y = F.scaled_dot_product_attention(q, k, v, is_causal=steps > 1)
      return self.c_proj(y.transpose(1, 2).reshape(batch, steps, dim)), (k, v)

  class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
      super().__init__()
      self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(dim), CausalSelfAttention(dim, heads), nn.LayerNorm(dim)
      self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, cache=None):
      attended, cache = self.attn(self.ln_1(x), cache)
      x = x + attended
      return x + self.mlp(self.ln_2(x)), cache

  class GPT(nn.Module):
    def __init__(self, vocab: int, context: int, layers: int, dim: int, heads: int):
      super().__init__()
      self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
      self.h = nn.ModuleList([Block(dim, heads) for _ in range(layers)])
      self.ln_f, self.lm_head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, idx, caches=None, start: int = 0):
      """Logits; with `caches` (a list of (k, v) per layer, or of None) also the caches grown by idx."""
      x = self.wte(idx) + self.wpe(lib.arange(start, start + idx.shape[1]))
      grown = []
      for i, block in enumerate(self.h):
        x, cache = block(x, None if caches is None else caches[i])
        grown.append(cache)
      logits = self.lm_head(self.ln_f(x))
      return logits if caches is None else (logits, grown)

  class LSTMLanguageModel(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int):
      super().__init__()
      self.embed, self.lstm = nn.Embedding(vocab, hidden), nn.LSTM(hidden, hidden, num_layers=layers)
      self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens):
      out, _ = self.lstm(self.embed(tokens))
      return self.head(out)

  class ViT(nn.Module):
    def __init__(self, image: int, patch: int, layers: int, dim: int, heads: int, classes: int = 10):
      super().__init__()
      self.patch_embed = nn.Conv2d(3, dim, patch, patch)
      self.cls_token = nn.Parameter(lib.zeros(1, 1, dim))
      self.pos_embed = nn.Parameter(lib.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
      layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
      self.encoder = nn.TransformerEncoder(layer, layers)
      self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

    def forward(self, images):
      x = self.patch_embed(images).flatten(2).transpose(1, 2)
      x = lib.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
      return self.head(self.norm(self.encoder(x)[:, 0]))

  return SimpleNamespace(ResNet18=ResNet18, GPT=GPT, LSTMLanguageModel=LSTMLanguageModel, ViT=ViT)


# ---- workloads: each builds, for one library, the model, its inputs and the call that is timed ----

@dataclass
class Run:
  """One workload built in one library: `call()` is timed (the work done and realized); `output()` is the
  one output compared with the torch twin; `model` is what the twin's weights load into. `call` takes
  `inputs` (the batch), as a user's jitted step takes its batch: a TinyJit reads them as its inputs, where
  tensors it finds in a closure are fixed data whose kernels a replay may skip (engine/jit.py)."""
  model: object
  call: Callable[..., object]
  output: Callable[[], object]
  jittable: bool = True
  inputs: tuple = ()


@dataclass
class Workload:
  name: str
  unit: str                 # "ms" (lower is better) or "tok/s"
  amount: float             # tokens per call for tok/s
  build: Callable[[SimpleNamespace, bool], Run]
  tinygrad_reason: str = ""     # why tinygrad doesn't run the row ("": it does, through bench/tinygrad_port.py)


def _inputs(lib: SimpleNamespace, *arrays):
  if lib.name == "torch":
    import torch
    return [torch.tensor(a) for a in arrays]
  if lib.name == "tinygrad": from tinygrad import Tensor
  else: from tinychad import Tensor
  return [Tensor(a).realize() for a in arrays]


def _done(lib: SimpleNamespace, *tensors):
  """tinychad and tinygrad compute lazily: realize what the call made (torch has computed it already), and wait for
  tinygrad's CPU queue, which returns before its kernels are done."""
  if lib.name == "tinygrad": tinygrad_realize(*tensors)
  elif lib.name == "tinychad": tensors[0].realize(*tensors[1:])
  return tensors[0]


def _train_step(lib: SimpleNamespace, model, opt, loss_of: Callable) -> Callable[..., object]:
  def step(*inputs):
    opt.zero_grad()
    loss = loss_of(*inputs)
    loss.backward()
    opt.step()
    return _done(lib, loss)
  return step


def _rng():
  import numpy as np
  return np.random.default_rng(0)


def resnet_inference(lib: SimpleNamespace, quick: bool) -> Run:
  batch, size = (2, 32) if quick else (8, 96)
  model = define(lib).ResNet18()
  model.eval()
  (images,) = _inputs(lib, _rng().standard_normal((batch, 3, size, size)).astype("float32"))

  def call(images):
    with lib.no_grad(): return _done(lib, model(images))
  return Run(model, call, lambda: call(images), inputs=(images,))


def resnet_train(lib: SimpleNamespace, quick: bool) -> Run:
  batch, size = (2, 32) if quick else (8, 96)
  model = define(lib).ResNet18()
  model.train()
  rng = _rng()
  images, labels = _inputs(lib, rng.standard_normal((batch, 3, size, size)).astype("float32"), rng.integers(0, 1000, batch))
  opt = lib.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
  return Run(model, _train_step(lib, model, opt, lambda images, labels: lib.F.cross_entropy(model(images), labels)),
             lambda: _done(lib, model(images)), inputs=(images, labels))


def gpt_sizes(quick: bool) -> dict:
  return dict(vocab=128, context=64, layers=1, dim=64, heads=2) if quick else \
    dict(vocab=1024, context=512, layers=4, dim=256, heads=4)


def gpt_train(lib: SimpleNamespace, quick: bool) -> Run:
  batch, steps = (2, 16) if quick else (8, 128)
  sizes = gpt_sizes(quick)
  model = define(lib).GPT(**sizes)
  model.train()
  rng = _rng()
  tokens, targets = _inputs(lib, *(rng.integers(0, sizes["vocab"], (batch, steps)) for _ in range(2)))
  opt = lib.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
  loss_of = lambda tokens, targets: lib.F.cross_entropy(model(tokens).reshape(batch * steps, sizes["vocab"]), targets.reshape(batch * steps))  # noqa: E731
  return Run(model, _train_step(lib, model, opt, loss_of), lambda: _done(lib, model(tokens)), inputs=(tokens, targets))


def gpt_generation_lengths(quick: bool) -> tuple[int, int]:
  return (4, 6) if quick else (16, 256)


def gpt_generate(lib: SimpleNamespace, quick: bool) -> Run:
  """Greedy decoding, batch 1, the loop a user writes: each layer's keys and values concatenated per token."""
  prompt_len, new_tokens = gpt_generation_lengths(quick)
  sizes = gpt_sizes(quick)
  model = define(lib).GPT(**sizes)
  model.eval()
  (prompt,) = _inputs(lib, _rng().integers(0, sizes["vocab"], (1, prompt_len)))

  def generate():
    with lib.no_grad():
      logits, caches = model(prompt, [None] * sizes["layers"], 0)
      tokens = [_done(lib, logits[:, -1].argmax(-1, keepdim=True))]
      for i in range(new_tokens - 1):
        logits, caches = model(tokens[-1], caches, prompt_len + i)
        tokens.append(_done(lib, logits[:, -1].argmax(-1, keepdim=True), *(t for kv in caches for t in kv)))
      return tokens[-1]

  def output():
    with lib.no_grad(): return _done(lib, model(prompt))
  return Run(model, generate, output, jittable=False)


def lstm_train(lib: SimpleNamespace, quick: bool) -> Run:
  steps, batch, hidden, vocab = (8, 2, 32, 64) if quick else (64, 16, 256, 1024)
  model = define(lib).LSTMLanguageModel(vocab, hidden, 2)
  model.train()
  rng = _rng()
  tokens, targets = _inputs(lib, *(rng.integers(0, vocab, (steps, batch)) for _ in range(2)))
  opt = lib.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
  loss_of = lambda tokens, targets: lib.F.cross_entropy(model(tokens).reshape(steps * batch, vocab), targets.reshape(steps * batch))  # noqa: E731
  return Run(model, _train_step(lib, model, opt, loss_of), lambda: _done(lib, model(tokens)), inputs=(tokens, targets))


def vit_train(lib: SimpleNamespace, quick: bool) -> Run:
  batch, layers, dim = (2, 1, 48) if quick else (16, 6, 192)
  model = define(lib).ViT(32, 4, layers, dim, 3)
  model.train()
  rng = _rng()
  images, labels = _inputs(lib, rng.standard_normal((batch, 3, 32, 32)).astype("float32"), rng.integers(0, 10, batch))
  opt = lib.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
  return Run(model, _train_step(lib, model, opt, lambda images, labels: lib.F.cross_entropy(model(images), labels)),
             lambda: _done(lib, model(images)), inputs=(images, labels))


def tiny_ops(lib: SimpleNamespace, quick: bool) -> Run:
  from bench import small_ops
  call = {"torch": small_ops.torch_adds, "tinychad": small_ops.tinychad_adds, "tinygrad": small_ops.tinygrad_adds}[lib.name]()
  return Run(None, call, lambda: None, jittable=False)


def workloads(quick: bool) -> list[Workload]:
  batch, size = (2, 32) if quick else (8, 96)
  prompt_len, new_tokens = gpt_generation_lengths(quick)
  gpt = gpt_sizes(quick)
  from bench.small_ops import OPS
  return [
    Workload(f"ResNet-18 inference, batch {batch}, 3x{size}x{size}", "ms", 0, resnet_inference),
    Workload(f"ResNet-18 train step (SGD momentum), batch {batch}, 3x{size}x{size}", "ms", 0, resnet_train),
    Workload(f"GPT {gpt['layers']}L d{gpt['dim']} {gpt['heads']}h train step (AdamW), batch {2 if quick else 8} x T {16 if quick else 128}",
             "ms", 0, gpt_train),
    Workload(f"LSTM LM 2L hidden {32 if quick else 256} train step (SGD momentum), T {8 if quick else 64}, batch {2 if quick else 16}",
             "ms", 0, lstm_train, tinygrad_reason="tinygrad.nn has no LSTM (LSTMCell only)"),
    Workload(f"ViT {1 if quick else 6}L d{48 if quick else 192} 3h train step (AdamW), 32x32 patch 4, batch {2 if quick else 16}",
             "ms", 0, vit_train, tinygrad_reason="tinygrad.nn has no TransformerEncoderLayer"),
    Workload(f"{OPS} tiny realized ops (a+b, 4 floats; bench/small_ops.py)", "ms", 0, tiny_ops),
    Workload(f"GPT generation, prompt {prompt_len}, {new_tokens} new tokens, KV cache by concatenation, batch 1",
             "tok/s", new_tokens, gpt_generate,
             tinygrad_reason="not run: tinygrad compiles new kernels for every cache length (6 tokens: a 23 s first call)"),
  ]


# ---- worker: one variant's process; it prepares a workload, then times one call at a time when asked ----

def check_against_torch(workload: Workload, run: Run, quick: bool) -> float:
  """Load the torch twin's weights into the tinychad model and compare one output; the largest difference."""
  import numpy as np
  import torch
  from tinychad.nn.state import load_state_dict
  torch.manual_seed(0)
  twin = workload.build(library("torch"), quick)
  load_state_dict(run.model, {name: t.detach().numpy() for name, t in twin.model.state_dict().items()})
  ours, theirs = run.output().numpy(), twin.output().detach().numpy()
  np.testing.assert_allclose(ours, theirs, atol=CHECK_ATOL, rtol=CHECK_RTOL, err_msg=f"{workload.name}: tinychad vs torch")
  return float(np.abs(ours - theirs).max())


def prepare(variant: str, workload: Workload, lib: SimpleNamespace, quick: bool) -> tuple[Run | None, dict]:
  """The workload built for `variant`, its first call timed, checked against torch (tinychad eager) and warmed up:
  (the run, ready to time; its report). The run is None when the variant can't run it (the report says why)."""
  report: dict = {"case": workload.name}
  if lib.name == "tinygrad" and workload.tinygrad_reason:
    report["error"] = workload.tinygrad_reason
    return None, report
  try:
    run = workload.build(lib, quick)
    if variant == "tinychad TinyJit":
      if not run.jittable:
        report["error"] = "no TinyJit form (shapes change every call)" if workload.unit == "tok/s" else "eager by definition"
        return None, report
      from tinychad import TinyJit
      run.call = TinyJit(run.call)
    if variant == "tinygrad" and run.jittable:
      # tinygrad's best, as the last column compares tinychad's best: its TinyJit, whose replay skips the call's body
      # (and with it the wait for tinygrad's CPU queue), so the wait comes after
      from tinygrad import TinyJit as TinygradJit
      jitted = TinygradJit(run.call)
      run.call = lambda *inputs: tinygrad_realize(jitted(*inputs))
    # the first call before the check against torch: the check's forward would compile the forward's kernels first
    start = time.perf_counter()
    run.call(*run.inputs)
    report["first_s"] = time.perf_counter() - start
    if variant == "tinychad eager" and run.model is not None: report["max_diff"] = check_against_torch(workload, run, quick)
    # warm-up: TinyJit records on its second call, or its third where the first call makes optimizer state
    run.call(*run.inputs)
    run.call(*run.inputs)
    return run, report
  except Exception as e:  # one failing workload must not take down the others
    report["error"] = describe(e)
    return None, report


def _library_of(variant: str, cpu_time: bool) -> tuple[SimpleNamespace, Callable[[], float]]:
  """The variant's library (its threads pinned) and the clock its calls are timed with."""
  lib_name = variant.split()[0]
  limit_threads(lib_name, 1 if cpu_time else THREADS)
  lib = library(lib_name)
  return lib, time.process_time if cpu_time else time.perf_counter


def run_variant(variant: str, quick: bool, names: list[str] | None = None, cpu_time: bool = False) -> list[dict]:
  """Every workload (or those named) prepared and timed in this process for `variant` alone, one report each
  (the median of its timed calls): the smoke test's way in. The table times the variants in turns (run_all)."""
  lib, clock = _library_of(variant, cpu_time)
  reports = []
  for workload in workloads(quick):
    if names is not None and workload.name not in names: continue
    run, report = prepare(variant, workload, lib, quick)
    reports.append(report)
    if run is None: continue
    try:
      report["median_s"] = statistics.median(_timed(run, clock) for _ in range(2 if quick else TIMED_CALLS))
    except Exception as e:
      report["error"] = describe(e)
  return reports


def _timed(run: Run, clock: Callable[[], float]) -> float:
  start = clock()
  run.call(*run.inputs)
  return clock() - start


def serve(variant: str, quick: bool, cpu_time: bool) -> None:
  """The worker's loop: one JSON command a line on stdin, one BENCH line back for each. {"prepare": name} builds
  that workload (dropping the last one) and reports its first call; {"time": true} calls it twice and times the
  second."""
  lib, clock = _library_of(variant, cpu_time)
  by_name = {w.name: w for w in workloads(quick)}
  run: Run | None = None
  for line in sys.stdin:
    command = json.loads(line)
    if "prepare" in command:
      run = None     # the last workload's model goes before the next one is built
      run, reply = prepare(variant, by_name[command["prepare"]], lib, quick)
    else:
      try:
        # a call first, untimed: the other workers' turns left this process's caches cold
        run.call(*run.inputs)
        reply = {"seconds": _timed(run, clock)}
      except Exception as e:
        reply = {"error": describe(e)}
    print("BENCH " + json.dumps(reply), flush=True)


# ---- parent: a worker per variant, kept for the whole run; the variants take turns at each workload's calls ----

class Worker:
  """One variant's process (serve), asked one command at a time. A reader thread queues its BENCH lines, so a
  worker that dies or hangs gives a reply with an error instead of blocking the run."""
  def __init__(self, variant: str, quick: bool, cache_dir: str, flags: list[str]):
    self.variant = variant
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", variant] + (["--quick"] if quick else []) + flags
    threads = 1 if "--cpu-time" in flags else THREADS
    self.stderr = tempfile.TemporaryFile(mode="w+")     # read only when the worker dies: a pipe could fill and block it
    self.proc = subprocess.Popen(cmd, env=worker_env(variant.split()[0], threads, cache_dir), cwd=REPO_ROOT,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True)
    self.replies: queue.Queue = queue.Queue()
    threading.Thread(target=self._read, daemon=True).start()
    self.failure = ""

  def _read(self) -> None:
    for line in self.proc.stdout:
      if line.startswith("BENCH "): self.replies.put(json.loads(line[len("BENCH "):]))
    self.replies.put(None)     # end of output: the worker exited

  def send(self, command: dict) -> None:
    if self.failure: return
    try:
      self.proc.stdin.write(json.dumps(command) + "\n")
      self.proc.stdin.flush()
    except OSError:
      pass       # it died: the reply says so

  def reply(self) -> dict:
    if self.failure: return {"error": self.failure}
    try:
      reply = self.replies.get(timeout=WORKER_TIMEOUT_S)
    except queue.Empty:
      self.proc.kill()
      self.failure = f"worker timed out after {WORKER_TIMEOUT_S} s"
      return {"error": self.failure}
    if reply is None:
      self.proc.wait()
      self.stderr.seek(0)
      self.failure = "worker died: " + ((self.stderr.read().strip().splitlines() or ["no output"])[-1])[:160]
      return {"error": self.failure}
    return reply

  def ask(self, command: dict) -> dict:
    self.send(command)
    return self.reply()

  def close(self) -> None:
    if self.proc.poll() is None:
      self.proc.stdin.close()
      try:
        self.proc.wait(timeout=60)
      except subprocess.TimeoutExpired:
        self.proc.kill()
    self.stderr.close()


def run_all(quick: bool, parallel: bool, flags: list[str], names: list[str] | None) -> dict[str, dict[str, dict]]:
  """Every variant's reports. A worker per variant lives through the run. At each workload, the tinychad eager
  worker prepares it first, over an empty kernel cache (its first call compiles), then the TinyJit worker over the
  cache it filled, then torch and tinygrad; with `parallel` (a shared machine where one at a time would not
  finish) they prepare at once, TinyJit over an empty cache of its own. Then the timed calls go round the workers,
  one call each per round, the first worker of a round moving by one each time: a machine whose speed drifts
  over minutes moves every variant alike, where one worker after the other would put the drift into the ratios."""
  caches = [tempfile.mkdtemp(prefix="tinychad-bench-cache-") for _ in range(2)]
  workers: dict[str, Worker] = {}
  results: dict[str, dict[str, dict]] = {variant: {} for variant in VARIANTS}
  try:
    for variant in VARIANTS:
      reason = unavailable_reason(variant.split()[0])
      if reason: results[variant] = {w.name: {"case": w.name, "error": reason} for w in workloads(quick)}
      else: workers[variant] = Worker(variant, quick, caches[parallel and variant == "tinychad TinyJit"], flags)
    for workload in workloads(quick):
      if names is not None and workload.name not in names: continue
      started = time.perf_counter()
      reports = _prepare_all(workers, workload, parallel)
      ready = [variant for variant, report in reports.items() if "error" not in report]
      times: dict[str, list[float]] = {variant: [] for variant in ready}
      for turn in range(2 if quick else TIMED_CALLS):
        shift = turn % max(1, len(ready))
        for variant in ready[shift:] + ready[:shift]:
          reply = workers[variant].ask({"time": True})
          if "error" in reply: reports[variant]["error"] = reply["error"]
          else: times[variant].append(reply["seconds"])
          time.sleep(TURN_PAUSE_S)
      for variant in ready:
        if "error" not in reports[variant]: reports[variant]["median_s"] = statistics.median(times[variant])
      for variant, report in reports.items(): results[variant][workload.name] = report
      print(f"[bench] models: {workload.name}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
  finally:
    for worker in workers.values(): worker.close()
    for cache in caches: shutil.rmtree(cache, ignore_errors=True)
  return results


def _prepare_all(workers: dict[str, Worker], workload: Workload, parallel: bool) -> dict[str, dict]:
  """Each worker's report of preparing `workload`: one after another in VARIANTS order, or all at once."""
  if parallel:
    for worker in workers.values(): worker.send({"prepare": workload.name})
    return {variant: {"case": workload.name, **worker.reply()} for variant, worker in workers.items()}
  return {variant: {"case": workload.name, **worker.ask({"prepare": workload.name})} for variant, worker in workers.items()}


def format_table(quick: bool, results: dict[str, dict[str, dict]], names: list[str] | None = None) -> str:
  footnotes: list[str] = []

  def cell(workload: Workload, report: dict) -> str:
    if report.get("median_s") is not None:
      value = report["median_s"] * 1e3 if workload.unit == "ms" else workload.amount / report["median_s"]
      return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"
    if report["error"] not in footnotes: footnotes.append(report["error"])
    return f"n/a [{footnotes.index(report['error']) + 1}]"

  def ratio(mine: dict, theirs: dict) -> str:
    if mine.get("median_s") is None or theirs.get("median_s") is None: return "-"
    return f"{mine['median_s'] / theirs['median_s']:.2f}x"

  header = ["workload", "unit", *VARIANTS, "tinychad 1st call (s, empty cache)", "eager / torch", "TinyJit / torch",
            "tinychad best / tinygrad"]
  lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 2)]
  for workload in workloads(quick):
    if names is not None and workload.name not in names: continue
    reports = {variant: results[variant][workload.name] for variant in VARIANTS}
    eager, jit, torch_, tinygrad = (reports[v] for v in VARIANTS)
    first = eager.get("first_s")
    best = min((r for r in (eager, jit) if r.get("median_s") is not None), key=lambda r: r["median_s"], default={})
    cells = [workload.name, workload.unit] + [cell(workload, reports[v]) for v in VARIANTS]
    cells += [f"{first:.1f}" if first is not None else "-", ratio(eager, torch_), ratio(jit, torch_), ratio(best, tinygrad)]
    lines.append("| " + " | ".join(cells) + " |")
  lines.append("")
  lines += [f"[{i + 1}] {reason}" for i, reason in enumerate(footnotes)]
  checks = [f"{name}: {report['max_diff']:.1e}" for name, report in results["tinychad eager"].items() if "max_diff" in report]
  lines.append("")
  lines.append("tinychad vs torch twin, largest difference of one output before timing: " + "; ".join(checks))
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="small models, 2 timed calls (a smoke test)")
  parser.add_argument("--parallel", action="store_true",
                      help="the variants prepare each workload at once (a busy machine); the timed calls still take turns")
  parser.add_argument("--cpu-time", action="store_true",
                      help="1 thread per library, timed in CPU seconds of the worker (process_time): barely moved by a busy machine")
  parser.add_argument("--only", nargs="*", metavar="WORD", help="the workloads whose names contain one of these words (any case)")
  parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  names = None if args.only is None else [w.name for w in workloads(args.quick) if any(word.lower() in w.name.lower() for word in args.only)]
  if args.worker:
    serve(args.worker, args.quick, args.cpu_time)
    return
  start = time.perf_counter()
  flags = (["--cpu-time"] if args.cpu_time else []) + (["--only", *args.only] if args.only is not None else [])
  results = run_all(args.quick, args.parallel, flags, names)
  print(format_table(args.quick, results, names))
  clock = "CPU time of the worker process (1 thread each)" if args.cpu_time else f"wall time, {THREADS} threads for every library"
  print(f"\nms: lower is better; tok/s: higher is better. Ratios are times (> 1x: tinychad is slower). {clock};"
        f" medians of {2 if args.quick else TIMED_CALLS} calls after two warm-ups, the variants taking turns, all in this run"
        f" ({time.perf_counter() - start:.0f} s{', --quick: small models' if args.quick else ''}"
        f"{'; --parallel: the workers prepared each workload at once' if args.parallel else ''}).")


if __name__ == "__main__": main()
