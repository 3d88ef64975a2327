"""Device selection and copies between devices."""
from __future__ import annotations
import os
import subprocess
import sys
import numpy as np
import pytest
from tinychad import Tensor, Device
from conftest import ALL_DEVICES


def default_device(**env: str) -> str:
  code = "from tinychad import Device; print(Device.DEFAULT)"
  clean = {k: v for k, v in os.environ.items() if k not in ("DEVICE", "LLVM")}
  out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=60)
  assert out.returncode == 0, out.stderr
  return out.stdout.strip()


def test_default_is_cpu_where_a_compiler_exists():
  """The CPU, unless a CUDA GPU can run (test/test_cuda.py tests that choice with and without a GPU)."""
  assert default_device() == ("CUDA" if Device.available("CUDA") else "CPU" if Device.available("CPU") else
                              "LLVM" if Device.available("LLVM") else "NUMPY")


@pytest.mark.parametrize("env,expected", [({"DEVICE": "NUMPY"}, "NUMPY"), ({"DEVICE": "llvm"}, "LLVM"), ({"LLVM": "1"}, "LLVM"), ({"DEVICE": "CPU"}, "CPU")])
def test_env_selects_device(env, expected):
  assert default_device(**env) == expected


def test_unknown_device_is_a_clear_error():
  with pytest.raises(ValueError, match="unknown device 'TPU'"): Tensor([1.0], device="TPU")


@pytest.mark.parametrize("source", ALL_DEVICES)
@pytest.mark.parametrize("target", ALL_DEVICES)
def test_copies_between_devices(source, target):
  data = np.arange(12, dtype=np.float32).reshape(3, 4)
  x = Tensor(data, device=source)
  moved = (x.T * 2).to(target)
  assert moved.device == target
  out = (moved + Tensor.ones(4, 3, device=target)).numpy()
  np.testing.assert_allclose(out, data.T * 2 + 1)


def test_gradients_flow_across_a_copy():
  devices = ALL_DEVICES[-2:] if len(ALL_DEVICES) > 1 else ALL_DEVICES * 2
  x = Tensor([1.0, 2.0, 3.0], device=devices[0], requires_grad=True)
  y = (x * 3).to(devices[1]).sum()
  y.backward()
  assert x.grad.device == devices[0]
  np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0, 3.0])


def test_a_clang_that_cannot_build_our_c_is_passed_over(tmp_path):
  """A `clang` that fails the runtime's probe (clang 14 on x86 has no _Float16) leaves the default on
  CPU with gcc, instead of quietly moving to LLVM."""
  fake = tmp_path / "clang"
  fake.write_text("#!/bin/sh\nexit 1\n")
  fake.chmod(0o755)
  path = f"{tmp_path}{os.pathsep}{os.environ['PATH']}"
  code = "from tinychad import Device; from tinychad.runtime.cc import find_c_compiler; print(Device.DEFAULT, find_c_compiler())"
  clean = {k: v for k, v in os.environ.items() if k not in ("DEVICE", "LLVM", "CC")}
  out = subprocess.run([sys.executable, "-c", code], env={**clean, "PATH": path}, capture_output=True, text=True, timeout=60)
  assert out.returncode == 0, out.stderr
  assert out.stdout.split() == ["CPU", "gcc"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/maps and vm.max_map_count are Linux's")
def test_a_kernel_library_costs_the_process_few_memory_mappings():
  # Linux caps a process's mappings (vm.max_map_count, 65,530): a test process that had loaded ~9,000 kernel
  # libraries at 5 mappings each came near it, and its last tests failed to load a library or start a thread
  import time
  from tinychad.runtime.cc import compile_c, find_c_compiler
  if find_c_compiler() is None: pytest.skip("no C compiler")
  lib = compile_c(f"float tc_mapping_probe(float x) {{ return x * {time.time_ns() % 1000003}.0f; }}\n", "probe")
  with open("/proc/self/maps") as f: mappings = [line for line in f if lib._name in line]
  assert 1 <= len(mappings) <= 3, mappings


def test_a_buffer_view_shares_its_buffers_memory():
  from tinychad.device import Buffer, BufferView
  from tinychad.dtype import dtypes
  buf = Buffer("CPU", 10, dtypes.float32).copyin(np.arange(10, dtype=np.float32))
  view = BufferView(buf, 4, 3)
  inner = BufferView(view, 1, 2)     # a view of a view is a view of the buffer
  assert inner.view_of is buf and inner.view_offset == 5 * 4 and inner.address == buf.address + 20
  inner.copyin(np.array([-1, -2], dtype=np.float32))
  np.testing.assert_array_equal(buf.as_numpy(), [0, 1, 2, 3, 4, -1, -2, 7, 8, 9])
  np.testing.assert_array_equal(view.as_numpy(), [4, -1, -2])
  with pytest.raises(ValueError, match=r"BufferView of elements \[8, 11\) of a buffer of 10 elements"): BufferView(buf, 8, 3)
  del buf, view
  np.testing.assert_array_equal(inner.as_numpy(), [-1, -2])    # the view keeps the memory alive
