"""Running one compiled kernel on several cores.

in: a native function taking (buffer pointers..., start, end), the extent of its parallel loop and
    the kernel's total work (points of its iteration space)
out: the function called once per chunk of [0, extent), the chunks on persistent worker threads
     and the calling thread. Each index is computed by exactly one call, so the results don't
     depend on the thread count or on which thread ran what.
The workers live in a small C library (POOL_SOURCE, compiled once like a kernel): one ctypes call
hands the kernel's address and arguments over, the workers call the kernel directly, and the caller
spins until they are done. Waking a Python thread per chunk instead (ThreadPoolExecutor, the
fallback when no C compiler exists or a kernel has more than POOL_MAX_ARGS buffers) costs ~80 us per
kernel and starts the second half of a matmul that much late. The native pool cuts the loop into
CHUNKS_PER_THREAD pieces per thread: each thread runs its own contiguous block of pieces, then takes
pieces left in the others', so a core shared with another process does less instead of holding
up the whole kernel. Workers spin for SPIN_NS after a kernel, so the next kernel of a
step starts at once, then sleep on a condition variable.
Kernels with less than MIN_PARALLEL_WORK points run on the calling thread: even a spinning worker
costs a cache-line round trip, more than a tiny kernel takes. `THREADS` sets the thread count
(default: all cores). A KernelList (TinyJit's replay) runs many kernels in one call (tc_run_list), each
on the calling thread or the pool by the same rule.
"""
from __future__ import annotations
import ctypes
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Callable
from tinychad.host import MAX_THREADS, thread_count
from tinychad.runtime.cc import helper_library

MIN_PARALLEL_WORK = 1 << 16
POOL_MAX_ARGS = 32          # buffers a kernel may take and still run on the native pool
SPIN_NS = 300_000           # a training step's Python work between two kernels is ~30-100 us
WORKER_STACK_BYTES = 8 << 20  # glibc's default with the usual 8 MiB ulimit; kernels stage panels on the stack
CHUNKS_PER_THREAD = 4       # pieces of the parallel loop per thread: enough to rebalance, few enough to stay coarse


def _call_cases() -> str:
  """One `case n:` per buffer count: the kernel called with exactly its own signature."""
  cases = []
  for n in range(1, POOL_MAX_ARGS + 1):
    params = ", ".join(["void*"] * n + ["long long", "long long"])
    args = ", ".join([f"a[{i}]" for i in range(n)] + ["s", "e"])
    cases.append(f"    case {n}: ((void (*)({params}))fn)({args}); break;")
  return "\n".join(cases)


POOL_SOURCE = """#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define relax() _mm_pause()
#else
#define relax() ((void)0)
#endif

static void call(void* fn, void** a, int n, long long s, long long e) {
  switch (n) {
%CASES%
  }
}

// the job of one generation; written by the caller before it bumps `generation`
static void* job_fn;
static void** job_args;
static int job_nargs, job_parts, job_chunks;
static long long job_extent;
static atomic_int generation, done;
static atomic_int taken[%MAX_THREADS%];   // pieces claimed so far in each thread's block
static int workers, fork_handler_set;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t one_job = PTHREAD_MUTEX_INITIALIZER;   // callers from several Python threads take turns

static long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}

// [0, extent) is cut into `job_chunks` nearly equal pieces (as chunks() in Python), and the pieces
// into one contiguous block per thread. Thread `me` runs its own block in order (the locality of a
// static split), then helps with what is left of the others': a core busy with another process
// holds up only the pieces it has started, not half the kernel.
static void run_piece(int i) {
  long long base = job_extent / job_chunks, extra = job_extent % job_chunks;
  long long start = i * base + (i < extra ? i : extra);
  call(job_fn, job_args, job_nargs, start, start + base + (i < extra));
}

static void run_chunks(int me) {
  for (int k = 0; k < job_parts; k++) {
    int block = (me + k) % job_parts;
    int lo = block * job_chunks / job_parts, hi = (block + 1) * job_chunks / job_parts;
    for (int i; (i = lo + atomic_fetch_add(&taken[block], 1)) < hi;) run_piece(i);
  }
}

static int born_at[%MAX_THREADS%];   // the generation before a worker's first job (it may start after the bump)

static void* worker(void* arg) {
  int id = (int)(long)arg, seen = born_at[id];
  for (;;) {
    long long spin_until = now_ns() + %SPIN_NS%;
    while (atomic_load_explicit(&generation, memory_order_acquire) == seen) {
      relax();
      if (now_ns() < spin_until) continue;
      pthread_mutex_lock(&lock);
      while (atomic_load(&generation) == seen) pthread_cond_wait(&wake, &lock);
      pthread_mutex_unlock(&lock);
    }
    seen = atomic_load(&generation);
    if (id < job_parts) run_chunks(id);
    atomic_fetch_add_explicit(&done, 1, memory_order_release);
  }
  return 0;
}

// a forked child has none of the parent's workers
static void forget_workers(void) {
  workers = 0;
  pthread_mutex_init(&lock, 0);
  pthread_cond_init(&wake, 0);
  pthread_mutex_init(&one_job, 0);
}

static int start_workers(int parts) {
  if (!fork_handler_set) fork_handler_set = pthread_atfork(0, 0, forget_workers) == 0;
  while (workers < parts - 1) {
    pthread_t t;
    pthread_attr_t attr;
    born_at[workers + 1] = atomic_load(&generation);
    // a kernel keeps its staged panel on the stack (codegen/opt.py STAGE_MAX_BYTES): whatever the
    // ulimit, a worker has as much stack as a main thread has by default
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, %STACK_BYTES%);
    int failed = pthread_create(&t, &attr, worker, (void*)(long)(workers + 1));
    pthread_attr_destroy(&attr);
    if (failed) return -1;
    pthread_detach(t);
    workers++;
  }
  return 0;
}

// one job on `parts` threads (workers started, one_job held); returns when all are done
static void run_job(void* fn, void** args, int nargs, long long extent, int parts, int chunks) {
  job_fn = fn; job_args = args; job_nargs = nargs; job_extent = extent; job_parts = parts; job_chunks = chunks;
  atomic_store(&done, 0);
  for (int i = 0; i < parts; i++) atomic_store(&taken[i], 0);
  pthread_mutex_lock(&lock);
  atomic_fetch_add_explicit(&generation, 1, memory_order_release);
  pthread_cond_broadcast(&wake);
  pthread_mutex_unlock(&lock);
  run_chunks(0);
  // every worker checks in, idle ones too, so none can still be reading this job when the next is set
  while (atomic_load_explicit(&done, memory_order_acquire) < workers) relax();
}

// fn(args..., start, end) over [0, extent) in `chunks` pieces on `parts` threads (this one included);
// returns when all are done
int tc_run(void* fn, void** args, int nargs, long long extent, int parts, int chunks) {
  pthread_mutex_lock(&one_job);
  int failed = start_workers(parts);
  if (!failed) run_job(fn, args, nargs, extent, parts, chunks);
  pthread_mutex_unlock(&one_job);
  return failed ? -1 : 0;
}

// n kernels in order (a TinyJit replay): kernel i is fns[i] on args[offsets[i]], ..., args[offsets[i + 1] - 1]
// over [0, extents[i]); a `wide` one on min(threads, extent) threads as tc_run does, the others on this thread
int tc_run_list(int n, void** fns, void** args, int* offsets, long long* extents, unsigned char* wide, int threads,
                int chunks_per_thread) {
  pthread_mutex_lock(&one_job);
  if (start_workers(threads)) { pthread_mutex_unlock(&one_job); return -1; }
  for (int i = 0; i < n; i++) {
    long long extent = extents[i];
    int nargs = offsets[i + 1] - offsets[i], parts = wide[i] ? (extent < threads ? (int)extent : threads) : 1;
    if (parts <= 1) call(fns[i], args + offsets[i], nargs, 0, extent > 1 ? extent : 1);
    else run_job(fns[i], args + offsets[i], nargs, extent, parts,
                 extent < (long long)parts * chunks_per_thread ? (int)extent : parts * chunks_per_thread);
  }
  pthread_mutex_unlock(&one_job);
  return 0;
}
"""
for _name, _value in (("%CASES%", _call_cases()), ("%SPIN_NS%", str(SPIN_NS)), ("%MAX_THREADS%", str(MAX_THREADS)),
                      ("%STACK_BYTES%", str(WORKER_STACK_BYTES))):
  POOL_SOURCE = POOL_SOURCE.replace(_name, _value)


@functools.lru_cache(maxsize=None)
def _native_pool() -> Callable | None:
  """tc_run from POOL_SOURCE, or None when there is no working C compiler."""
  if (library := helper_library(POOL_SOURCE, "thread pool")) is None: return None
  run = library.tc_run
  run.restype = ctypes.c_int
  run.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int64, ctypes.c_int, ctypes.c_int]
  return run


@functools.lru_cache(maxsize=None)
def _native_list() -> Callable | None:
  """tc_run_list from POOL_SOURCE, or None when there is no working C compiler."""
  if (library := helper_library(POOL_SOURCE, "thread pool")) is None: return None
  run = library.tc_run_list
  run.restype = ctypes.c_int
  run.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                  ctypes.c_int, ctypes.c_int]
  return run


@functools.lru_cache(maxsize=4096)
def _array_type(ctype: type, length: int) -> type:
  return ctype * length


def c_array(ctype: type, values: list) -> ctypes.Array:
  """A ctypes array of `values`. Its type is kept here: ctypes keeps an array type only while an array of it lives,
  and a type is a reference cycle, so each one freed with its last array (a launch's KernelList replaced, a parallel
  kernel's arguments) was garbage for the cycle collector."""
  return _array_type(ctype, len(values))(*values)


class KernelList:
  """Kernels run in order by one native call (tc_run_list): a TinyJit replay's launches cost ~0.1 us each
  instead of the ~4 us of a Python call per kernel (argument list, thread decision, ctypes). Each kernel is
  (its machine code address, its arguments (buffer addresses), its parallel loop's extent, its points of work),
  put in C arrays once; `args[slot] = address` changes one argument in place (a buffer new on every replay).
  The thread count is read at each run, and a kernel is spread over threads as run_parallel would."""
  def __init__(self, kernels: list[tuple[int, list[int], int, int]]):
    flat = [a for _, args, _, _ in kernels for a in args]
    self.count = len(kernels)
    self.fns = c_array(ctypes.c_void_p, [address for address, _, _, _ in kernels])
    self.args = c_array(ctypes.c_void_p, flat or [0])
    ends = [0]
    for _, args, _, _ in kernels: ends.append(ends[-1] + len(args))
    self.offsets = c_array(ctypes.c_int, ends)
    self.starts = ends[:-1]     # kernel i's first argument slot
    self.extents = c_array(ctypes.c_int64, [extent for _, _, extent, _ in kernels])
    self.wide = c_array(ctypes.c_ubyte, [work >= MIN_PARALLEL_WORK for _, _, _, work in kernels])

  @staticmethod
  def available(buffers: int) -> bool:
    """Whether a kernel of this many buffers can be in a KernelList (a C compiler built the pool)."""
    return buffers <= POOL_MAX_ARGS and _native_list() is not None

  def run(self, threads: int | None = None) -> bool:
    """Run them all, on `threads` threads (THREADS's count by default); False (nothing run) when the pool could not
    start its threads, which never happens with one."""
    return _native_list()(self.count, self.fns, self.args, self.offsets, self.extents, self.wide,
                          thread_count() if threads is None else threads, CHUNKS_PER_THREAD) == 0


_pool: ThreadPoolExecutor | None = None


def _executor(workers: int) -> ThreadPoolExecutor:
  global _pool
  if _pool is None or _pool._max_workers < workers:
    _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tinychad")
  return _pool


def chunks(extent: int, parts: int) -> list[tuple[int, int]]:
  """[0, extent) cut into `parts` nearly equal ranges, the larger ones first."""
  base, extra = divmod(extent, parts)
  out, start = [], 0
  for i in range(parts):
    end = start + base + (1 if i < extra else 0)
    out.append((start, end))
    start = end
  return out


def run_parallel(fn: Callable[..., None], args: list, extent: int, work: int, address: int | None = None) -> None:
  """fn(*args, start, end) over [0, extent), split across threads when the kernel is big enough.
  `address` is fn's machine code address, when the caller knows it (asking ctypes costs ~1.5 us)."""
  parts = min(thread_count(), extent) if work >= MIN_PARALLEL_WORK else 1
  if parts <= 1:
    fn(*args, 0, max(extent, 1))
    return
  native = _native_pool() if len(args) <= POOL_MAX_ARGS else None
  if native is not None:
    if address is None: address = ctypes.cast(fn, ctypes.c_void_p).value
    pieces = min(extent, parts * CHUNKS_PER_THREAD)
    if native(address, c_array(ctypes.c_void_p, args), len(args), extent, parts, pieces) == 0: return
  ranges = chunks(extent, parts)
  futures = [_executor(parts - 1).submit(fn, *args, lo, hi) for lo, hi in ranges[1:]]
  fn(*args, *ranges[0])
  for f in futures: f.result()
