"""Facts about the host CPU that both the code generator and the runtimes need.

in: /proc/cpuinfo (read once)  ->  out: the SIMD register width. Kept below codegen and the runtimes so
neither has to import the other for it.
"""
import functools


@functools.lru_cache(maxsize=None)
def simd_bytes() -> int:
  """Bytes in one SIMD register of this host: 64 with AVX-512, 32 with AVX2, else 16."""
  try:
    with open("/proc/cpuinfo") as f: flags = next((ln for ln in f if ln.startswith("flags")), "").split()
  except OSError:
    flags = []
  if "avx512f" in flags: return 64
  return 32 if "avx2" in flags else 16
