"""Attention, forward and forward+backward: tinychad's flash-style kernels beside PyTorch's SDPA and beside
tinychad's materialized path (the whole T x T score matrix, what `nn.functional.attention` computes), in one run.

    python bench/attention.py                     # causal, T 2048, 8 heads, d 64, batch 1, 2 threads
    python bench/attention.py --length 1024 --threads 1
    python bench/attention.py --full --batch 16 --heads 3 --length 65 --repeats 50   # a ViT's: no mask, 65 tokens

Each (library, pass) runs in a fresh subprocess (`--worker`): inputs made, one call to build and warm up, then the
median time of `--repeats` calls, then the peak memory of one more call: the rise of the process's peak resident
set (VmHWM, reset through /proc/self/clear_refs) above its resident set before the call, with tinychad's buffer
pool emptied first (its free buffers would otherwise serve the call from memory already counted) and glibc's mmap
threshold fixed (MALLOC_MMAP_THRESHOLD_). That counts C buffers, which tracemalloc would not see, the same way for
every library.
"""
from __future__ import annotations
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
LIBRARIES = ("tinychad", "torch", "tinychad-materialized")
PASSES = ("forward", "forward+backward")


def _resident_mb(field: str) -> float:
  for line in Path("/proc/self/status").read_text().splitlines():
    if line.startswith(field + ":"): return int(line.split()[1]) / 1024
  raise RuntimeError(f"no {field} in /proc/self/status")


def _peak_rise_mb(fn, before_call) -> float:
  """How far the resident set peaks above where it was, during one call of fn."""
  before_call()
  base = _resident_mb("VmRSS")
  Path("/proc/self/clear_refs").write_text("5")     # resets VmHWM to the current resident set
  fn()
  return _resident_mb("VmHWM") - base


def _tinychad(args, library: str, backward: bool):
  import numpy as np
  from tinychad import Tensor
  from tinychad.device import memory_pool
  import tinychad.nn.functional as F
  rng = np.random.default_rng(0)
  q, k, v = (Tensor(rng.standard_normal((args.batch, args.heads, args.length, args.dim)).astype(np.float32),
                    requires_grad=backward).realize() for _ in range(3))

  def attend():
    if library == "tinychad": return F.scaled_dot_product_attention(q, k, v, is_causal=not args.full)
    return F.attention(q, k, v, is_causal=not args.full)[0]

  def call():
    out = attend()
    if not backward: return out.realize()
    for t in (q, k, v): t.grad = None
    out.sum().backward()
    q.grad.realize(k.grad, v.grad)
  return call, memory_pool.clear


def _torch(args, backward: bool):
  import torch
  torch.set_num_threads(args.threads)
  torch.manual_seed(0)
  q, k, v = (torch.randn(args.batch, args.heads, args.length, args.dim, requires_grad=backward) for _ in range(3))

  def call():
    if not backward:
      with torch.no_grad(): return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=not args.full)
    for t in (q, k, v): t.grad = None
    torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=not args.full).sum().backward()
  return call, lambda: None


def worker(args) -> None:
  backward = args.worker_pass == "forward+backward"
  call, settle = _torch(args, backward) if args.worker == "torch" else _tinychad(args, args.worker, backward)
  call()
  call()
  times = []
  for _ in range(args.repeats):
    start = time.perf_counter()
    call()
    times.append(time.perf_counter() - start)
  times.sort()
  print(json.dumps({"ms": times[len(times) // 2] * 1e3, "peak_mb": _peak_rise_mb(call, settle)}))


def run(args, library: str, which: str) -> dict:
  # a fixed mmap threshold: every large buffer is fresh pages, returned when freed, instead of heap memory that glibc
  # keeps resident after the warm-up calls (its threshold grows with each large free), which no later peak would count
  env = dict(os.environ, THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads), PYTHONPATH=str(REPO_ROOT),
             MALLOC_MMAP_THRESHOLD_="131072")
  cmd = [sys.executable, __file__, "--worker", library, "--worker-pass", which, "--length", str(args.length),
         "--heads", str(args.heads), "--dim", str(args.dim), "--threads", str(args.threads), "--repeats",
         str(args.repeats), "--batch", str(args.batch)] + (["--full"] if args.full else [])
  done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
  if done.returncode != 0: return {"error": done.stderr.strip().splitlines()[-1]}
  return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--length", type=int, default=2048)
  parser.add_argument("--heads", type=int, default=8)
  parser.add_argument("--dim", type=int, default=64)
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--full", action="store_true", help="no causal mask: every query sees every key")
  parser.add_argument("--threads", type=int, default=2)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--worker", choices=LIBRARIES)
  parser.add_argument("--worker-pass", choices=PASSES)
  args = parser.parse_args()
  if args.worker: return worker(args)
  score_mb = args.batch * args.heads * args.length * args.length * 4 / 2 ** 20
  print(f"{'full' if args.full else 'causal'} attention, T {args.length}, {args.heads} heads, d {args.dim}, "
        f"batch {args.batch}, float32, {args.threads} threads (the T x T float32 scores of every head: {score_mb:.0f} MB)")
  print("| pass | library | ms | peak MB | ms / torch | peak / materialized |")
  print("|---|---|---|---|---|---|")
  for which in PASSES:
    results = {library: run(args, library, which) for library in LIBRARIES}
    for library, r in results.items():
      if "error" in r:
        print(f"| {which} | {library} | failed: {r['error']} | | | |")
        continue
      versus = results["torch"].get("ms")
      mat = results["tinychad-materialized"].get("peak_mb")
      ratio = f"{r['ms'] / versus:.2f}" if versus else "n/a"
      mem = f"{r['peak_mb'] / mat:.3f}" if mat else "n/a"
      print(f"| {which} | {library} | {r['ms']:.1f} | {r['peak_mb']:.1f} | {ratio} | {mem} |")


if __name__ == "__main__":
  main()
