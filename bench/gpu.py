"""`python -m bench.gpu [--quick] [--out FILE]`: the GPU table of issue 25, tinychad's CUDA device next to PyTorch
on the same GPU, in one process and one run.

Rows: matmul 4096 in float32 and float16, a*b+c and a softmax row (with the GB/s they reach against the GPU's
peak memory bandwidth), conv3x3 x2 forward+backward (bench/conv.py), the CNN training step (bench/cnn_train.py),
GPT forward (bench/gpt.py) and a GPT training step (bench/models.py's nanoGPT, AdamW). Each library builds a
row's computation on its GPU, runs it twice (tinychad compiles its kernels then), then the median of the
timed calls, each followed by a wait for the GPU (tinychad: Device["CUDA"].synchronize(), PyTorch:
torch.cuda.synchronize()). The simple rows also compare the two results, so a wrong answer shows beside
its speed. Targets (issue 25): matmul >= 70% of cuBLAS, the a*b+c and softmax rows >= 80% of peak bandwidth,
the training steps within 2x of PyTorch eager.
Where CUDA can't run (no driver, no GPU) it exits with the reason. STATUS: written without a GPU; it has
never run (docs/gpu.md).
"""
from __future__ import annotations
import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

if __package__ in (None, ""): sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import numpy as np


def _median_ms(call: Callable[[], object], sync: Callable[[], None], warmup: int, repeats: int) -> float:
  for _ in range(warmup): call()
  sync()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    call()
    sync()
    times.append(time.perf_counter() - start)
  return statistics.median(times) * 1e3


class Side:
  """One library on its device (the GPU): tensors from numpy arrays, the wait for the device, a result as numpy."""
  def __init__(self, name: str, device: str):
    self.name = name
    if name == "tinychad":
      from tinychad import Device, Tensor
      Device.DEFAULT = device        # the shared bench builders make their tensors on the default device
      self.device = Device[device]
      self.tensor = lambda a: Tensor(a, device=device).realize()
      self.sync = getattr(self.device, "synchronize", lambda: None)    # the CPU devices return when done
      self.numpy = lambda t: t.numpy()
    else:
      import torch
      where = "cuda" if device == "CUDA" else "cpu"
      torch.set_default_device(where)   # likewise for torch's builders
      self.tensor = lambda a: torch.from_numpy(a).to(where)
      self.sync = torch.cuda.synchronize if where == "cuda" else (lambda: None)
      self.numpy = lambda t: t.float().cpu().numpy()


def _simple_rows(n: int, size: int, rows: int, cols: int) -> list[tuple]:
  """(name, unit, work per call, build(side, arrays) -> call, the arrays, bytes moved or None)."""
  rng = np.random.default_rng(0)
  a32, b32 = rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32)
  x, y, z = (rng.standard_normal(size, np.float32) for _ in range(3))
  logits = rng.standard_normal((rows, cols), np.float32)

  def matmul(side, a, b):
    ta, tb = side.tensor(a), side.tensor(b)
    return (lambda: (ta @ tb).realize()) if side.name == "tinychad" else (lambda: ta @ tb)

  def chain(side, a, b, c):
    ta, tb, tc = side.tensor(a), side.tensor(b), side.tensor(c)
    return (lambda: (ta * tb + tc).realize()) if side.name == "tinychad" else (lambda: ta * tb + tc)

  def softmax(side, a):
    t = side.tensor(a)
    return (lambda: t.softmax(-1).realize()) if side.name == "tinychad" else (lambda: t.softmax(-1))
  return [(f"matmul {n} fp32", "GFLOP/s", 2 * n ** 3 / 1e9, matmul, (a32, b32), None),
          (f"matmul {n} fp16", "GFLOP/s", 2 * n ** 3 / 1e9, matmul, (a32.astype(np.float16), b32.astype(np.float16)), None),
          (f"a*b+c {size}", "GB/s", 16 * size / 1e9, chain, (x, y, z), 16 * size),
          (f"softmax {rows}x{cols}", "GB/s", 8 * rows * cols / 1e9, softmax, (logits,), 8 * rows * cols)]


def _model_rows(quick: bool) -> list[tuple]:
  """(name, build(side) -> call): the shared bench builders, run on each library's default device (the GPU)."""
  from bench import cnn_train, conv, gpt, models
  conv_batch, cnn_batch, (gpt_batch, gpt_seq) = (8, 16, (2, 64)) if quick else (64, 128, (8, 128))

  def gpt_train(side):
    run = models.gpt_train(models.library("torch" if side.name == "torch" else "tinychad"), quick)
    return run.call
  return [(f"conv3x3 x2 fwd+bwd b{conv_batch}", lambda side: getattr(conv, f"{side.name}_convs")(conv_batch)),
          (f"cnn train step b{cnn_batch}", lambda side: getattr(cnn_train, f"{side.name}_step")(cnn_batch)),
          (f"gpt forward b{gpt_batch}x{gpt_seq}", lambda side: getattr(gpt, f"{side.name}_gpt")(gpt_batch, gpt_seq)),
          ("gpt train step (bench/models.py)", gpt_train)]


def _describe(device, where: str) -> str:
  if where != "CUDA": return f"no GPU: tinychad {where} and torch on the CPU (a check of this script)"
  from tinychad.runtime.nvrtc import nvrtc_version
  sms = device.driver.attribute("multiprocessors", device.ordinal)
  return (f"GPU: {device.gpu_name} (sm_{device.capability}, {sms} SMs), driver CUDA {device.driver.version() / 1000:.1f}, "
          f"NVRTC {'.'.join(map(str, nvrtc_version()))} ({device.kind} for {device.arch})")


def _cell(fn: Callable[[], str]) -> str:
  try:
    return fn()
  except Exception as error:       # one library failing a row shows in its cell; the table goes on
    return f"{type(error).__name__}: {str(error).splitlines()[0][:60]}"


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
  parser.add_argument("--out", help="also write the table (markdown) to this file")
  parser.add_argument("--device", default="CUDA", help="another tinychad device (CPU), with torch on the CPU: "
                      "checks this script where there is no GPU; its numbers say nothing about a GPU")
  args = parser.parse_args(argv)
  from tinychad.runtime.cuda_driver import unavailable_reason
  if args.device.upper() == "CUDA" and (reason := unavailable_reason()) is not None:
    sys.exit(f"bench/gpu.py: tinychad's CUDA device can't run here: {reason}")
  sides = {"tinychad": Side("tinychad", args.device.upper())}
  try:
    import torch
    if torch.cuda.is_available() or args.device.upper() != "CUDA": sides["torch"] = Side("torch", args.device.upper())
  except ImportError:
    pass
  device = sides["tinychad"].device
  peak = device.memory_bandwidth() if hasattr(device, "memory_bandwidth") else None
  warmup, repeats = (2, 3) if args.quick else (2, 10)
  # a*b+c and softmax move 1 GiB a call, ~0.3 ms at 3.35 TB/s: many times an eager call's Python cost (~0.04 ms and
  # ~0.16 ms against the C fake driver on a loaded 2-core machine), so the GB/s are the kernels'
  n, size, rows, cols = (1024, 1 << 22, 1024, 1024) if args.quick else (4096, 1 << 26, 16384, 8192)
  where = args.device.upper()
  lines = [f"| row | unit | tinychad {where} | torch {where} | tinychad speed / torch's | tinychad % of peak | max abs diff |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
  for name, unit, work, build, arrays, moved in _simple_rows(n, size, rows, cols):
    speed, outputs = {}, {}
    for lib, side in sides.items():
      def measure(side=side, lib=lib):
        call = build(side, *arrays)
        speed[lib] = work / (_median_ms(call, side.sync, warmup, repeats) / 1e3)
        outputs[lib] = side.numpy(call())
        return f"{speed[lib]:.1f}"
      speed[lib + " cell"] = _cell(measure)
    ratio = f"{speed['tinychad'] / speed['torch']:.2f}x" if "tinychad" in speed and "torch" in speed else "-"
    of_peak = f"{100 * speed['tinychad'] * 1e9 / peak:.0f}%" if moved and peak and "tinychad" in speed else "-"
    diff = f"{np.abs(outputs['tinychad'].astype(np.float32) - outputs['torch']).max():.2g}" if len(outputs) == 2 else "-"
    lines.append(f"| {name} | {unit} | {speed['tinychad cell']} | {speed.get('torch cell', 'no torch CUDA')} | {ratio} | "
                 f"{of_peak} | {diff} |")
  for name, build in _model_rows(args.quick):
    ms = {}
    for lib, side in sides.items():
      def measure(side=side, lib=lib):
        ms[lib] = _median_ms(build(side), side.sync, warmup, max(3, repeats // 2))
        return f"{ms[lib]:.2f}"
      ms[lib + " cell"] = _cell(measure)
    ratio = f"{ms['torch'] / ms['tinychad']:.2f}x" if "tinychad" in ms and "torch" in ms else "-"
    lines.append(f"| {name} | ms | {ms['tinychad cell']} | {ms.get('torch cell', 'no torch CUDA')} | {ratio} | - | - |")
  bandwidth = f"peak memory bandwidth {peak / 1e9:.0f} GB/s (the driver's memory clock and bus width)" if peak else \
    "peak memory bandwidth unknown"
  notes = [f"{_describe(device, where)}; {bandwidth}",
           "GFLOP/s, GB/s: higher is better; ms: lower is better. tinychad speed / torch's: torch's time over "
           "tinychad's (> 1x: tinychad is faster; the targets: matmul >= 0.7x, training steps >= 0.5x).",
           f"Medians of {repeats} timed calls after {warmup} warm-up calls, each call followed by a wait for the GPU"
           + (" (--quick sizes)." if args.quick else ".")]
  table = "\n".join(lines + [""] + notes)
  print(table)
  if args.out: Path(args.out).write_text(table + "\n")


if __name__ == "__main__": main()
