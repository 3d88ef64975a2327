"""Kernel compilers side by side: gcc, clang and llvmlite on the kernels of a CNN train step and a GPT forward.

in: bench/cnn_train.py's step (batch 128) and bench/gpt.py's forward (batch 8 x 128), built by their own code
out: a markdown table, a row per backend: distinct kernels; ms to compile one kernel alone (median, max,
     total); each workload's first call from an empty kernel cache, and its warm time; then a line naming
     tinychad's default backend and the fastest backend by each number.
  python bench/compilers.py          # about a minute and a half on 2 cores
  python -m bench --compilers        # the same, after the kernel table

Each backend gets a fresh worker (common.worker_env, an empty TINYCHAD_CACHE): gcc and clang as the CPU
device with CC set, llvmlite as the LLVM device. Per workload it times the first call, compiled the way
tinychad does it (CPUDevice.prepare: a library per core, built at once; LLVMDevice.prepare: a module per
kernel, a thread per core), noting the kernels run; then the warm time (common.measure: 2 warm-up calls,
as TinyJit replays from the third, then the median of 7 samples). Kernels run on one thread (compiling
still uses every core): two threads on a shared machine add more noise than the compilers' code differs
(one GPT forward took 45 or 180 ms). Last, with CACHE=0, it compiles each distinct kernel alone, one after
another: C by runtime/cc.compile_c (a compiler process, the library loaded), LLVM IR by
ops_llvm.compile_object, loaded into MCJIT. Lowering and rendering, the same for every compiler, aren't timed.
"""
from __future__ import annotations
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

if __package__ in (None, ""): sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.cnn_train import tinychad_step
from bench.common import bench_line_of, find_clang, format_number, measure, time_call, worker_env
from bench.gpt import tinychad_gpt
from tinychad.codegen import lower_item
from tinychad.device import Device
from tinychad.engine.realize import capture
from tinychad.engine.schedule import ScheduleItem
from tinychad.renderer.cstyle import render_c
from tinychad.runtime.cc import compile_c, find_c_compiler

# each builds its workload on Device.DEFAULT (weights and inputs realized) and returns one call of it
WORKLOADS = {"CNN step": lambda: tinychad_step(128), "GPT fwd": lambda: tinychad_gpt(8, 128)}
WORKER_TIMEOUT_S = 300


def backends() -> dict[str, dict[str, str] | str]:
  """Each backend's environment on top of worker_env, or why it can't run (a missing gcc or llvmlite: its worker's error)."""
  clang = find_clang()
  # DEVICE=CPU even for clang: clang 14 has no _Float16 on x86, so the CPU device's probe fails and
  # CC=clang-14 alone would quietly run the LLVM device
  return {"gcc": {"DEVICE": "CPU", "CC": "gcc"}, clang or "clang": {"DEVICE": "CPU", "CC": clang} if clang else "not installed",
          "llvmlite": {"DEVICE": "LLVM"}}


def run_workload(build: Callable[[], Callable[[], object]]) -> tuple[float, float, list[ScheduleItem]]:
  """(first call s, warm median s, the kernels the first call ran) for one workload."""
  fn = build()
  with capture() as steps: first = time_call(fn)
  return first, measure(fn, warmup=2, repeats=7), [item for item, _ in steps if item is not None]


def compile_alone(item: ScheduleItem) -> float:
  """Seconds to turn one kernel's source into callable code, its compiler run for it alone."""
  program = lower_item(item)
  if Device.DEFAULT == "LLVM":
    from tinychad.renderer.llvmir import render_llvm
    device = Device["LLVM"]
    source = render_llvm(program)
    return time_call(lambda: device.kernel(device.load(device.compile(source, program.name)), program.name,
                                           len(program.globals), program.parallel))
  # a fresh comment makes the source new to the cache's in-memory layer, which keeps any library the
  # workloads compiled (a kernel alone in its library has this very source), so the compiler always runs
  source = render_c(program) + f"\n// compiled alone {time.perf_counter_ns()}\n"
  return time_call(lambda: compile_c(source, program.name, contract=program.contract))


def run_worker() -> None:
  report: dict = {"first_s": {}, "warm_s": {}}
  kernels = {}
  for name, build in WORKLOADS.items():
    report["first_s"][name], report["warm_s"][name], items = run_workload(build)
    kernels.update(((item.ast, item.name), item) for item in items)
  os.environ["CACHE"] = "0"
  report["compile_s"] = [compile_alone(item) for item in kernels.values()]
  print("BENCH " + json.dumps(report), flush=True)


def run_subprocess(env: dict[str, str]) -> dict:
  """A backend's report from a fresh worker process with `env`, or {"error": why}."""
  cmd = [sys.executable, str(Path(__file__).resolve()), "--worker"]
  return bench_line_of(cmd, lambda cache_dir: {**worker_env("tinychad", 1, cache_dir), **env}, WORKER_TIMEOUT_S, stderr=subprocess.PIPE)


def format_table(reports: dict[str, dict]) -> str:
  names = list(WORKLOADS)
  header = (["backend", "kernels", "compile/kernel median (ms)", "max (ms)", "total (ms)"]
            + [f"{name} 1st call (ms)" for name in names] + [f"{name} warm (ms)" for name in names])
  lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
  for backend, report in reports.items():
    if "error" in report:
      lines.append(f"| {backend} | n/a: {report['error']} |" + " |" * (len(header) - 2))
      continue
    ms = [s * 1e3 for s in report["compile_s"]]
    numbers = [statistics.median(ms), max(ms), sum(ms)] + [report[col][name] * 1e3 for col in ("first_s", "warm_s") for name in names]
    lines.append("| " + " | ".join([backend, str(len(ms))] + [format_number(x) for x in numbers]) + " |")
  return "\n".join(lines)


def verdict(reports: dict[str, dict]) -> str:
  """tinychad's default backend here, and which backend wins each kind of number."""
  default = find_c_compiler() if Device.DEFAULT == "CPU" else f"the {Device.DEFAULT} device"
  ran = {backend: report for backend, report in reports.items() if "error" not in report}
  # the median alone would hide a compiler that is quick on small kernels and slow on big ones
  scores = {"compile median": lambda r: statistics.median(r["compile_s"]), "compile total": lambda r: sum(r["compile_s"]),
            "cold first calls": lambda r: sum(r["first_s"].values()), "warm calls": lambda r: sum(r["warm_s"].values())}
  wins = ", ".join(f"{kind} {min(ran, key=lambda b: score(ran[b]))}" for kind, score in scores.items()) if ran else "none ran"
  return f"Default here: {default} (the CPU device takes $CC, else `clang`, else `gcc`). Fastest by these numbers: {wins}."


def main() -> None:
  if sys.argv[1:] == ["--worker"]: return run_worker()
  start = time.perf_counter()
  reports = {backend: run_subprocess(env) if isinstance(env, dict) else {"error": env} for backend, env in backends().items()}
  print(format_table(reports) + "\n\n" + verdict(reports))
  print(f"\n({time.perf_counter() - start:.0f} s; ms, lower is better; warm: median of 7 samples after 2 calls, 1 thread)")


if __name__ == "__main__": main()
