"""`python -m bench.opencl [--quick] [--local-tiles]`: tinychad's OPENCL device next to tinygrad's CL backend on
the same OpenCL platform (PoCL on these machines: OpenCL on the CPU), with tinychad's CPU device as the reference,
in one run; `--local-tiles` adds a column with matmul-shaped kernels tiled through work-group memory.

Each row times a realized result (the kernels, not the host copy) after warm-up calls that build every kernel;
the median of the repeats. OpenCL on a CPU has no speed target here: the numbers show where the GPU lowering
stands (bench/README.md, "OPENCL").
"""
from __future__ import annotations
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""): sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DEV", "CL")          # tinygrad's device, read when it is imported


def _median_seconds(fn, warmup: int = 2, repeats: int = 5) -> float:
  for _ in range(warmup): fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _workloads(quick: bool) -> list[tuple[str, str, float, object]]:
  """(row name, unit, work per call in the unit's numerator, build(rand, sync) -> call)."""
  n, size, rows = (256, 1 << 20, 256) if quick else (512, 1 << 22, 1024)

  def matmul(rand, sync):
    a, b = rand(n, n), rand(n, n)
    return lambda: sync((a @ b).realize())

  def elementwise(rand, sync):
    a, b, c = rand(size), rand(size), rand(size)
    return lambda: sync((a * b + c).realize())

  def reduce_sum(rand, sync):
    a = rand(size)
    return lambda: sync(a.sum().realize())

  def softmax(rand, sync):
    a = rand(rows, 1024)
    return lambda: sync(a.softmax(-1).realize())

  def conv(rand, sync):
    x, w = rand(batch, 32, 32, 32), rand(64, 32, 3, 3)
    return lambda: sync(x.conv2d(w, padding=1).realize())
  batch = 2 if quick else 8
  return [(f"matmul {n}x{n}", "GFLOP/s", 2 * n ** 3 / 1e9, matmul),
          (f"conv 3x3 {batch}x32x32x32->64", "GFLOP/s", 2 * batch * 64 * 32 * 32 * 32 * 9 / 1e9, conv),
          (f"a*b+c {size}", "GB/s", 16 * size / 1e9, elementwise),
          (f"sum {size}", "GB/s", 4 * size / 1e9, reduce_sum),
          (f"softmax {rows}x1024", "GB/s", 8 * rows * 1024 / 1e9, softmax)]


def _tinychad(device: str, local_tiles: bool = False):
  """rand and sync for tinychad on `device` (its OPENCL launches already wait for their kernels);
  `local_tiles`: OPENCL tiles matmul-shaped kernels through work-group memory even where that is ordinary
  memory (PoCL), as it does on a GPU."""
  from tinychad import Tensor
  from tinychad.device import Device
  if device == "OPENCL":
    opencl = Device[device]
    wanted = local_tiles or opencl.dedicated_local_memory
    if opencl.local_memory != wanted: opencl.local_memory, opencl.programs = wanted, {}     # kernels lowered anew
  return (lambda *shape: Tensor.rand(*shape, device=device).realize()), (lambda t: t)


def _tinygrad():
  """rand and sync for tinygrad on its default device (DEV=CL here)."""
  from tinygrad import Device, Tensor

  def sync(t):
    Device[t.device].synchronize()
    return t
  return (lambda *shape: Tensor.rand(*shape).realize()), sync


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="smaller sizes")
  parser.add_argument("--local-tiles", action="store_true",
                      help="a tinychad OPENCL column with matmul-shaped kernels tiled through work-group memory "
                           "(a GPU's choice)")
  args = parser.parse_args(argv)
  from tinychad.device import Device
  columns = {}
  if Device.available("OPENCL"): columns["tinychad OPENCL"] = lambda: _tinychad("OPENCL")
  if Device.available("OPENCL") and args.local_tiles: columns["OPENCL local"] = lambda: _tinychad("OPENCL", True)
  columns["tinychad CPU"] = lambda: _tinychad("CPU")
  try:
    from tinygrad import Device as TinygradDevice
    columns[f"tinygrad {TinygradDevice.DEFAULT}"] = _tinygrad
  except ImportError:
    print("tinygrad is not installed (pip install -e '.[bench]'): no tinygrad column")
  if "tinychad OPENCL" in columns: print(f"OpenCL platform: {Device['OPENCL'].identity()}")
  print(f"{'workload':22s}" + "".join(f"{name:>17s}" for name in columns))
  for name, unit, work, build in _workloads(args.quick):
    cells = []
    for make in columns.values():
      try:
        cells.append(f"{work / _median_seconds(build(*make())):.2f}")
      except Exception as error:     # a library that can't run a row says so in its cell
        cells.append(type(error).__name__)
    print(f"{name:22s}" + "".join(f"{c:>17s}" for c in cells) + f"   {unit}")


if __name__ == "__main__": main()
