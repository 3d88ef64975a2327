"""Shared machinery of the benchmark suite: cases, timing, subprocess workers, the table.

A workload module (bench/matmul.py, ...) defines `TITLE` and `cases(quick) -> list[Case]`. For every
library and thread count, the parent (`main`) starts a fresh `python -m bench --worker MODULE LIB THREADS`
so thread settings and compile caches never leak between measurements. The worker builds each case for
its library, times the first call (tinychad: compile included, with an empty kernel cache; then once
more in a new process over the cache the first one filled: the warm start), warms up,
takes the median of several calls and prints one JSON line per case. The parent collects the lines and
prints one table, with ratios computed from numbers measured in the same run.
"""
from __future__ import annotations
import argparse
import functools
import importlib
import importlib.util
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from bench.hardware import Limits, measure_limits

REPO_ROOT = Path(__file__).resolve().parent.parent
LIBRARIES = ("tinychad", "torch", "numpy", "tinygrad")
# tinychad reads THREADS (set per worker below)
THREAD_COUNTS = {"tinychad": (1, 2), "torch": (1, 2), "numpy": (1, 2), "tinygrad": (1, 2)}
WORKER_TIMEOUT_S = 600
MIN_SAMPLE_S = 0.05
# tinygrad's CPU backend calls `clang` (CC overrides it); Debian's clang-14 package installs only the
# versioned name, which leaves tinychad's own compiler choice (clang, else gcc) untouched
CLANG_NAMES = ("clang", "clang-19", "clang-18", "clang-17", "clang-16", "clang-15", "clang-14")


@dataclass
class Case:
  """One row of the table: the same computation built for each library that can run it.

  `factories[lib]()` does the setup (inputs made and realized) and returns the function that is timed:
  one call does the whole computation, realized. `amount` is the work of one call in the unit's
  numerator (GFLOP for GFLOP/s, GB for GB/s, tokens for tok/s); units "ms" show the time itself.
  """
  name: str
  unit: str
  amount: float
  factories: dict[str, Callable[[], Callable[[], object]]]
  repeats: int = 7
  warmup: int = 2
  missing_reason: str = "not applicable"
  # the machine's best for this row, in the row's unit, from limits measured in this run (hardware.py)
  limit: Callable[[Limits], float] | None = None


def bind(builds: dict[str, Callable[..., Callable[[], object]]], *args) -> dict[str, Callable[[], Callable[[], object]]]:
  """Case.factories from one builder per library and the size arguments they all take."""
  return {library: functools.partial(build, *args) for library, build in builds.items()}


@dataclass
class Result:
  median_s: float | None = None
  first_s: float | None = None
  error: str = ""
  warm_first_s: float | None = None   # tinychad 1t: the first call in a new process with the kernel cache filled


@dataclass
class Row:
  case_name: str
  unit: str
  amount: float
  results: dict[tuple[str, int], Result] = field(default_factory=dict)
  limit: Callable[[Limits], float] | None = None

  def value(self, seconds: float) -> float:
    return seconds * 1e3 if self.unit == "ms" else self.amount / seconds


def add_repo_to_path() -> None:
  """Let `python bench/NAME.py` import the `bench` package, as `python -m bench.NAME` can."""
  if str(REPO_ROOT) not in sys.path: sys.path.insert(0, str(REPO_ROOT))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description="tinychad vs PyTorch vs numpy vs tinygrad on the CPU")
  parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats")
  parser.add_argument("--mnist", action="store_true",
                      help="then train the MNIST CNN in full with tinychad and PyTorch (bench/mnist.py; several minutes)")
  parser.add_argument("--compilers", action="store_true",
                      help="then time gcc, clang and llvmlite on a CNN step's and a GPT forward's kernels (bench/compilers.py; about a minute and a half)")
  parser.add_argument("--models", action="store_true",
                      help="then the models table of issue 22 (bench/models.py: ResNet-18, GPT, LSTM, ViT, eager and TinyJit; several minutes)")
  parser.add_argument("--worker", nargs=3, metavar=("MODULE", "LIBRARY", "THREADS"), help=argparse.SUPPRESS)
  return parser.parse_args(argv)


# ---- timing ----

def time_call(fn: Callable[[], object], calls: int = 1) -> float:
  """Seconds per call, averaged over `calls` back-to-back calls."""
  start = time.perf_counter()
  for _ in range(calls): fn()
  return (time.perf_counter() - start) / calls


def measure(fn: Callable[[], object], warmup: int, repeats: int) -> float:
  """Median seconds per call of `repeats` samples after `warmup` untimed calls.

  A sample is one call, or enough back-to-back calls to last MIN_SAMPLE_S when one call is shorter,
  so the timer's resolution and one-off hiccups don't decide the result of sub-millisecond cases.
  """
  for _ in range(warmup): fn()
  calls = max(1, math.ceil(MIN_SAMPLE_S / max(time_call(fn), 1e-9)))
  return statistics.median(time_call(fn, calls) for _ in range(repeats))


def scaled(case: Case, quick: bool) -> tuple[int, int]:
  """(warmup, repeats) for this run: --quick keeps one warm-up and at most three timed calls."""
  return (1, min(case.repeats, 3)) if quick else (case.warmup, case.repeats)


# ---- libraries ----

def find_clang() -> str | None:
  return next((name for name in CLANG_NAMES if shutil.which(name)), None)


def unavailable_reason(library: str) -> str:
  """Why `library` can't run here, or "" when it can."""
  module = {"tinychad": "tinychad", "torch": "torch", "numpy": "numpy", "tinygrad": "tinygrad"}[library]
  if importlib.util.find_spec(module) is None: return f"{library} is not installed (pip install -e '.[bench]')"
  if library == "tinygrad" and find_clang() is None: return "tinygrad's CPU backend needs clang (apt-get install clang-14)"
  return ""


def worker_env(library: str, threads: int, cache_dir: str) -> dict[str, str]:
  """The environment of one worker: thread counts pinned, each library on its CPU backend."""
  env = dict(os.environ)
  for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"): env[name] = str(threads)
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
  if library == "numpy":
    # set on this VM for other tools; both make OpenBLAS slower here
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
  if library == "tinychad":
    env["THREADS"] = str(threads)
    env["TINYCHAD_CACHE"] = cache_dir  # empty on a first run (compiling is timed), filled on the warm-start run
  if library == "tinygrad":
    env["DEV"] = "CPU"
    env["NUM_CPU_THREADS"] = str(threads)
    env["CC"] = find_clang() or "clang"
  return env


def limit_threads(library: str, threads: int) -> None:
  """Pin the library's own thread pool in this process (the environment already asks for `threads`)."""
  if library == "torch":
    import torch
    torch.set_num_threads(threads)
  if library == "numpy":
    from threadpoolctl import threadpool_limits
    threadpool_limits(limits=threads)


# ---- worker (one library, one thread count, in its own process) ----

def describe(error: Exception) -> str:
  """One line for a footnote: the exception's message, or where it was raised when it has none."""
  message = str(error).splitlines()[0] if str(error) else ""
  if not message:
    frame = traceback.extract_tb(error.__traceback__)[-1]
    message = f"raised at {Path(frame.filename).name}:{frame.lineno}: {frame.line}"
  return f"{type(error).__name__}: {message}"[:160]


def run_worker(module_name: str, library: str, threads: int, quick: bool) -> None:
  limit_threads(library, threads)
  module = importlib.import_module(module_name)
  for case in module.cases(quick):
    report = {"case": case.name}
    if library in case.factories:
      try:
        fn = case.factories[library]()
        report["first_s"] = time_call(fn)
        warmup, repeats = scaled(case, quick)
        report["median_s"] = measure(fn, warmup, repeats)
      except Exception as e:  # a library failing one case must not take down the others
        report["error"] = describe(e)
    else:
      report["error"] = case.missing_reason
    print("BENCH " + json.dumps(report), flush=True)


# ---- parent ----

def collect(module_name: str, quick: bool) -> list[Row]:
  module_cases = importlib.import_module(module_name).cases(quick)
  rows = {case.name: Row(case.name, case.unit, case.amount, limit=case.limit) for case in module_cases}
  for library in LIBRARIES:
    for threads in THREAD_COUNTS[library]:
      reason = unavailable_reason(library)
      if reason or not any(library in case.factories for case in module_cases):
        for case in module_cases: rows[case.name].results[(library, threads)] = Result(error=reason or case.missing_reason)
        continue
      cache_dir = tempfile.mkdtemp(prefix="tinychad-bench-cache-")
      try:
        for case_name, result in run_subprocess(module_name, library, threads, quick, cache_dir).items():
          rows[case_name].results[(library, threads)] = result
        if library == "tinychad" and threads == 1:
          for case_name, warm in run_subprocess(module_name, library, threads, quick, cache_dir).items():
            rows[case_name].results[(library, threads)].warm_first_s = warm.first_s
      finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
  return list(rows.values())


def run_subprocess(module_name: str, library: str, threads: int, quick: bool, cache_dir: str) -> dict[str, Result]:
  cmd = [sys.executable, "-m", "bench", "--worker", module_name, library, str(threads)] + (["--quick"] if quick else [])
  start = time.perf_counter()
  try:
    proc = subprocess.run(cmd, env=worker_env(library, threads, cache_dir), cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=WORKER_TIMEOUT_S)
    stdout = proc.stdout
    failure = (proc.stderr.strip().splitlines() or ["no output"])[-1] if proc.returncode else ""
  except subprocess.TimeoutExpired as e:
    stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    failure = f"timed out after {WORKER_TIMEOUT_S} s"
  print(f"[bench] {module_name} {library} {threads}t: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
  results = {}
  for line in stdout.splitlines():
    if not line.startswith("BENCH "): continue
    report = json.loads(line[len("BENCH "):])
    results[report["case"]] = Result(report.get("median_s"), report.get("first_s"), report.get("error", ""))
  if failure:
    for case in importlib.import_module(module_name).cases(quick):
      results.setdefault(case.name, Result(error=f"worker died: {failure[:160]}"))
  return results


# ---- table ----

def bench_line_of(cmd: list[str], make_env: Callable[[str], dict[str, str]], timeout: int = WORKER_TIMEOUT_S, **run_args) -> dict:
  """The JSON a worker script prints on its `BENCH ` line, run as `cmd` with the environment
  `make_env(cache_dir)` over an empty kernel cache; {"error": why} when it times out or prints none
  (the reason then is the last line of its captured stderr, if any, else its exit code)."""
  cache_dir = tempfile.mkdtemp(prefix="tinychad-bench-cache-")
  try:
    proc = subprocess.run(cmd, env=make_env(cache_dir), cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
                          timeout=timeout, **run_args)
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {timeout} s"}
  finally:
    shutil.rmtree(cache_dir, ignore_errors=True)
  for line in proc.stdout.splitlines():
    if line.startswith("BENCH "): return json.loads(line[len("BENCH "):])
  if proc.stderr: return {"error": "worker died: " + (proc.stderr.strip().splitlines() or ["no output"])[-1][:160]}
  return {"error": f"worker exited with code {proc.returncode} and no result (its traceback is above)"}


def format_number(x: float) -> str:
  if x >= 100: return f"{x:,.0f}"
  if x >= 10: return f"{x:.1f}"
  return f"{x:.2f}"


def format_table(rows: list[Row], limits: dict[int, Limits | None] | None = None) -> str:
  """A markdown table; n/a cells point to numbered footnotes with the reason. With `limits` (per
  thread count), rows that have a hardware limit get tinychad's share of it (rates) or its multiple
  of the ideal time (ms)."""
  limits = limits or {}
  columns = [(library, threads) for library in LIBRARIES for threads in THREAD_COUNTS[library]]
  header = ["workload", "unit"] + [f"{library} {threads}t" for library, threads in columns]
  header[3:3] = ["tinychad 1st call (ms)", "1st call, warm cache (ms)"]
  header += ["tinychad time / torch (1t, 2t)", "tinychad time / numpy (1t, 2t)", "tinychad time / tinygrad 1t",
             "tinychad vs hardware limit (1t, 2t)"]
  footnotes: list[str] = []

  def cell(row: Row, key: tuple[str, int]) -> str:
    result = row.results.get(key, Result(error="not run"))
    if result.median_s is not None: return format_number(row.value(result.median_s))
    if result.error not in footnotes: footnotes.append(result.error)
    return f"n/a [{footnotes.index(result.error) + 1}]"

  def ratio(row: Row, other: tuple[str, int]) -> str:
    mine, theirs = row.results.get(("tinychad", other[1])), row.results.get(other)
    if mine is None or theirs is None or mine.median_s is None or theirs.median_s is None: return "-"
    return f"{mine.median_s / theirs.median_s:.2f}x"

  lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * (len(header) - 2)) + "|"]
  for row in rows:
    cells = [row.case_name, row.unit] + [cell(row, key) for key in columns]
    first = row.results.get(("tinychad", 1))
    cells[3:3] = [format_number(seconds * 1e3) if seconds is not None else "-"
                  for seconds in ((first.first_s, first.warm_first_s) if first is not None else (None, None))]
    cells += [f"{ratio(row, (lib, 1))}, {ratio(row, (lib, 2))}" for lib in ("torch", "numpy")] + [ratio(row, ("tinygrad", 1))]
    cells.append(", ".join(versus_limit(row, threads, limits.get(threads)) for threads in (1, 2)))
    lines.append("| " + " | ".join(cells) + " |")
  lines.append("")
  lines += [f"[{i + 1}] {reason}" for i, reason in enumerate(footnotes)]
  return "\n".join(lines)


def versus_limit(row: Row, threads: int, limits: Limits | None) -> str:
  """tinychad's value as a share of the hardware's (rates), or its time over the ideal time (ms)."""
  mine = row.results.get(("tinychad", threads))
  if row.limit is None or limits is None or mine is None or mine.median_s is None: return "-"
  best = row.limit(limits)
  if row.unit == "ms": return f"{row.value(mine.median_s) / best:.1f}x ideal"
  return f"{row.value(mine.median_s) / best:.0%}"


def describe_limits(limits: dict[int, Limits | None]) -> str:
  parts = [f"{t}t: triad {lim.triad_gbs:.1f} GB/s, read {lim.sum_gbs:.1f} GB/s, FMA {lim.fma_gflops:.0f} GFLOP/s"
           for t, lim in limits.items() if lim is not None]
  return "Hardware limits measured in this run (bench/hardware.py): " + ("; ".join(parts) if parts else "not available (no C compiler with OpenMP)")


def main(module_names: list[str], argv: list[str] | None = None) -> None:
  """Run the named workload modules for every library and thread count, then print the table."""
  args = parse_args(argv)
  if args.worker:
    module_name, library, threads = args.worker
    run_worker(module_name, library, int(threads), args.quick)
    return
  limits = {threads: measure_limits(threads) for threads in (1, 2)}
  rows = [row for name in module_names for row in collect(name, args.quick)]
  print(format_table(rows, limits))
  print("\n" + describe_limits(limits) + ".")
  print("\nGFLOP/s, GB/s, tok/s: higher is better; ms: lower is better. Ratios > 1x: tinychad is slower.")
  print("Ratios compare tinychad with the same thread count. Numbers are medians after warm-up"
        + (" (--quick: small sizes, 3 runs)." if args.quick else "."))
  if args.mnist:
    # imported here: bench.mnist imports this module
    from bench import mnist
    mnist.main([])
  if args.models:
    # imported here: bench.models imports this module
    from bench import models
    models.main(["--quick"] if args.quick else [])
  if args.compilers:
    # imported here: bench.compilers imports this module
    from bench import compilers
    compilers.main()


def tinygrad_realize(*tensors):
  """Realize tinygrad tensors and wait for the CPU queue, so the time covers the work; returns the first."""
  from tinygrad import Device, Tensor
  Tensor.realize(*tensors)
  Device[Device.DEFAULT].synchronize()
  return tensors[0]
