"""The compiled-kernel cache across processes.

in: subprocesses that run one kernel on CPU with TINYCHAD_CACHE pointing at a temp dir
out: pass when a second process compiles nothing, a damaged .so is rebuilt, and two processes
     compiling the same kernel at once both get right answers.
"""
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import numpy as np
from tinychad.lazy import LazyBuffer
from tinychad.ops import BinaryOps, ReduceOps
from tinychad.runtime.cache import CacheStats
x = np.arange(24, dtype=np.float32).reshape(4, 6)
out = LazyBuffer.from_numpy(x, "CPU").e(BinaryOps.MUL, LazyBuffer.from_numpy(x, "CPU")).r(ReduceOps.SUM, (1,)).numpy()
assert np.allclose(out, (x * x).sum(1, keepdims=True)), out
print(f"compiles={CacheStats.compiles} disk_hits={CacheStats.disk_hits}")
"""


def run(cache: Path) -> dict:
  env = dict(os.environ, TINYCHAD_CACHE=str(cache), CACHE="1")
  res = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60)
  assert res.returncode == 0, res.stderr
  return dict(kv.split("=") for kv in res.stdout.split())


def test_second_process_reuses_disk_cache(tmp_path):
  assert run(tmp_path) == {"compiles": "1", "disk_hits": "0"}
  assert run(tmp_path) == {"compiles": "0", "disk_hits": "1"}


def test_truncated_library_is_rebuilt(tmp_path):
  run(tmp_path)
  (lib,) = tmp_path.glob("*.so")
  lib.write_bytes(lib.read_bytes()[:100])
  assert run(tmp_path) == {"compiles": "1", "disk_hits": "0"}
  assert run(tmp_path) == {"compiles": "0", "disk_hits": "1"}


def test_missing_checksum_is_rebuilt(tmp_path):
  run(tmp_path)
  (checksum,) = tmp_path.glob("*.sha256")
  checksum.unlink()
  assert run(tmp_path)["compiles"] == "1"


def test_concurrent_compiles_both_succeed(tmp_path):
  env = dict(os.environ, TINYCHAD_CACHE=str(tmp_path), CACHE="1")
  procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for _ in range(4)]
  for p in procs:
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
  # no temp files left behind, one library and its checksum
  assert sorted(f.suffix for f in tmp_path.iterdir()) == [".sha256", ".so"]
  assert run(tmp_path) == {"compiles": "0", "disk_hits": "1"}


def test_cache_disabled_writes_nothing(tmp_path):
  env = dict(os.environ, TINYCHAD_CACHE=str(tmp_path), CACHE="0")
  res = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60)
  assert res.returncode == 0, res.stderr
  assert "compiles=1" in res.stdout and not list(tmp_path.iterdir())
