"""Realize: the one place a schedule runs.

in: the LazyBuffers to compute (realize), or a schedule of ScheduleItems (run_schedule)
out: each item's output base realized (a Buffer; a cat's piece a view of its cat's, engine/schedule.py), the kernels
     counted in GlobalCounters.
For each kernel whose program its device hasn't loaded yet:
  lower (codegen.lower_item, with BEAM search's opts when BEAM>=1: engine/search.py)
  -> render (the device's renderer) -> compile (the device's compiler, through the kernel cache:
  runtime/cache.py keeps its binaries on disk) -> load (the device's loader),
and a kernel record (the kernel tree -> the binary and the symbol in it) is written, so that a new
process loads the kernel without lowering or rendering it. A kernel tree that differs from another only in where its
inputs start (an LSTM's time steps, codegen/offsets.py) is built once on the host devices (CPU, LLVM; not with
NOOPT=1) and called with each input's address shifted. A kernel that only moves data (a cat, a pad's or a
permute's copy, codegen/copy.py) on a CPU device skips all of that: runtime/copy.py's generic strided copy runs it,
compiled once for every shape (not with NOOPT=1, which compiles everything plainly). All the schedule's new kernels are built
before the first of them runs: a device with `batch` puts several in one binary, one binary per core
(its `parallel_builds`), compiled at once (separate compiler processes); the others compile one after
another. Then a plain realize (no capture, DEBUG, GRAPH or PORT) prepares the schedule's Launch, kept with the
graph's template, and runs it: on the CPU all its kernels in one native call; the same graph later runs that launch
again without scheduling. The long way (run_schedule) runs each kernel by its device's `run`: a capture, DEBUG, GRAPH
and PORT need its ScheduleItems, and a schedule that copies between devices has no launch. At DEBUG>=2 each kernel is
timed alone: DEBUG=2 prints its run time, and its compile time beside it when it was compiled in this realize, and
GlobalCounters.time_sum_s sums run times (at DEBUG>=2 only, as tinygrad's does: two clock reads per kernel would be a
thirtieth of an eager op).
GRAPH=1 and PORT=1 write the graphs and the standalone C program of each realize (viz.py, export/program.py)
before it runs. TinyJit records the kernels run inside `with capture() as steps:`, and the host steps
(`run_on_host`: Python on host buffers between kernels, such as an MPI all-reduce) so that a replay
runs them again in the same place.
"""
from __future__ import annotations
import contextlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterator
from tinychad.codegen import Program, lower_item
from tinychad.codegen.copy import copy_plan
from tinychad.codegen.gpu import lower_gpu
from tinychad.codegen.offsets import split_offsets
from tinychad.device import DEVICE_MEMORY, Buffer, BufferView, Device
from tinychad.engine.schedule import ScheduleItem, schedule_graph
from tinychad.engine.schedule_cache import Template, graph_key, lookup
from tinychad.helpers import DEBUG, EnvFlags, GlobalCounters, getenv
from tinychad.lazy import LazyBuffer
from tinychad.ops import LoadOps
from tinychad.runtime.cache import cache_key, code_version, read_record, tree_text, write_record
from tinychad.runtime.compiled import Compiled, Kernel
from tinychad.runtime.copy import copy_kernel
from tinychad.runtime.threads import KernelList

# the open capture() blocks' lists (a TinyJit recording, a benchmark's): each kernel run is appended
# to every one as (item, its buffers), each copy as (None, [out, in])
_captures: list[list] = []
# a remembered schedule of this many kernels or more runs them in one native call (Launch.kernels); a single kernel
# (an eager op) is quicker called directly than through the list's arrays
LIST_MIN_KERNELS = 2
# what makes a realize take the long way, through ScheduleItems: printing (DEBUG), graphs (GRAPH), ports (PORT)
_LONG_WAY = EnvFlags("DEBUG", "GRAPH", "PORT")


@contextlib.contextmanager
def capture() -> Iterator[list]:
  """The kernels and copies run inside the block, in order, as (ScheduleItem or None, buffers)."""
  steps: list = []
  _captures.append(steps)
  try:
    yield steps
  finally:
    _captures.pop()      # blocks nest, so the last one opened closes first


@dataclass(frozen=True)
class HostCall:
  """A recorded host step: `fn(buffers)` runs Python on host memory between kernels (an MPI collective,
  say). buffers[0] is the buffer it writes (it may also read it); the rest are read."""
  name: str
  fn: Callable[[list[Buffer]], None]


def call_on_host(fn: Callable[[list[Buffer]], None], bufs: list[Buffer]) -> None:
  """fn(bufs) for a host step, which reads and writes its buffers through as_numpy() views: a buffer in a device's
  own memory (OPENCL, CUDA), whose as_numpy() is a copy, reaches fn as a host buffer, copied back after."""
  if not any(buf.device in DEVICE_MEMORY for buf in bufs): return fn(bufs)
  staged = [Buffer("NUMPY", buf.size, buf.dtype).copyin(buf.as_numpy()) if buf.device in DEVICE_MEMORY else buf
            for buf in bufs]
  fn(staged)
  for buf, host in zip(bufs, staged):
    if host is not buf: buf.copyin(host.as_numpy())


class HostWrites:
  """How many host steps run_on_host has run. A host step writes buffers in place (an all-reduce, a broadcast of
  parameters), so TinyJit's constant-kernel skip, which trusts that a buffer it read is unchanged while it is
  the same buffer, runs its constant kernels again once this count moves."""
  count = 0


def run_on_host(name: str, fn: Callable[[list[Buffer]], None], bufs: list[Buffer]) -> None:
  """Run fn(bufs) now and append it to every open capture(), so a TinyJit replay calls fn again on the
  replay's buffers (which is how a jitted training step all-reduces each step's new gradients)."""
  HostWrites.count += 1
  call_on_host(fn, bufs)
  for steps in _captures: steps.append((HostCall(name, fn), bufs))


def realize(outs: list[LazyBuffer]) -> None:
  """Schedule and run: the one entry point (Tensor.realize, Tensor.numpy, TinyJit use it)."""
  # a view of a computed buffer is never copied, so already-computed outputs leave nothing to do
  # (TinyJit realizes its inputs on every call)
  for out in outs:
    if (out if out._base is None else out._base).realized is None: break
  else: return
  key, nodes = graph_key(outs)
  template = lookup(key)
  # a prepared launch runs kernels only: what needs ScheduleItems (a capture, DEBUG's lines, GRAPH, PORT) takes
  # the long way
  plain = not _captures and not _LONG_WAY.any()
  if plain and template is not None and template.launch is not None and template.launch.current():
    run_launch(template.launch, nodes)
    return
  items, template = schedule_graph(outs, key, nodes, template)
  if plain:
    # a new graph runs as its later calls will, through its prepared launch (all its kernels in one native call),
    # its kernels built first: a decoding loop whose cache grows makes a new graph at every token, and running its
    # ~80 kernels one by one from Python cost more than preparing the launch
    build(items)
    template.launch = Launch.prepare(template, items)
    if template.launch is not None:
      run_launch(template.launch, nodes)
      return
  if getenv("GRAPH", 0):
    from tinychad.viz import save_graphs
    for path in save_graphs(outs, items): print(f"graph: {path}")
  if getenv("PORT", 0):
    from tinychad.export import write_port
    write_port(outs, items)
  run_schedule(items)


def run_schedule(items: list[ScheduleItem]) -> None:
  start = time.perf_counter()
  kernels, debug = 0, DEBUG()
  compile_s: dict[tuple, float] = {}
  building = 0.0
  for index, item in enumerate(items):
    out, ast = item.output, item.ast
    # a cat's piece is a view of the cat's buffer, which an earlier item allocated
    buf = Buffer(out.device, out.size, out.dtype).allocate() if item.into is None else \
      BufferView(item.into[0].realized, item.into[1], out.size)
    if ast.op is LoadOps.COPY:
      buf.copyin(item.inputs[0].realized.as_numpy())
      for steps in _captures: steps.append((None, [buf, item.inputs[0].realized]))
    elif item.is_kernel and out.size > 0:
      device = Device[out.device]
      info = item.info
      program = device.programs.get((ast, info[0]))
      if program is None:
        # the first kernel not loaded yet: build it with every other new one of the schedule (at
        # DEBUG>=3 alone, so that its tree, IR and source print together)
        t0 = time.perf_counter()
        compile_s.update(build(items[index:] if debug < 3 else [item]))
        building += time.perf_counter() - t0
        program = device.programs[(ast, info[0])]
      bufs = [buf]
      for i in item.inputs: bufs.append(i.realized)
      t0 = time.perf_counter()
      device.run(program, bufs, info[3])
      elapsed = time.perf_counter() - t0
      for steps in _captures: steps.append((item, bufs))
      kernels += 1
      _count(info)
      if debug >= 2:
        GlobalCounters.time_sum_s += elapsed
        _print_kernel(item, elapsed, compile_s.get((ast, info[0])))
    out.realized, out.srcs = buf, ()
  if debug >= 1 and items:
    elapsed = time.perf_counter() - start
    compiling = f" ({building * 1e3:.2f} ms of it loading and building kernels)" if building else ""
    print(f"realize: {len(items)} items, {kernels} kernels, {elapsed*1e3:.2f} ms{compiling}")


class Launch:
  """A remembered schedule (schedule_cache.Template) prepared to run again without ScheduleItems, kernel lookups
  or thread decisions: per item, where its output goes (a position in the graph's nodes, or -1-i for the i'th
  buffer the scheduler made), the output buffer's (device, size, dtype), the inputs' places, a call that runs the
  loaded kernel on the buffers (None: the item only allocates, as EMPTY or an empty output does), how many
  constant arguments its kernel takes after the buffers (a generic copy's one), and for a cat's piece the place of
  the cat whose buffer it is a view of and the element where it starts there (else None); `totals` is the
  counters of all its kernels summed (kernels, ops, bytes), added once per run.
  Why a hit is right: it hangs on the template, so it is found by the graph's key, which fixes every op, argument,
  view, dtype, device and shape, which buffers are shared, and NOOPT; so the items, their kernel trees and the
  kernels the devices loaded for them (never replaced once loaded) are the ones run_schedule would use, and only
  the buffers differ, which are read from this graph's nodes on each run. A schedule that copies between devices
  (a copy is no kernel) or runs kernels on two devices is not prepared, so a launch runs on one device, and
  `programs` is that device's table of loaded kernels when it was prepared: a device whose table is replaced (the
  tests' set_noopt forgets every kernel) makes the launch `current()` no more, and the schedule runs the long way,
  building its kernels again.
  On a device that runs kernels natively (the CPU's thread pool), a launch of several kernels runs them all in one
  native call (`kernels`, a KernelList: each run writes its buffers' addresses into the argument slots), as a
  TinyJit replay does: a decoding step's ~80 kernels cost one call instead of ~80 Python calls."""
  __slots__ = ("steps", "made", "device", "programs", "kernels", "totals", "shifted")

  def __init__(self, steps: list[tuple], made: int, device, totals: tuple[int, int, int],
               kernels: KernelList | None = None, shifted: list[tuple[int, int]] | None = None):
    self.steps, self.made, self.device, self.kernels, self.totals = steps, made, device, kernels, totals
    self.shifted = shifted or []    # (argument slot, bytes): what a kernel's Kernel.shifts add to its buffers
    self.programs = device.programs if device is not None else None

  def current(self) -> bool: return self.device is None or self.device.programs is self.programs

  @staticmethod
  def prepare(template: Template, items: list[ScheduleItem]) -> Launch | None:
    """The launch of a template whose items' kernels are loaded (build() has run); None if one can't be."""
    steps, device, listed = [], None, []
    for (ast, out, ins, info, into), item in zip(template.steps, items):
      if ast.op is LoadOps.COPY: return None
      output, call, constants = item.output, None, ()
      if item.is_kernel and output.size > 0:
        if device is not None and Device[output.device] is not device: return None   # outputs on two devices
        device = Device[output.device]
        program = device.programs.get((ast, info[0]))
        if program is None: return None
        call = device.launcher(program, info[3]) if isinstance(device, Compiled) else _runner(device, program, info[3])
        constants = getattr(program, "constants", ())
        listed.append((program, 1 + len(ins), info))
      steps.append((out, (output.device, output.size, output.dtype), ins, call, len(constants), into))
    totals = (len(listed), sum(info[2] * info[3] for _, _, info in listed), sum(info[4] for _, _, info in listed))
    native = isinstance(device, Compiled) and type(device).run is Compiled.run
    if len(listed) < LIST_MIN_KERNELS or not native or not all(KernelList.available(n + len(p.constants)) for p, n, _ in listed):
      return Launch(steps, len(template.made), device, totals)
    kernels = KernelList([(program.address, [0] * n + list(program.constants), program.parallel, info[3])
                          for program, n, info in listed])
    shifted = [(start + i, shift) for (program, _, _), start in zip(listed, kernels.starts)
               for i, shift in enumerate(program.shifts) if shift]
    return Launch(steps, len(template.made), device, totals, kernels, shifted)


def _runner(device, program, points: int) -> Callable[[list[Buffer]], None]:
  return lambda bufs: device.run(program, bufs, points)


def _piece_buffer(into: tuple[int, int], size: int, nodes: list[LazyBuffer], made: list[Buffer | None]) -> Buffer:
  """A prepared step's output that is a cat's piece: a view of the cat's buffer, which an earlier step allocated."""
  cat, start = into
  return BufferView(nodes[cat].realized if cat >= 0 else made[-1 - cat], start, size)


def run_launch(launch: Launch, nodes: list[LazyBuffer]) -> None:
  """A prepared launch over this graph's nodes: run_schedule's work (buffers, kernels, counters) without the items."""
  made: list[Buffer | None] = [None] * launch.made
  if launch.kernels is not None: _run_listed(launch, nodes, made)
  else:
    for out, (device, size, dtype), ins, call, _, into in launch.steps:
      buf = Buffer(device, size, dtype).allocate() if into is None else _piece_buffer(into, size, nodes, made)
      if call is not None:
        bufs = [buf]
        for i in ins: bufs.append(nodes[i].realized if i >= 0 else made[-1 - i])
        call(bufs)
      if out >= 0:
        lb = nodes[out]
        lb.realized, lb.srcs = buf, ()
      else: made[-1 - out] = buf
  kernels, ops, moved = launch.totals
  GlobalCounters.kernel_count += kernels
  GlobalCounters.global_ops += ops
  GlobalCounters.global_mem += moved


def _run_listed(launch: Launch, nodes: list[LazyBuffer], made: list[Buffer | None]) -> None:
  """run_launch's work with every kernel in one native call: the buffers first, their addresses written into the
  kernels' argument slots (a kernel's constants, after its buffers, stay as written) and shifted where a kernel
  shifts them, then the call (on this thread alone where the thread pool can't start)."""
  args, slot = launch.kernels.args, 0
  for out, (device, size, dtype), ins, call, constants, into in launch.steps:
    buf = Buffer(device, size, dtype).allocate() if into is None else _piece_buffer(into, size, nodes, made)
    if call is not None:
      args[slot] = buf.address
      for i in ins:
        slot += 1
        args[slot] = (nodes[i].realized if i >= 0 else made[-1 - i]).address
      slot += 1 + constants
    if out >= 0:
      lb = nodes[out]
      lb.realized, lb.srcs = buf, ()
    else: made[-1 - out] = buf
  for slot, shift in launch.shifted: args[slot] += shift
  if not launch.kernels.run(): launch.kernels.run(threads=1)


def loaded_program(item: ScheduleItem):
  """The program its device runs for `item` (a Kernel on compiled devices), built first if not loaded yet."""
  programs = Device[item.output.device].programs
  program = programs.get((item.ast, item.name))
  if program is None:
    build([item])
    program = programs[(item.ast, item.name)]
  return program


def run_kernel(item: ScheduleItem, bufs: list[Buffer]) -> None:
  """One kernel on the buffers given (TinyJit's replay), built first if its device hasn't loaded it."""
  Device[item.output.device].run(loaded_program(item), bufs, item.points)


def _print_kernel(item: ScheduleItem, run_s: float, compile_s: float | None) -> None:
  built = f"   built in {compile_s * 1e3:8.2f} ms" if compile_s is not None else ""
  print(f"  kernel {GlobalCounters.kernel_count:4d} {item.name:30s} {item.output.device:6s} {run_s*1e6:9.1f} us{built}")


def _count(info: tuple) -> None:
  """GlobalCounters for one kernel run, from its ScheduleItem.info (its run time is counted at DEBUG>=2 only)."""
  _, _, op_count, points, moved = info
  GlobalCounters.kernel_count += 1
  GlobalCounters.global_ops += op_count * points
  GlobalCounters.global_mem += moved


# ---- building: lower -> render -> compile -> load ----

@dataclass
class _New:
  """A kernel to compile: where its Kernel goes, its record's key, its IR and the seconds spent on it so far."""
  key: tuple
  record_key: str
  program: Program
  seconds: float


def build(items: list[ScheduleItem]) -> dict[tuple, float]:
  """Load every kernel of `items` that its device hasn't loaded: from its record when there is one,
  else lowered, rendered and compiled. Returns the seconds each kernel built here took (lowering,
  rendering and compiling its binary; a shared binary's compile counts for each of its kernels)."""
  debug = DEBUG()
  new: dict[Compiled, dict[tuple, _New]] = {}
  shared: list[tuple[Compiled, tuple, tuple, tuple[int, ...]]] = []   # (device, key, the shifted tree's key, shifts)
  for item in items:
    if not item.is_kernel or item.output.size == 0: continue
    device, key = Device[item.output.device], (item.ast, item.name)
    if key in device.programs or key in new.get(device, {}): continue
    if device.renderer is None:           # NUMPY: the program is the kernel tree
      device.programs[key] = item.ast
      continue
    if (copy := _generic_copy(device, item, debug)) is not None:
      device.programs[key] = copy
      continue
    if type(device).run is Compiled.run and not getenv("NOOPT", 0):
      # trees that differ only in where their inputs start build one kernel, called with shifted addresses
      tree, shifts = split_offsets(item.ast)
      if shifts:
        item = ScheduleItem(tree, item.output, item.inputs)
        shared.append((device, key, (tree, item.name), shifts))
        if debug >= 3: print(f"{key[1]}: its inputs' addresses shifted by {shifts} bytes")
        key = (tree, item.name)
        if key in device.programs or key in new.get(device, {}): continue
    start = time.perf_counter()
    record_key = cache_key("record", device.name, tree_text(item.ast), item.name, code_version(), device.identity(),
                           os.getenv("NOOPT", ""), os.getenv("BEAM", ""))
    # DEBUG>=3 shows the IR and the source, so it always lowers
    kernel = _recorded(device, record_key) if debug < 3 else None
    if kernel is not None:
      device.programs[key] = kernel
      continue
    if getattr(device, "gpu_lowering", False): program = lower_gpu(item, device.local_memory)   # OPENCL, CUDA
    else:
      opts = None
      if getenv("BEAM", 0) >= 1:
        from tinychad.engine.search import search_item   # only with BEAM: it imports the whole search
        opts = search_item(item)
      program = lower_item(item, opts)
    new.setdefault(device, {})[key] = _New(key, record_key, program, time.perf_counter() - start)
  seconds: dict[tuple, float] = {}
  for device, members in new.items():
    if device.batch and len(members) > 1:
      binaries = _balanced_parts(list(members.values()), device.parallel_builds)
      with ThreadPoolExecutor(max_workers=len(binaries)) as pool:
        built = [b for group in pool.map(lambda group: _compile(device, group, debug), binaries) for b in group]
    else:
      built = [b for member in members.values() for b in _compile(device, [member], debug)]
    for member, kernel, compile_s in built:
      device.programs[member.key] = kernel
      seconds[member.key] = member.seconds + compile_s
  for device, key, unshifted, shifts in shared:
    device.programs[key] = device.programs[unshifted]._replace(shifts=shifts)
    if unshifted in seconds: seconds[key] = seconds[unshifted]
  return seconds


def _generic_copy(device, item: ScheduleItem, debug: int) -> Kernel | None:
  """The generic copy running `item` on a device that runs kernels natively, if its kernel only moves data."""
  if type(device).run is not Compiled.run or getenv("NOOPT", 0): return None
  plan = copy_plan(item.ast)
  kernel = copy_kernel(plan, len(item.inputs)) if plan is not None else None
  if kernel is not None and debug >= 3: print(f"{item.ast.pretty()}\ngeneric copy: {plan}")
  return kernel


def _recorded(device: Compiled, record_key: str) -> Kernel | None:
  """The kernel its record names, if it was built before and its binary is still cached."""
  record = read_record(record_key)
  handle = device.stored_library(record["binary"]) if record is not None else None
  return None if handle is None else device.kernel(handle, record["symbol"], record["buffers"], record["parallel"])


def _compile(device: Compiled, members: list[_New], debug: int) -> list[tuple[_New, Kernel, float]]:
  """One binary holding these kernels (each under a symbol of its own), their records written; if it
  doesn't compile, each kernel is built alone, so the error names the kernel that failed."""
  start = time.perf_counter()
  programs = [m.program for m in members]
  symbols = [programs[0].name] if len(members) == 1 else [f"{p.name}_{i}" for i, p in enumerate(programs)]
  source = device.renderer(programs, symbols)
  if debug >= 4: print(source)
  try:
    # the members share one contract flag (_balanced_parts groups them by it)
    handle, binary_key = device.library(source, ", ".join(p.name for p in programs), programs[0].contract)
  except Exception:
    if len(members) == 1: raise
    return [built for m in members for built in _compile(device, [m], debug)]
  seconds = time.perf_counter() - start
  built = []
  for member, symbol in zip(members, symbols):
    program = member.program
    record = {"binary": binary_key, "symbol": symbol, "buffers": len(program.globals), "parallel": program.parallel}
    write_record(member.record_key, record)
    built.append((member, device.kernel(handle, symbol, record["buffers"], record["parallel"]), seconds))
  return built


def _balanced_parts(members: list[_New], parts: int) -> list[list[_New]]:
  """`members` cut into binaries: kernels with the same FMA contraction flag (a flag for a whole file)
  together, at most `parts` binaries per flag, of nearly equal size in uops (a stand-in for compile
  time), the biggest placed first."""
  by_flag: dict[bool, list[_New]] = {}
  for member in members: by_flag.setdefault(member.program.contract, []).append(member)
  out = []
  for group in by_flag.values():
    binaries: list[list[_New]] = [[] for _ in range(min(parts, len(group)))]
    sizes = [0] * len(binaries)
    for member in sorted(group, key=lambda m: -len(m.program.uops)):
      lightest = sizes.index(min(sizes))
      binaries[lightest].append(member)
      sizes[lightest] += len(member.program.uops)
    out += binaries
  return out
