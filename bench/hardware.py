"""The machine's own limits, measured in the same run as the workloads: memory bandwidth and FMA peak.

in: a thread count  ->  out: Limits (GB/s of a STREAM-style triad and of a read-only sum, GFLOP/s of
    back-to-back fused multiply-adds), from a small C program built with the system compiler and
    OpenMP. The table divides tinychad's numbers by these (bench/common.py), so "80% of the memory
    bandwidth" is checked against what this VM gives today, not against a number from another day:
    a shared VM's bandwidth moves by 2x between runs.
`python bench/hardware.py` prints the limits for 1 and 2 threads.
"""
from __future__ import annotations
import functools
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

# 16M floats per array (64 MiB): far beyond the last-level cache, like the elementwise workloads
PROGRAM = r"""
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#define N (16 * 1024 * 1024)
#define REPEATS 7
typedef float v16 __attribute__((vector_size(64)));

static double now(void) { return omp_get_wtime(); }

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *t) { qsort(t, REPEATS, sizeof(double), by_value); return t[REPEATS / 2]; }

int main(void) {
  float *a = aligned_alloc(64, N * 4), *b = aligned_alloc(64, N * 4), *c = aligned_alloc(64, N * 4);
  /* first touch from the threads that will use the pages */
  #pragma omp parallel for
  for (long i = 0; i < N; i++) { a[i] = 0; b[i] = 1; c[i] = 2; }
  double triad[REPEATS], sum[REPEATS], peak[REPEATS];
  volatile float sink = 0;
  for (int r = 0; r < REPEATS; r++) {
    double t0 = now();
    #pragma omp parallel for
    for (long i = 0; i < N; i++) a[i] = b[i] + 3.0f * c[i];
    triad[r] = 12.0 * N / (now() - t0) / 1e9;
    t0 = now();
    float total = 0;
    /* 8 vector partial sums: a scalar float sum is one dependency chain, bound by add latency */
    #pragma omp parallel reduction(+:total)
    {
      v16 part[8] = {0};
      #pragma omp for
      for (long i = 0; i < N; i += 128)
        for (int j = 0; j < 8; j++) part[j] += *(const v16 *)(a + i + 16 * j);
      for (int j = 0; j < 8; j++) for (int l = 0; l < 16; l++) total += part[j][l];
    }
    sum[r] = 4.0 * N / (now() - t0) / 1e9;
    sink += total;
    /* 12 independent vector FMA chains per thread hide the FMA latency */
    long iters = 4000000;
    t0 = now();
    #pragma omp parallel
    {
      v16 acc[12], m = (v16){} + 0.999999f, k = (v16){} + 1e-7f;
      for (int j = 0; j < 12; j++) acc[j] = (v16){} + (float)j;
      for (long i = 0; i < iters; i++)
        for (int j = 0; j < 12; j++) acc[j] = acc[j] * m + k;
      float s = 0;
      for (int j = 0; j < 12; j++) s += acc[j][0];
      sink += s;
    }
    peak[r] = 2.0 * 16 * 12 * iters * omp_get_max_threads() / (now() - t0) / 1e9;
  }
  printf("{\"triad_gbs\": %f, \"sum_gbs\": %f, \"fma_gflops\": %f}\n", median(triad), median(sum), median(peak));
  return sink == 12345.0f;
}
"""


@dataclass
class Limits:
  triad_gbs: float     # a[i] = b[i] + s*c[i]: 12 bytes per element, what a streaming elementwise kernel can reach
  sum_gbs: float       # read-only reduction bandwidth
  fma_gflops: float    # fp32 FMA peak of the SIMD units


@functools.lru_cache(maxsize=None)
def _binary() -> Path | None:
  """The compiled probe, or None without a C compiler that knows OpenMP."""
  cc = next((name for name in ("gcc", "clang", "cc") if shutil.which(name)), None)
  if cc is None: return None
  out = Path(tempfile.mkdtemp(prefix="tinychad-hardware-")) / "limits"
  flags = ["-O3", "-march=native", "-ffp-contract=fast", "-fopenmp"]
  result = subprocess.run([cc, *flags, "-x", "c", "-", "-o", str(out)], input=PROGRAM.encode(), capture_output=True)
  return out if result.returncode == 0 else None


def measure_limits(threads: int) -> Limits | None:
  """This machine's limits on `threads` threads, or None when the probe can't be built."""
  binary = _binary()
  if binary is None: return None
  env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_PROC_BIND="false")
  result = subprocess.run([str(binary)], env=env, capture_output=True, text=True, timeout=120)
  return Limits(**json.loads(result.stdout)) if result.stdout.strip() else None


if __name__ == "__main__":
  for threads in (1, 2):
    limits = measure_limits(threads)
    print(f"{threads}t: {limits}")
