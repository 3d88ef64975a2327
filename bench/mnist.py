"""Full MNIST training: tinychad's example recipe next to the same model and recipe in PyTorch, in one run.

in: MNIST from --data, else $TINYCHAD_DATA, else the shared copy at ../shared/datasets/mnist (relative to the
    repository); flags --epochs --batch-size --lr (the example's defaults), --threads, --limit, --libraries
out: one row per library: epochs, images trained on, wall time (training + testing on the 10,000 test images),
     training samples/s and test accuracy.
  python bench/mnist.py                 # both libraries, the example's default recipe (a few minutes)
  python -m bench --mnist               # the same, after the kernel table

Model (examples/mnist.py's CNN): conv5x5 1->32, batchnorm, relu, maxpool 2, conv5x5 32->64, batchnorm, relu,
maxpool 2, linear 1024->10; cross-entropy; Adam with OneCycleLR (lr stepped after every batch, PyTorch's
cycle_momentum=False, as tinychad's scheduler schedules the lr only). Both libraries see the same batches:
tinychad's numpy DataLoader, the same seed, the same normalisation. Only the initial weights differ (each
library's own generator, the same PyTorch init scheme). Each library runs in a fresh process with its threads
pinned (bench/common.py's worker_env); tinychad starts from an empty kernel cache, so its time includes
compiling every kernel, and replays its training step with TinyJit.
"""
from __future__ import annotations
import argparse
import datetime
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

if __package__ in (None, ""): sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import bench_line_of, limit_threads, unavailable_reason, worker_env

LIBRARIES = ("tinychad", "torch")
WORKER_TIMEOUT_S = 3600


def default_data() -> str | None:
  """$TINYCHAD_DATA, else the shared copy next to the repository, else None (the loader's cache or download)."""
  from tinychad.examples.mnist import default_data_dir
  return default_data_dir()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  from tinychad.examples import mnist as example
  defaults = example.parse_args([])
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--epochs", type=int, default=defaults.epochs)
  parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
  parser.add_argument("--lr", type=float, default=defaults.lr, help="peak of the one-cycle schedule")
  parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for every library (default: all cores)")
  parser.add_argument("--limit", type=int, default=None, help="train on the first N training images only (a quick check)")
  parser.add_argument("--libraries", nargs="+", choices=LIBRARIES, default=list(LIBRARIES))
  parser.add_argument("--data", default=default_data(), help="folder with the four MNIST .gz files")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--worker", choices=LIBRARIES, help=argparse.SUPPRESS)
  return parser.parse_args(argv)


def example_flags(args: argparse.Namespace) -> list[str]:
  """The flags of `python -m tinychad.examples.mnist` for this recipe."""
  flags = ["--model", "cnn", "--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--lr", str(args.lr),
           "--schedule", "onecycle", "--seed", str(args.seed)]
  if args.limit is not None: flags += ["--limit", str(args.limit)]
  return flags + (["--data", args.data] if args.data else [])


def run_tinychad(args: argparse.Namespace) -> dict:
  from tinychad.examples import mnist as example
  _, run = example.train_and_test(example.parse_args(example_flags(args)))
  return asdict(run)


def run_torch(args: argparse.Namespace) -> dict:
  """The example's recipe, line for line, in PyTorch."""
  import numpy as np
  import torch
  from torch import nn
  from tinychad.examples import mnist as example
  from tqdm import tqdm
  torch.manual_seed(args.seed)
  X_train, Y_train, X_test, Y_test, _ = example.load_data(args.data)
  X_train, Y_train = X_train[:args.limit], Y_train[:args.limit]
  model = nn.Sequential(nn.Conv2d(1, 32, 5), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(32, 64, 5), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(64 * 4 * 4, 10))
  steps_per_epoch = len(example.train_loader(X_train, Y_train, args.batch_size, args.seed))
  opt = torch.optim.Adam(model.parameters(), lr=args.lr)
  scheduler = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.epochs * steps_per_epoch, cycle_momentum=False)
  start = time.perf_counter()
  for epoch in range(args.epochs):
    model.train()
    loader = example.train_loader(X_train, Y_train, args.batch_size, args.seed + epoch)
    for xb, yb in tqdm(loader, desc=f"torch epoch {epoch + 1}/{args.epochs}", unit="batch"):
      x, y = torch.from_numpy(example.normalize(xb)), torch.from_numpy(yb.astype(np.int64))
      opt.zero_grad()
      loss = nn.functional.cross_entropy(model(x), y)
      loss.backward()
      opt.step()
      scheduler.step()
  trained = time.perf_counter()
  model.eval()
  correct = 0
  with torch.no_grad():
    for first in range(0, len(Y_test), 1000):
      x = torch.from_numpy(example.normalize(X_test[first:first + 1000]))
      correct += int((model(x).argmax(1).numpy() == Y_test[first:first + 1000]).sum())
  return {"accuracy": correct / len(Y_test), "train_seconds": trained - start, "test_seconds": time.perf_counter() - trained,
          "images": args.epochs * min(steps_per_epoch * args.batch_size, len(Y_train))}


def run_worker(args: argparse.Namespace) -> None:
  limit_threads(args.worker, args.threads)
  result = run_tinychad(args) if args.worker == "tinychad" else run_torch(args)
  print("BENCH " + json.dumps(result), flush=True)


def run_subprocess(library: str, args: argparse.Namespace, argv: list[str]) -> dict:
  """Run one library's worker in a fresh process; its result, or {"error": why}. Its progress bars go to our stderr."""
  reason = unavailable_reason(library)
  if reason: return {"error": reason}
  cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--worker", library]
  return bench_line_of(cmd, lambda cache_dir: worker_env(library, args.threads, cache_dir), WORKER_TIMEOUT_S)


def format_table(results: dict[str, dict], args: argparse.Namespace) -> str:
  lines = ["| library | threads | epochs | images trained | wall time (s) | train (s) | test (s) | train samples/s | test accuracy |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for library, result in results.items():
    if "error" in result:
      lines.append(f"| {library} | {args.threads} | {args.epochs} | n/a: {result['error']} | | | | | |")
      continue
    wall = result["train_seconds"] + result["test_seconds"]
    lines.append(f"| {library} | {args.threads} | {args.epochs} | {result['images']:,} | {wall:.1f} | {result['train_seconds']:.1f} | "
                 f"{result['test_seconds']:.1f} | {result['images'] / result['train_seconds']:,.0f} | {100 * result['accuracy']:.2f}% |")
  mine, theirs = results.get("tinychad", {}), results.get("torch", {})
  if "accuracy" in mine and "accuracy" in theirs:
    ratio = (mine["train_seconds"] + mine["test_seconds"]) / (theirs["train_seconds"] + theirs["test_seconds"])
    lines.append(f"\ntinychad wall time / torch wall time: {ratio:.2f}x")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
  """Run every library's worker in turn, then print the table."""
  argv = list(sys.argv[1:] if argv is None else argv)
  args = parse_args(argv)
  if args.worker:
    run_worker(args)
    return
  started = datetime.datetime.now(datetime.timezone.utc)
  results = {library: run_subprocess(library, args, argv) for library in args.libraries}
  print(f"\nMNIST CNN, batch {args.batch_size}, Adam + OneCycleLR (peak lr {args.lr:g}); {started:%Y-%m-%d %H:%M} UTC, "
        f"{platform.machine()} with {os.cpu_count()} cores, Python {platform.python_version()}")
  print(format_table(results, args))


if __name__ == "__main__": main()
