"""engine/realize.py: kernels are built before they run, run time and build time are reported apart,
and capture() sees every kernel and copy a block runs."""
import numpy as np
from tinychad import Tensor, GlobalCounters
from tinychad.device import Device
from tinychad.engine.realize import capture


def test_one_kernel_reports_run_time_apart_from_its_build(monkeypatch, tmp_path, capsys):
  monkeypatch.setenv("TINYCHAD_CACHE", str(tmp_path))
  monkeypatch.setenv("DEBUG", "2")
  monkeypatch.setattr(Device["CPU"], "programs", {})
  GlobalCounters.reset()
  out = Tensor([1.0, 2.0], device="CPU").add(1).realize()
  first = capsys.readouterr().out
  (line,) = [ln for ln in first.splitlines() if ln.strip().startswith("kernel")]
  run_us, built_ms = float(line.split(" us")[0].split()[-1]), float(line.split("built in")[1].split()[0])
  # a C compile takes tens of milliseconds; a 2-element kernel runs in microseconds
  assert run_us * 1e-3 < built_ms and GlobalCounters.time_sum_s * 1e3 < built_ms, first
  assert "ms of it loading and building kernels" in first
  np.testing.assert_equal(out.numpy(), [2.0, 3.0])
  Tensor([1.0, 2.0], device="CPU").add(1).realize()
  (again,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("kernel")]
  assert "built in" not in again


def test_capture_sees_kernels_and_copies_and_nests():
  x = Tensor(np.arange(4, dtype=np.float32), device="NUMPY").realize()
  with capture() as outer:
    y = (x.to("CPU") * 2).realize()
    with capture() as inner:
      (y + 1).realize()
  assert [step[0] is None for step in outer] == [True, False, False]
  assert len(inner) == 1 and inner[0] == outer[-1]
  item, bufs = outer[1]
  assert item.output.device == "CPU" and len(bufs) == 1 + len(item.inputs)
  (z := (y + 1)).realize()
  assert len(outer) == 3, "a closed capture records nothing more"
  np.testing.assert_equal(z.numpy(), np.arange(4) * 2 + 1)


def test_a_remembered_schedule_of_several_kernels_runs_them_in_one_native_call(monkeypatch):
  """The second realize of a graph runs its prepared launch: on the CPU one KernelList call for all its kernels, with the
  values and the counters of the first (long) way; where the thread pool can't start, the same list on this thread."""
  from tinychad.engine import schedule_cache
  from tinychad.runtime.threads import KernelList
  a, b = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4)).realize(), Tensor(np.ones(4, np.float32)).realize()
  def step():
    # a sum, then a softmax over its rows: three kernels
    out = ((a + b).sum(1, keepdim=True) * a).softmax(1)
    GlobalCounters.reset()
    return out.realize().numpy(), GlobalCounters.kernel_count
  first, kernels = step()
  assert kernels >= 2
  launches = [t.launch for t in schedule_cache._templates.values() if t.launch is not None and t.launch.kernels is not None]
  assert launches, "the graph's launch runs its kernels as one list"
  again, again_kernels = step()
  np.testing.assert_array_equal(again, first)
  assert again_kernels == kernels
  run, threads_asked = KernelList.run, []
  def pool_fails(self, threads=None):
    threads_asked.append(threads)
    return threads == 1 and run(self, 1)
  monkeypatch.setattr(KernelList, "run", pool_fails)
  fallback, _ = step()
  np.testing.assert_array_equal(fallback, first)
  assert threads_asked == [None, 1]


def test_a_prepared_launch_counts_what_the_first_run_counted_and_times_only_at_debug_2(monkeypatch):
  monkeypatch.delenv("DEBUG", raising=False)
  a, b = Tensor.rand(64, 64).realize(), Tensor.rand(64, 64).realize()
  counts = []
  for _ in range(3):     # the first run schedules, the next ones run the prepared launch
    GlobalCounters.reset()
    ((a @ b).relu() + 1).sum(axis=0).realize()
    counts.append((GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem))
    assert GlobalCounters.time_sum_s == 0.0
  assert counts[0] == counts[1] == counts[2] and counts[0][0] >= 1 and counts[0][1] >= 2 * 64 ** 3, counts
  monkeypatch.setenv("DEBUG", "2")
  GlobalCounters.reset()
  ((a @ b).relu() + 1).sum(axis=0).realize()
  assert GlobalCounters.time_sum_s > 0.0 and (GlobalCounters.kernel_count, GlobalCounters.global_ops) == counts[0][:2]
