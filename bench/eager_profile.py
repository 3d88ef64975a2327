"""Where an eager step's time goes: per-op Python cost broken down by stage, beside PyTorch's step time.

Not a table row of `python -m bench`: run it alone (`python bench/eager_profile.py [--steps N]`). Workloads,
each eager (no TinyJit, as a PyTorch user writes them), then under TinyJit:
  small ops   (a+b) on 4 floats, each realized (bench/small_ops.py's row), 100 per step, shown per op
  gelu        gelu(a, tanh form) on 4 floats, each realized (small_ops.py's second row: ~15 recorded ops, one
              kernel), 100 per step, shown per gelu
  CNN step    Conv2d 1->8 3x3, ReLU, MaxPool, Conv2d 8->16 3x3, ReLU, MaxPool, Linear 400->10, cross-entropy, SGD
              momentum; batch 16 of 1x28x28
  transformer step  Embedding 64x64, 2 TransformerEncoderLayer (d 64, 4 heads, ff 128, no dropout), Linear 64->64,
              cross-entropy, AdamW; batch 4 x 16 tokens
Stages (of the fastest of the timed steps, by wrapping the engine's functions, which adds ~0.3 us per
wrapped call, ~0.8 us with --cpu-time; the stages don't nest except where said):
  graph key     engine/schedule_cache.graph_key (the schedule cache's key)
  schedule      the cache lookup, and scheduling anew on a miss (engine/schedule.schedule_graph)
  buffers       Buffer.allocate of new outputs (the memory pool)
  launch        running a kernel (argument list, thread split, the ctypes call, the kernel itself): Compiled.run,
                the call a remembered schedule's prepared launch keeps (Compiled.launcher), or the one native call
                that runs all of a prepared launch's CPU kernels (KernelList.run)
  run rest      run_schedule or run_launch minus buffers and launch (counters, setting the outputs, capture lists)
  front end     everything else: Tensor ops, autograd Functions, LazyBuffers and views, backward, optimizer
  gc            Python's garbage collector (gc.callbacks), inside whichever stage it interrupted
The prepared launches are dropped on entering and leaving the instrumented steps, so that those steps run
launches prepared with the timed calls (their first step takes the long way once per graph).
"""
from __future__ import annotations
import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Callable

if __package__ in (None, ""): sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# wall time; --cpu-time: the calling thread's CPU time (with THREADS=1 every kernel runs on it), which another
# process on the same cores barely moves, at ~0.5 us more per wrapped call (a system call per reading)
clock = time.perf_counter

STAGES = ("graph key", "schedule", "buffers", "launch", "run rest", "front end", "gc")


class StageClock:
  """Wraps the engine's stage functions with timers while active; `seconds[stage]` sums them (a call inside
  another of the same stage, as Compiled.run inside a prepared launch's call, counts once)."""
  def __init__(self):
    import tinychad.engine.realize as realize_mod
    from tinychad.device import Buffer
    from tinychad.runtime.compiled import Compiled
    from tinychad.runtime.threads import KernelList
    self.seconds = dict.fromkeys(STAGES, 0.0)
    self._depth = dict.fromkeys(STAGES, 0)
    self._gc_start = 0.0
    self._patches = [(realize_mod, "graph_key"), (realize_mod, "lookup"), (realize_mod, "schedule_graph"),
                     (realize_mod, "run_schedule"), (realize_mod, "run_launch"), (Buffer, "allocate"), (Compiled, "run"),
                     (Compiled, "launcher"), (KernelList, "run")]
    self._saved = [(owner, name, owner.__dict__[name]) for owner, name in self._patches]

  def _timed(self, fn: Callable, stage: str) -> Callable:
    seconds, depth = self.seconds, self._depth
    def timed(*args, **kwargs):
      depth[stage] += 1
      start = clock()
      try:
        return fn(*args, **kwargs)
      finally:
        depth[stage] -= 1
        if not depth[stage]: seconds[stage] += clock() - start
    return timed

  def _gc(self, phase: str, info: dict) -> None:
    if phase == "start": self._gc_start = clock()
    else: self.seconds["gc"] += clock() - self._gc_start

  @staticmethod
  def _drop_launches() -> None:
    from tinychad.engine import schedule_cache
    for template in schedule_cache._templates.values(): template.launch = None

  def __enter__(self) -> StageClock:
    import tinychad.engine.realize as realize_mod
    from tinychad.device import Buffer
    from tinychad.runtime.compiled import Compiled
    from tinychad.runtime.threads import KernelList
    realize_mod.graph_key = self._timed(realize_mod.graph_key, "graph key")
    realize_mod.lookup = self._timed(realize_mod.lookup, "schedule")
    realize_mod.schedule_graph = self._timed(realize_mod.schedule_graph, "schedule")
    realize_mod.run_schedule = self._timed(realize_mod.run_schedule, "run rest")
    realize_mod.run_launch = self._timed(realize_mod.run_launch, "run rest")
    Buffer.allocate = self._timed(Buffer.allocate, "buffers")
    Compiled.run = staticmethod(self._timed(Compiled.__dict__["run"].__func__, "launch"))
    launcher = Compiled.launcher
    Compiled.launcher = lambda device, kernel, points: self._timed(launcher(device, kernel, points), "launch")
    KernelList.run = self._timed(KernelList.run, "launch")
    self._drop_launches()
    gc.callbacks.append(self._gc)
    return self

  def __exit__(self, *exc) -> None:
    for owner, name, value in self._saved: setattr(owner, name, value)
    self._drop_launches()
    gc.callbacks.remove(self._gc)

  def breakdown(self, total_s: float) -> dict[str, float]:
    """Exclusive seconds per stage: buffers and launch out of run rest."""
    s = dict(self.seconds)
    # allocations outside run_schedule (inputs, TinyJit's replay) are counted too; they are few
    s["run rest"] -= s["buffers"] + s["launch"]
    s["front end"] = total_s - sum(s[k] for k in STAGES if k not in ("front end", "gc"))
    return s


def small_ops() -> tuple[Callable, int, Callable]:
  from tinychad import Tensor
  import torch
  a, b = Tensor.rand(4).realize(), Tensor.rand(4).realize()
  ta, tb = torch.rand(4), torch.rand(4)

  # 100 ops a step: a shorter step is less often cut by other processes on a shared machine
  def step():
    for _ in range(100): (a + b).realize()

  def torch_step():
    for _ in range(100): ta + tb
  return step, 100, torch_step


def gelus() -> tuple[Callable, int, Callable]:
  from tinychad import Tensor
  import torch
  a, ta = Tensor.rand(4).realize(), torch.rand(4)

  def step():
    for _ in range(100): a.gelu(approximate="tanh").realize()

  def torch_step():
    for _ in range(100): torch.nn.functional.gelu(ta, approximate="tanh")
  return step, 100, torch_step


def cnn_step() -> tuple[Callable, int, Callable]:
  import numpy as np
  import torch
  from tinychad import Tensor, nn
  from tinychad.nn.state import get_parameters
  from tinychad.nn.optim import SGD, AdamW
  Tensor.manual_seed(0)
  model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(400, 10))
  opt = SGD(get_parameters(model), lr=0.01, momentum=0.9)
  x = Tensor.randn(16, 1, 28, 28).realize()
  y = Tensor(np.arange(16) % 10)

  def step():
    opt.zero_grad()
    loss = model(x).cross_entropy(y)
    loss.backward()
    opt.step()
    return loss.item()

  tmodel = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 16, 3),
                               torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(400, 10))
  topt = torch.optim.SGD(tmodel.parameters(), lr=0.01, momentum=0.9)
  tx, ty = torch.randn(16, 1, 28, 28), torch.arange(16) % 10

  def torch_step():
    topt.zero_grad()
    loss = torch.nn.functional.cross_entropy(tmodel(tx), ty)
    loss.backward()
    topt.step()
    return loss.item()
  return step, 1, torch_step


def transformer_step() -> tuple[Callable, int, Callable]:
  import numpy as np
  import torch
  from tinychad import Tensor, nn
  from tinychad.nn.state import get_parameters
  from tinychad.nn.optim import SGD, AdamW
  Tensor.manual_seed(0)
  vocab, d, tokens, batch = 64, 64, 16, 4
  embed = nn.Embedding(vocab, d)
  layers = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 4, 128, dropout=0.0, batch_first=True), 2)
  head = nn.Linear(d, vocab)
  params = get_parameters([embed, layers, head])
  opt = AdamW(params, lr=1e-3)
  rng = np.random.default_rng(0)
  x, y = Tensor(rng.integers(0, vocab, (batch, tokens))), Tensor(rng.integers(0, vocab, (batch * tokens,)))

  def step():
    opt.zero_grad()
    loss = head(layers(embed(x))).reshape(batch * tokens, vocab).cross_entropy(y)
    loss.backward()
    opt.step()
    return loss.item()

  tembed = torch.nn.Embedding(vocab, d)
  tlayers = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(d, 4, 128, dropout=0.0, batch_first=True), 2,
                                        enable_nested_tensor=False)
  thead = torch.nn.Linear(d, vocab)
  topt = torch.optim.AdamW([*tembed.parameters(), *tlayers.parameters(), *thead.parameters()], lr=1e-3)
  tx, ty = torch.from_numpy(x.numpy()), torch.from_numpy(y.numpy())

  def torch_step():
    topt.zero_grad()
    loss = torch.nn.functional.cross_entropy(thead(tlayers(tembed(tx))).reshape(batch * tokens, vocab), ty)
    loss.backward()
    topt.step()
    return loss.item()
  return step, 1, torch_step


WORKLOADS = {"small ops (per op)": small_ops, "gelu (per op)": gelus, "CNN train step": cnn_step,
             "transformer train step": transformer_step}


def best_time(fn: Callable, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = clock()
    fn()
    times.append(clock() - start)
  return min(times)


def profile(name: str, build: Callable, steps: int) -> list[str]:
  from tinychad import TinyJit, GlobalCounters
  import torch
  torch.set_num_threads(1)
  step, ops, torch_step = build()
  for _ in range(3): step(), torch_step()
  GlobalCounters.reset()
  step()
  kernels = GlobalCounters.kernel_count
  eager_s, torch_s = best_time(step, steps), best_time(torch_step, steps)
  # the stages of the fastest instrumented step: on a shared machine, the others carry other processes' time
  best = None
  with StageClock() as stage_clock:
    for _ in range(steps):
      for stage in STAGES: stage_clock.seconds[stage] = 0.0
      start = clock()
      step()
      elapsed = clock() - start
      if best is None or elapsed < best[0]: best = (elapsed, stage_clock.breakdown(elapsed))
  stages = best[1]
  jitted = TinyJit(step) if ops == 1 else None
  jit_s = None
  if jitted is not None:
    for _ in range(3): jitted()
    jit_s = best_time(jitted, steps)
  unit, per = ("us", 1e6 / ops) if ops > 1 else ("ms", 1e3)
  cells = " | ".join(f"{stages[k] * per:.2f}" for k in STAGES)
  jit = f"{jit_s * per:.2f}" if jit_s is not None else "n/a"
  return [f"| {name} ({unit}) | {kernels} | {eager_s * per:.2f} | {jit} | {torch_s * per:.2f} | {eager_s / torch_s:.1f}x | {cells} |"]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=30, help="timed steps per workload (the best one counts)")
  parser.add_argument("--cpu-time", action="store_true", help="time in the thread's CPU seconds (run with THREADS=1)")
  parser.add_argument("--only", nargs="*", choices=["small", "gelu", "cnn", "transformer"], help="these workloads only")
  args = parser.parse_args()
  if args.cpu_time:
    global clock
    clock = time.thread_time
  print("| workload | kernels/step | eager | TinyJit | torch eager | eager/torch | " + " | ".join(STAGES) + " |")
  print("|---|---:|---:|---:|---:|---:|" + "---:|" * len(STAGES))
  for name, build in WORKLOADS.items():
    if args.only and not any(name.lower().startswith(word) for word in args.only): continue
    for line in profile(name, build, args.steps): print(line, flush=True)


if __name__ == "__main__": main()
