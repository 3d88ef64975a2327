"""What a TinyJit replay costs per kernel: a jitted chain of 100 tiny kernels (x = (x * 1.0001 + 1).realize(),
4 floats: one fused kernel each) replayed, beside the same chain in PyTorch eager (two ops a link) and in
tinychad eager. CPU time of this process (time.process_time), one thread, best of 5 x 200 calls; the machine is
shared, so compare within a run.
  python bench/jit_replay.py [--links 100]
"""
from __future__ import annotations
import argparse
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""): sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def best_us(fn, calls: int = 200, repeats: int = 5) -> float:
  times = []
  for _ in range(repeats):
    start = time.process_time()
    for _ in range(calls): fn()
    times.append((time.process_time() - start) / calls)
  return min(times) * 1e6


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--links", type=int, default=100)
  links = parser.parse_args(argv).links
  os.environ["THREADS"] = "1"
  import torch
  torch.set_num_threads(1)
  from tinychad import Tensor, TinyJit

  def chain(x):
    for _ in range(links): x = (x * 1.0001 + 1).realize()
    return x

  def torch_chain(x):
    for _ in range(links): x = x * 1.0001 + 1
    return x

  jitted, x = TinyJit(chain), Tensor.ones(4).realize()
  for _ in range(3): jitted(x)
  tx = torch.ones(4)
  rows = [("tinychad TinyJit replay", best_us(lambda: jitted(x))), ("tinychad eager", best_us(lambda: chain(x), 20)),
          ("torch eager", best_us(lambda: torch_chain(tx)))]
  print(f"a chain of {links} tiny links (4 floats), 1 thread, CPU time per call and per link")
  for name, us in rows: print(f"{name:26s} {us:9.1f} us {us / links:7.2f} us/link")


if __name__ == "__main__": main()
