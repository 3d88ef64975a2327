"""BEAM search: a kernel's lanes and loop order chosen by timing candidates, not by the heuristic alone.

in: a kernel tree (`ast`, STORE root), its name, the device that will run it ("CPU" or "LLVM") and
    the beam width n (`BEAM=n`, n >= 1; without BEAM, engine/realize.py never imports this module)
out: the Opts to lower the kernel with (`linearize(ast, name, opts)`): the fastest candidate that
     computes what the heuristic's kernel computes, or the heuristic's own Opts when none is faster.
How a candidate is tried: lowered here, rendered, compiled and loaded by the device's own declaration
(runtime/compiled.py: its renderer and compiler, through the kernel cache, several compiles at
once), then run on scratch buffers
of the kernel's sizes and dtypes: random inputs (positive floats, small positive integers) and an
output of our own, never the user's buffers. Its first run must reproduce the heuristic's output
(floats within RTOL of the output's scale: partial sums reassociate; everything else exactly) into
an output filled with values that differ from it everywhere, or it is dropped, like a candidate
that fails to lower or compile. Its time is the median of TIMED_RUNS samples.
The rounds, a beam on the loop order only:
  1. every opt.candidate_opts is timed, none pruned unseen: they vary one family at a time around
     the heuristic, so there are at most a few tens, and a tile's speed can't be told from a
     neighbour's (one more accumulator than registers halves it);
  2. the opt.order_variants of round one's n fastest are timed: the order decides which operand
     stays in cache, which depends on the tile, so orders are tried on the tiles that proved fast
     instead of multiplying every tile by every order;
  3. the heuristic and the n fastest of all are timed again in turns (FINAL_RUNS samples each), so
     a load that came and went on this shared machine touches them alike; the fastest wins if it
     beats the heuristic by MIN_GAIN, else the heuristic stays.
Searches run one at a time (a device may lower on several threads; they'd skew each other's times).
The winner is stored in the disk cache (`<cache_dir>/<key>.beam.json`, a temporary file moved into
place with os.replace; nothing with CACHE=0), keyed by the kernel tree's text, its name, the device,
its compiler and flags (or target CPU), n and the hash of tinychad's source, so the next process
reads it instead of searching. DEBUG>=2 prints one line per kernel: its name, the heuristic's and
the winner's time and how many candidates were tried.
"""
from __future__ import annotations
import functools
import json
import math
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
import numpy as np
from tinychad.codegen import opt
from tinychad.codegen.linearize import Program, linearize, opt_inputs
from tinychad.device import Buffer, Device
from tinychad.dtype import DType, dtypes
from tinychad.helpers import DEBUG, atomic_write, getenv, prod
from tinychad.ops import BufferOps, KernelNode
from tinychad.runtime.cache import cache_dir, cache_key, code_version, tree_text
from tinychad.runtime.compiled import Compiled, Kernel
from tinychad.runtime.threads import run_parallel
from tinychad.view import View

TIMED_RUNS = 5          # samples per candidate in rounds one and two
FINAL_RUNS = 7          # samples per finalist in round three
MIN_SAMPLE_S = 5e-3     # a sample repeats a short kernel this long: timer, calls, thread wake-ups
MAX_REPEATS = 1000
SLOW_FACTOR = 2.0       # a candidate whose first sample takes this many times the best so far gets no more
MIN_GAIN = 0.05         # a winner must beat the heuristic by this much: less was noise on 2 shared cores
RTOL = 1e-4             # float outputs: tolerance for reassociated sums, relative to the output's scale

_search_lock = threading.Lock()


# ---- scratch buffers ----

def _view_extent(view: View) -> int:
  """One past the largest buffer index the view reaches at a valid position."""
  bounds = view.mask if view.mask is not None else tuple((0, s) for s in view.shape)
  if any(lo >= hi for lo, hi in bounds): return 0
  return 1 + view.offset + sum(max(lo * st, (hi - 1) * st) for (lo, hi), st in zip(bounds, view.strides))


def buffer_specs(ast: KernelNode) -> dict[int, tuple[int, DType]]:
  """Elements and dtype of each buffer the kernel touches, by number (0 is the output): as many as
  its views reach. The bottom view of a tracker is the one that indexes the buffer itself."""
  specs: dict[int, tuple[int, DType]] = {}
  for node in ast.walk():
    if node.op not in (BufferOps.LOAD, BufferOps.STORE, BufferOps.GATHER): continue
    number, st = node.arg[:2]
    extent = _view_extent(st.views[0])
    if node.op is BufferOps.GATHER: extent += (node.arg[3] - 1) * node.arg[2]   # every row of the table
    size = max(extent, specs[number][0] if number in specs else 0)
    specs[number] = (size, node.dtype)
  return specs


def _random_values(rng: np.random.Generator, size: int, dtype: DType) -> np.ndarray:
  # positive values: no log or sqrt of a negative, no division by zero, sums that don't cancel to noise
  if dtype.is_float: return rng.uniform(0.5, 1.5, size).astype(dtype.np)
  if dtype == dtypes.bool: return rng.integers(0, 2, size).astype(np.bool_)
  return rng.integers(1, 10, size).astype(dtype.np)


def _unlike(reference: np.ndarray) -> np.ndarray:
  """Values that differ from `reference` everywhere, so an element a candidate never writes shows."""
  if reference.dtype.kind == "f": return np.where(np.isnan(reference), 0, np.nan).astype(reference.dtype)
  return ~reference


def _matches(got: np.ndarray, want: np.ndarray) -> bool:
  if want.dtype.kind != "f": return bool(np.array_equal(got, want))
  finite = np.abs(want[np.isfinite(want)]).astype(np.float64)
  scale = float(finite.max()) if finite.size else 1.0
  return bool(np.allclose(got, want, rtol=RTOL, atol=RTOL * scale, equal_nan=True))


# ---- trying candidates ----

@dataclass(eq=False)
class _Trial:
  opts: opt.Opts
  run: Callable[[], None] | None = None     # None: it didn't lower or compile
  kernel: Kernel | None = None              # keeps the native code loaded
  seconds: float = math.inf                 # inf until timed, and for a wrong or failed candidate


class _Bench:
  """One kernel's scratch buffers, and its candidates compiled, checked and timed on them."""
  def __init__(self, ast: KernelNode, name: str, device: Compiled, work: int):
    self.ast, self.name, self.device, self.work = ast, name, device, work
    rng = np.random.default_rng(0)
    self.buffers = {}
    for number, (size, dtype) in sorted(buffer_specs(ast).items()):
      buf = Buffer(device.name, max(size, 1), dtype).allocate()
      if number != 0: buf.copyin(_random_values(rng, buf.size, dtype))
      self.buffers[number] = buf
    self.addresses = [buf.address for _, buf in sorted(self.buffers.items())]
    self.output = self.buffers[0].as_numpy()
    self.reference: np.ndarray | None = None
    self.repeats = 1
    self.tried = self.rejected = 0

  def _program(self, opts: opt.Opts) -> Program | None:
    try:
      return linearize(self.ast, self.name, opts)
    except Exception:     # a candidate the lowering can't take is dropped, whatever the error
      return None

  def _build(self, program: Program | None) -> Kernel | None:
    if program is None: return None
    try:
      return self.device.build(program)
    except Exception:     # a renderer or compiler error (or an LLVM verifier one) drops the candidate
      return None

  def build(self, candidates: list[opt.Opts]) -> list[_Trial]:
    """Each candidate lowered (Python, here), then rendered, compiled and loaded on threads (the
    compilers run outside the GIL); a failure leaves its run None."""
    programs = [self._program(opts) for opts in candidates]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
      kernels = list(pool.map(self._build, programs))
    trials = []
    for opts, kernel in zip(candidates, kernels):
      trial = _Trial(opts, kernel=kernel)
      if kernel is not None:
        trial.run = functools.partial(run_parallel, kernel.fn, self.addresses, kernel.parallel, self.work, kernel.address)
      trials.append(trial)
    self.tried += len(trials)
    return trials

  def set_reference(self, trial: _Trial) -> None:
    """The heuristic's output is what every candidate must compute; its time sets the sample length."""
    start = time.perf_counter()
    trial.run()
    once = time.perf_counter() - start
    self.reference = self.output.copy()
    self.repeats = max(1, min(MAX_REPEATS, math.ceil(MIN_SAMPLE_S / max(once, 1e-9))))

  def correct(self, trial: _Trial) -> bool:
    self.output[:] = _unlike(self.reference)
    trial.run()
    return _matches(self.output, self.reference)

  def sample(self, trial: _Trial) -> float:
    """Seconds per run, from `repeats` runs back to back."""
    start = time.perf_counter()
    for _ in range(self.repeats): trial.run()
    return (time.perf_counter() - start) / self.repeats

  def time_all(self, trials: list[_Trial], best: float = math.inf) -> list[_Trial]:
    """Check and time each trial (in place); the ones that ran and matched, in the order given."""
    good = []
    for trial in trials:
      if trial.run is None or not self.correct(trial):
        self.rejected += 1
        continue
      samples = [self.sample(trial)]
      # one sample is enough to drop a candidate far behind the best: the runs left would be wasted
      if samples[0] < SLOW_FACTOR * best: samples += [self.sample(trial) for _ in range(TIMED_RUNS - 1)]
      trial.seconds = statistics.median(samples)
      best = min(best, trial.seconds)
      good.append(trial)
    return good

  def final(self, trials: list[_Trial]) -> None:
    """Time the finalists again, one sample each in turn, so they see the same machine load."""
    samples: list[list[float]] = [[] for _ in trials]
    for _ in range(FINAL_RUNS):
      for trial, got in zip(trials, samples): got.append(self.sample(trial))
    for trial, got in zip(trials, samples): trial.seconds = statistics.median(got)


@dataclass
class SearchResult:
  opts: opt.Opts
  heuristic_s: float     # the heuristic's time (nan when nothing was timed)
  best_s: float          # the winner's time
  tried: int             # candidates lowered (the heuristic included)
  rejected: int          # of those, the ones that failed to lower or compile or computed something else


def _fastest(trials: list[_Trial], n: int, skip: _Trial | None = None) -> list[_Trial]:
  return sorted((t for t in trials if t is not skip), key=lambda t: t.seconds)[:n]


def run_search(ast: KernelNode, name: str, device: str, width: int) -> SearchResult:
  """Time the candidates (module docstring: three rounds) and return the winner, without the cache."""
  dims, leaves, dtypes_used, ops_used = opt_inputs(ast)
  candidates = opt.candidate_opts(dims, leaves, dtypes_used, ops_used)
  untimed = SearchResult(candidates[0], math.nan, math.nan, 1, 0)
  if len(candidates) == 1 and not opt.order_variants(dims, candidates[0]): return untimed
  bench = _Bench(ast, name, Device[device], prod(size for size, _ in dims))
  (heuristic,) = bench.build(candidates[:1])
  # a heuristic that doesn't compile is the device's error to report, with its own message
  if heuristic.run is None: return untimed
  bench.set_reference(heuristic)
  timed = bench.time_all([heuristic] + bench.build(candidates[1:]))
  # a kernel that doesn't reproduce its own output can't judge the others
  if heuristic not in timed: return untimed
  best = min(t.seconds for t in timed)
  orders = [o for t in _fastest(timed, width) for o in opt.order_variants(dims, t.opts)]
  # candidates are distinct already, so what distinct_opts keeps past them is new
  new_orders = opt.distinct_opts(dims, candidates + orders)[len(candidates):]
  timed += bench.time_all(bench.build(new_orders), best)
  finalists = [heuristic] + _fastest(timed, width, skip=heuristic)
  bench.final(finalists)
  winner = min(finalists, key=lambda t: t.seconds)
  if winner.seconds > heuristic.seconds * (1 - MIN_GAIN): winner = heuristic
  return SearchResult(winner.opts, heuristic.seconds, winner.seconds, bench.tried, bench.rejected)


# ---- the disk cache ----

def _cache_path(ast: KernelNode, name: str, device: str, width: int) -> Path | None:
  directory = cache_dir()
  if directory is None: return None
  key = cache_key("beam", tree_text(ast), name, device, Device[device].identity(), str(width), code_version())
  return directory / f"{key}.beam.json"


def _read_cached(path: Path | None) -> SearchResult | None:
  if path is None: return None
  try:
    data = json.loads(path.read_text())
    vector = tuple(data["vector"]) if data["vector"] is not None else None
    opts = opt.Opts({d: a for d, a in data["upcast"]}, vector, data["order"], data["unroll"], data["stage"], data["cache_rows"],
                     data["stream"], data["transposed"])
    return SearchResult(opts, data["heuristic_s"], data["best_s"], data["tried"], data["rejected"])
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _write_cached(path: Path | None, result: SearchResult) -> None:
  if path is None: return
  o = result.opts
  data = {"upcast": list(o.upcast.items()), "vector": o.vector, "order": o.order, "unroll": o.unroll, "stage": o.stage,
          "cache_rows": o.cache_rows, "stream": o.stream, "transposed": o.transposed,
          "heuristic_s": result.heuristic_s, "best_s": result.best_s, "tried": result.tried, "rejected": result.rejected}
  atomic_write(path, json.dumps(data).encode())


def search_opts(ast: KernelNode, name: str, device: str, width: int | None = None) -> opt.Opts:
  """The Opts to lower the kernel with on `device` ("CPU" or "LLVM"): the cached winner of an earlier
  search, else a new search with beam width `width` (default: BEAM)."""
  width = width if width is not None else getenv("BEAM", 0)
  # NOOPT asks for plain loops, and isn't part of the cache key
  if getenv("NOOPT", 0): return opt.choose_opts(*opt_inputs(ast))
  with _search_lock:
    path = _cache_path(ast, name, device, width)
    result, source = _read_cached(path), "cached"
    if result is None:
      result, source = run_search(ast, name, device, width), "searched"
      _write_cached(path, result)
  if DEBUG() >= 2: print(f"  beam {name:30s} {source}: {_summary(result)}")
  if DEBUG() >= 3: print(f"  beam {name:30s} chose {result.opts}")
  return result.opts


def _summary(result: SearchResult) -> str:
  if math.isnan(result.heuristic_s): return "nothing timed (one candidate, or the heuristic did not run)"
  return (f"heuristic {result.heuristic_s * 1e6:9.1f} us, best {result.best_s * 1e6:9.1f} us, "
          f"{result.tried} candidates tried, {result.rejected} rejected")


def search_item(item) -> opt.Opts | None:
  """search_opts for a ScheduleItem on its output's device; None where nothing is compiled (NUMPY) and for the
  kernels with lowerings of their own, which take no opts (a scatter-add, a flash attention: not a STORE tree)."""
  device = Device[item.output.device]
  if not isinstance(device, Compiled) or item.ast.op is not BufferOps.STORE: return None
  return search_opts(item.ast, item.name, device.name)
