"""The compiled-kernel cache across processes.

in: subprocesses that run one kernel on CPU (or LLVM) with TINYCHAD_CACHE pointing at a temp dir
out: pass when a second process compiles nothing (and, through the kernel record, lowers nothing),
     a record made with other code generator settings (NOOPT) is not used, a damaged .so, .o or
     record is rebuilt or ignored, two processes compiling the same kernel at once both get right
     answers, and the LLVM device's prepare compiles a schedule's kernels up front.
"""
import os
import subprocess
import sys
from pathlib import Path
import numpy as np
import pytest

SCRIPT = """
import numpy as np
from tinychad import Tensor
from tinychad.lazy import LazyBuffer
from tinychad.ops import BinaryOps, ReduceOps
from tinychad.runtime.cache import CacheStats
x = np.arange(24, dtype=np.float32).reshape(4, 6)
out = Tensor(LazyBuffer.from_numpy(x, DEVICE).e(BinaryOps.MUL, LazyBuffer.from_numpy(x, DEVICE)).r(ReduceOps.SUM, (1,))).numpy()
assert np.allclose(out, (x * x).sum(1, keepdims=True)), out
print(f"compiles={CacheStats.compiles} disk_hits={CacheStats.disk_hits} record_hits={CacheStats.record_hits}")
"""


def run(cache: Path, device: str = "CPU") -> dict:
  env = dict(os.environ, TINYCHAD_CACHE=str(cache), CACHE="1")
  res = subprocess.run([sys.executable, "-c", f"DEVICE = {device!r}\n" + SCRIPT], env=env, capture_output=True, text=True, timeout=60)
  assert res.returncode == 0, res.stderr
  return dict(kv.split("=") for kv in res.stdout.split())


@pytest.mark.parametrize("device", ["CPU", "LLVM"])
def test_second_process_reuses_disk_cache(tmp_path, device):
  assert run(tmp_path, device) == {"compiles": "1", "disk_hits": "0", "record_hits": "0"}
  # the kernel record lets the second process skip lowering and rendering too
  assert run(tmp_path, device) == {"compiles": "0", "disk_hits": "1", "record_hits": "1"}


@pytest.mark.parametrize("device", ["CPU", "LLVM"])
def test_damaged_record_is_ignored(tmp_path, device):
  run(tmp_path, device)
  (record,) = tmp_path.glob("*.kernel.json")
  record.write_text('{"library": ')
  assert run(tmp_path, device) == {"compiles": "0", "disk_hits": "1", "record_hits": "0"}


@pytest.mark.parametrize("device", ["CPU", "LLVM"])
def test_record_is_keyed_by_codegen_settings(tmp_path, device, monkeypatch):
  monkeypatch.setenv("NOOPT", "0")    # the first record with the optimizations on, whatever the environment has
  run(tmp_path, device)
  monkeypatch.setenv("NOOPT", "1")    # another code generator setting: the record doesn't apply
  assert run(tmp_path, device)["record_hits"] == "0"
  assert run(tmp_path, device)["record_hits"] == "1"


@pytest.mark.parametrize("device, suffix", [("CPU", "so"), ("LLVM", "o")])
def test_truncated_library_is_rebuilt(tmp_path, device, suffix):
  run(tmp_path, device)
  (lib,) = tmp_path.glob(f"*.{suffix}")
  lib.write_bytes(lib.read_bytes()[:100])
  assert run(tmp_path, device)["compiles"] == "1"
  assert run(tmp_path, device)["compiles"] == "0"


def test_missing_checksum_is_rebuilt(tmp_path):
  run(tmp_path)
  (checksum,) = tmp_path.glob("*.sha256")
  checksum.unlink()
  assert run(tmp_path)["compiles"] == "1"


def test_concurrent_compiles_both_succeed(tmp_path):
  env = dict(os.environ, TINYCHAD_CACHE=str(tmp_path), CACHE="1")
  procs = [subprocess.Popen([sys.executable, "-c", "DEVICE = 'CPU'\n" + SCRIPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for _ in range(4)]
  for p in procs:
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
  # no temp files left behind: one library, its checksum and the kernel's record
  assert sorted(f.suffix for f in tmp_path.iterdir()) == [".json", ".sha256", ".so"]
  assert run(tmp_path) == {"compiles": "0", "disk_hits": "1", "record_hits": "1"}


def test_cache_disabled_writes_nothing(tmp_path):
  env = dict(os.environ, TINYCHAD_CACHE=str(tmp_path), CACHE="0")
  res = subprocess.run([sys.executable, "-c", "DEVICE = 'CPU'\n" + SCRIPT], env=env, capture_output=True, text=True, timeout=60)
  assert res.returncode == 0, res.stderr
  assert "compiles=1" in res.stdout and not list(tmp_path.iterdir())


def test_llvm_build_compiles_the_schedule_ahead(monkeypatch):
  from tinychad import Tensor
  from tinychad.device import Device
  from tinychad.engine.realize import build
  from tinychad.engine.schedule import create_schedule
  from tinychad.lazy import LazyBuffer
  from tinychad.ops import BinaryOps, ReduceOps, UnaryOps
  from tinychad.runtime.cache import CacheStats
  from tinychad.runtime.threads import KernelList
  monkeypatch.setenv("CACHE", "0")
  x = np.linspace(0.5, 3, 96, dtype=np.float32).reshape(8, 12)
  a = LazyBuffer.from_numpy(x, "LLVM")
  # three kernels: a reduce, an elementwise op on its result, and a second reduce
  out = a.r(ReduceOps.SUM, (1,)).e(UnaryOps.LOG2).e(BinaryOps.ADD, a.r(ReduceOps.MAX, (1,)))
  items = [it for it in create_schedule([out]) if it.is_kernel]
  assert len(items) >= 2
  device = Device["LLVM"]
  # the thread pool's own C library (built once per process, on the first launch it prepares) is no kernel
  KernelList.available(1)
  CacheStats.reset()
  build(items)
  assert all((it.ast, it.name) in device.programs for it in items)
  compiled = CacheStats.compiles
  np.testing.assert_allclose(Tensor(out).numpy(), np.log2(x.sum(1, keepdims=True)) + x.max(1, keepdims=True), rtol=1e-6)
  assert CacheStats.compiles == compiled     # realizing compiled nothing more


def _max_kernels(count: int) -> tuple[list, list]:
  """`count` reduce kernels with the same name (r_8_12) and different trees, and their outputs."""
  from tinychad import Tensor
  from tinychad.engine.schedule import create_schedule
  x = Tensor(np.linspace(-2, 3, 96, dtype=np.float32).reshape(8, 12))
  outs = [(x * float(k + 1)).max(1) for k in range(count)]
  items = [it for it in create_schedule([o.lazydata for o in outs]) if it.is_kernel]
  assert len(items) == count and len({it.name for it in items}) == 1
  return items, outs


def test_cpu_build_puts_a_schedule_in_a_few_libraries(monkeypatch):
  """A schedule's new kernels share a library per core (one compiler process each), under names of
  their own there, even when their kernel names are the same."""
  from tinychad.device import Device
  from tinychad.engine.realize import build
  from tinychad.runtime.cache import CacheStats
  monkeypatch.setenv("CACHE", "0")
  device = Device["CPU"]
  monkeypatch.setattr(device, "programs", {})
  items, outs = _max_kernels(8)
  CacheStats.reset()
  build(items)
  assert all((it.ast, it.name) in device.programs for it in items)
  assert CacheStats.compiles <= min(os.cpu_count() or 1, len(items) - 1)
  compiled = CacheStats.compiles
  x = np.linspace(-2, 3, 96, dtype=np.float32).reshape(8, 12)
  for k, out in enumerate(outs): np.testing.assert_allclose(out.numpy(), (x * (k + 1)).max(1), rtol=1e-6)
  assert CacheStats.compiles == compiled     # realizing compiled nothing more


def test_cpu_build_builds_each_kernel_alone_when_its_library_fails(monkeypatch):
  from tinychad.device import Device
  from tinychad.engine.realize import build
  from tinychad.runtime.cache import CacheStats
  from tinychad.runtime.cc import CompileError, build_c
  monkeypatch.setenv("CACHE", "0")
  device = Device["CPU"]
  monkeypatch.setattr(device, "programs", {})
  def failing_libraries(source, name, *args, **kwargs):
    if ", " in name: raise CompileError(f"kernels {name}: made to fail")
    return build_c(source, name, *args, **kwargs)
  monkeypatch.setattr(device, "compile", failing_libraries)
  items, outs = _max_kernels(4)
  CacheStats.reset()
  build(items)
  assert all((it.ast, it.name) in device.programs for it in items) and CacheStats.compiles == len(items)
  np.testing.assert_allclose(outs[3].numpy(), np.linspace(-2, 3, 96, dtype=np.float32).reshape(8, 12).max(1) * 4, rtol=1e-6)
