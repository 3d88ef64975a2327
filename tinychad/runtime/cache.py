"""The compiled-kernel cache: compile each kernel source once per machine, not once per process.

in: the key of a binary (a hash of its source, compiler and flags: cache_key) and a function that
    compiles the source to the binary's bytes (a shared library, an object file)
out: the binary's bytes, from disk or freshly compiled; what a device loads from them is kept in
     memory by the same key (memoize), once per process.
Disk layout: `<dir>/<key>.so` (or `.o`) plus `<key>.sha256`, the checksum of the file's bytes. `dir` is
`$TINYCHAD_CACHE`, else `~/.cache/tinychad`; `CACHE=0` turns the disk cache off.
Kernel records (`<key>.kernel.json`) skip lowering and rendering in a new process: keyed by the kernel
tree's text, its name, the device's compiler settings and a hash of tinychad's own source (so an edited
code generator never reuses an old record), a record names the library or object to load and the
facts the device needs to call it (buffer count, parallel extent).
Files are written with helpers.atomic_write (a temporary name in the same directory, fsynced, moved into
place with os.replace), so a concurrent reader sees either no file or a whole one. A .so whose bytes don't
match its checksum (a crash mid-write of an old version, a truncated copy) is rebuilt, not loaded.
This module knows nothing of compilers or kernels' code: devices bring the compile and load steps.
"""
from __future__ import annotations
import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable
from tinychad.helpers import atomic_write, getenv
from tinychad.ops import KernelNode


class CacheStats:
  """What the cache did in this process, for tests and DEBUG output."""
  compiles: int = 0
  memory_hits: int = 0
  disk_hits: int = 0
  record_hits: int = 0     # kernels loaded from a record, without lowering or rendering

  @staticmethod
  def reset() -> None: CacheStats.compiles = CacheStats.memory_hits = CacheStats.disk_hits = CacheStats.record_hits = 0


_memory: dict[str, Any] = {}


def cache_dir() -> Path | None:
  """The disk cache directory (created on demand), or None when CACHE=0."""
  if not getenv("CACHE", 1): return None
  path = Path(os.getenv("TINYCHAD_CACHE") or Path.home() / ".cache" / "tinychad")
  path.mkdir(parents=True, exist_ok=True)
  return path


def cache_key(*parts: str) -> str:
  """Hash of everything that decides the compiled bytes (source, compiler, flags)."""
  h = hashlib.sha256()
  for p in parts: h.update(p.encode() + b"\0")
  return h.hexdigest()


def memoize(key: str, build: Callable[[], Any]) -> Any:
  """In-memory only: the value built for `key`, building it the first time (a None isn't kept)."""
  if key in _memory:
    CacheStats.memory_hits += 1
    return _memory[key]
  value = build()
  if value is not None: _memory[key] = value
  return value


def _write_verified(path: Path, sum_path: Path, data: bytes) -> None:
  # the file first, its checksum second: a reader that sees the new checksum sees the new file
  atomic_write(path, data)
  atomic_write(sum_path, hashlib.sha256(data).hexdigest().encode())


def _read_verified(path: Path, sum_path: Path) -> bytes | None:
  """The bytes at path if they match the checksum beside them, else None."""
  try:
    data, expected = path.read_bytes(), sum_path.read_text().strip()
  except OSError:
    return None
  return data if hashlib.sha256(data).hexdigest() == expected else None


def stored_bytes(key: str, suffix: str) -> bytes | None:
  """`<key><suffix>` from disk if it is there and matches its checksum; never builds."""
  directory = cache_dir()
  data = _read_verified(directory / f"{key}{suffix}", directory / f"{key}.sha256") if directory is not None else None
  if data is not None: CacheStats.disk_hits += 1
  return data


def cached_bytes(key: str, suffix: str, build: Callable[[], bytes]) -> bytes:
  """Compiled bytes for `key` from disk (`<key><suffix>`), else `build()`, then stored on disk.
  No memory layer: the caller keeps what it loads from the bytes."""
  data = stored_bytes(key, suffix)
  if data is not None: return data
  data = build()
  CacheStats.compiles += 1
  directory = cache_dir()
  if directory is not None: _write_verified(directory / f"{key}{suffix}", directory / f"{key}.sha256", data)
  return data


# ---- kernel records: kernel tree -> what to load, without lowering ----

@functools.lru_cache(maxsize=None)
def code_version() -> str:
  """Hash of every tinychad source file, read once per process: a record written by other code is ignored."""
  root = Path(__file__).resolve().parent.parent
  h = hashlib.sha256()
  for path in sorted(root.rglob("*.py")):
    h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
  return h.hexdigest()


@functools.lru_cache(maxsize=1 << 12)
def tree_text(root: KernelNode) -> str:
  """A kernel tree as text that is the same in every process: one line per distinct node, sources
  first (op, dtype, arg, then the line numbers of its sources), so a shared subtree is written once."""
  line_of: dict[KernelNode, int] = {}
  lines = []
  for node in root.walk():
    line_of[node] = len(lines)
    lines.append(f"{node.op.name}:{node.dtype!r}:{node.arg!r}{[line_of[s] for s in node.srcs]}")
  return "\n".join(lines)


def read_record(key: str) -> dict | None:
  """The kernel record stored under `key`, or None (no disk cache, no record, or unreadable)."""
  directory = cache_dir()
  if directory is None: return None
  try:
    record = json.loads((directory / f"{key}.kernel.json").read_text())
  except (OSError, ValueError):
    return None
  CacheStats.record_hits += 1
  return record


def write_record(key: str, record: dict) -> None:
  directory = cache_dir()
  if directory is not None: atomic_write(directory / f"{key}.kernel.json", json.dumps(record).encode())
