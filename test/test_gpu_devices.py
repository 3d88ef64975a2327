"""Property tests every GPU-style device passes against the NUMPY reference: odd sizes that don't divide a
work-group, 0-size dims, non-contiguous views, every dtype, and moving tensors with their gradients.

The devices: OPENCL (where pyopencl and a platform are installed: PoCL on CI), CUDA (where a GPU, its driver
and NVRTC are) and CUDA-host, the CUDA device with its kernels run on the host (test/cuda_host.py: wherever
g++ and NVRTC are). What is particular to one device (launch geometry, the kernel cache, fake drivers,
errors) is in test_opencl.py and test_cuda.py; the op suite runs on them through conftest's device lists.
"""
from __future__ import annotations
import numpy as np
import pytest
from tinychad import Tensor, dtypes
from tinychad.device import Device
from tinychad.runtime import cuda_driver
from cuda_host import host_unavailable, install

GPU_DEVICES = [
  pytest.param("OPENCL", marks=pytest.mark.skipif(not Device.available("OPENCL"),
                                                  reason="no OpenCL platform (apt-get install pocl-opencl-icd)")),
  pytest.param("CUDA", marks=pytest.mark.skipif(not Device.available("CUDA"),
                                                reason=f"no CUDA GPU: {cuda_driver.unavailable_reason()}")),
  pytest.param("CUDA-host", marks=pytest.mark.skipif(host_unavailable() is not None, reason=str(host_unavailable()))),
]
rng = np.random.default_rng(0)


@pytest.fixture(params=GPU_DEVICES)
def device(request, monkeypatch) -> str:
  if request.param != "CUDA-host": return request.param
  install(monkeypatch)      # CUDA's kernels run on the host (test/cuda_host.py)
  return "CUDA"


def on_both(device: str, fn, *arrays: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """fn over the arrays as Tensors on `device` and on NUMPY."""
  return tuple(fn(*[Tensor(a, device=d) for a in arrays]).numpy() for d in (device, "NUMPY"))


def assert_both(device: str, fn, *arrays: np.ndarray, atol: float = 1e-5) -> None:
  got, want = on_both(device, fn, *arrays)
  assert got.shape == want.shape and got.dtype == want.dtype
  np.testing.assert_allclose(got, want, atol=atol, rtol=1e-5)


@pytest.mark.parametrize("shape", [(1,), (7,), (129,), (3, 5), (13, 1, 17), (2, 3, 5, 7, 11), (0, 4), (4, 0, 3),
                                   (1 << 20,)])
def test_elementwise_shapes(device, shape):
  a, b = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
  assert_both(device, lambda x, y: (x * y + x.exp()).relu() - y.abs().sqrt(), a, b)


@pytest.mark.parametrize("shape, axis", [((7, 13), 1), ((7, 13), 0), ((3, 129, 5), 1), ((1000,), 0), ((0, 5), 1),
                                         ((5, 0), 1), ((2, 3, 4), (0, 2)), ((3, 1000), 1), ((257, 3), 0),
                                         ((4, 4096), 1), ((2, 300, 3), 1)])
def test_reductions(device, shape, axis):
  a = rng.standard_normal(shape).astype(np.float32)
  assert_both(device, lambda x: x.sum(axis), a, atol=1e-4)
  if 0 not in shape:
    assert_both(device, lambda x: x.max(axis), a)
    assert_both(device, lambda x: x.softmax(-1), a)


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (3, 5, 7), (17, 33, 65), (64, 64, 64), (130, 7, 129), (2, 0, 3),
                                     (256, 512, 128)])
def test_matmul_odd_sizes(device, m, k, n):
  a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
  assert_both(device, lambda x, y: x @ y, a, b, atol=1e-3)


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.bool, dtypes.float16, dtypes.float64])
def test_dtypes(device, dtype):
  a = (rng.standard_normal((5, 9)) * 20).astype(dtype.np)
  b = (rng.standard_normal((5, 9)) * 20).astype(dtype.np)
  for fn in (lambda x, y: x + y, lambda x, y: x < y, lambda x, y: x.max(1), lambda x, y: x.cast(dtypes.float32) * 3):
    got, want = on_both(device, fn, a, b)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_non_contiguous_views(device):
  a = rng.standard_normal((6, 9, 11)).astype(np.float32)
  assert_both(device, lambda x: x.permute(2, 0, 1)[::2, 1:, ::-3] * 2, a)
  assert_both(device, lambda x: x[:, :1, :].expand(6, 9, 11) + x.transpose(0, 1).transpose(0, 1), a)
  assert_both(device, lambda x: x.pad(((1, 2), (0, 0), (3, 1))).sum(2), a)
  assert_both(device, lambda x: x.reshape(6, 99)[:, 5:50:3].contiguous().T @ x.reshape(6, 99)[:, :15], a, atol=1e-4)


@pytest.mark.parametrize("alias", [str.upper, str.lower])
def test_moving_keeps_gradients(device, alias):
  x = Tensor(rng.standard_normal((4, 5)).astype(np.float32), device="NUMPY", requires_grad=True)
  y = x.to(alias(device))
  assert y.device == device
  (y.relu() * y).sum().backward()
  assert x.grad.device == "NUMPY"
  np.testing.assert_allclose(x.grad.numpy(), np.where(x.numpy() > 0, 2 * x.numpy(), 0), rtol=1e-6)
  np.testing.assert_array_equal(y.to("NUMPY").numpy(), x.numpy())


def test_tinygrads_name_for_opencl():
  if not Device.available("OPENCL"): pytest.skip("no OpenCL platform (apt-get install pocl-opencl-icd)")
  assert Tensor([1.0]).to("CL").device == "OPENCL"
