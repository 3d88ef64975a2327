"""Kernels that only move data run as the generic strided copy (codegen/copy.py, runtime/copy.py): which kernels
qualify, results equal to PyTorch's bit for bit, a new shape compiles nothing, and the copy inside a remembered
launch and a TinyJit replay.

in: small seeded tensors  ->  out: pass/fail on the CPU devices that run kernels natively (CPU, LLVM).
"""
import numpy as np
import pytest
import torch
from tinychad import Device, Tensor, TinyJit, dtypes
from tinychad.codegen.copy import MAX_BYTES, copy_plan

NATIVE = [name for name in ("CPU", "LLVM") if Device.available(name)]


@pytest.fixture(params=NATIVE)
def device(request, set_noopt):
  set_noopt("0")      # NOOPT=1 compiles every copy: these tests are about the generic one, whatever the environment
  return request.param


def _kernels(t: Tensor) -> list:
  return [item for item in t.schedule() if item.is_kernel]


def _inputs(shapes, dtype=np.float32, seed=0):
  rng = np.random.default_rng(seed)
  if dtype == np.bool_: return [rng.random(s) < 0.5 for s in shapes]
  if np.issubdtype(dtype, np.integer): return [rng.integers(-100, 100, s).astype(dtype) for s in shapes]
  return [rng.standard_normal(s).astype(dtype) for s in shapes]


# name -> (input shapes, the same call on torch and tinychad tensors)
COPIES = {
  "cat_last": (((2, 3, 4), (2, 3, 5)), lambda a, b: torch.cat([a, b], 2) if isinstance(a, torch.Tensor) else a.cat(b, dim=2)),
  "cat_middle": (((2, 3, 4), (2, 1, 4)), lambda a, b: torch.cat([a, b], 1) if isinstance(a, torch.Tensor) else a.cat(b, dim=1)),
  "cat_three": (((3, 4), (1, 4), (2, 4)),
                lambda a, b, c: torch.cat([a, b, c], 0) if isinstance(a, torch.Tensor) else a.cat(b, c, dim=0)),
  "cat_sliced_source": (((2, 4, 3, 8), (2, 4, 3, 8)),
                        lambda a, b: torch.cat([a, b[:, :, 1:2]], 2) if isinstance(a, torch.Tensor) else a.cat(b[:, :, 1:2], dim=2)),
  "pad": (((3, 4, 5),), lambda a: torch.nn.functional.pad(a, (0, 0, 1, 2)) if isinstance(a, torch.Tensor)
          else a.pad(((0, 0), (1, 2), (0, 0))).contiguous()),
  "pad_all_sides": (((3, 4, 5),), lambda a: torch.nn.functional.pad(a, (2, 0, 0, 1, 1, 2)) if isinstance(a, torch.Tensor)
                    else a.pad(((1, 2), (0, 1), (2, 0))).contiguous()),
  "big_pad": (((4, 250, 64),), lambda a: torch.nn.functional.pad(a, (0, 0, 3, 3)) if isinstance(a, torch.Tensor)
              else a.pad(((0, 0), (3, 3), (0, 0))).contiguous()),
  "cat_then_pad": (((2, 3, 4), (2, 2, 4)),
                   lambda a, b: torch.nn.functional.pad(torch.cat([a, b], 1), (0, 0, 1, 1)) if isinstance(a, torch.Tensor)
                   else a.cat(b, dim=1).pad(((0, 0), (1, 1), (0, 0))).contiguous()),
  "sum_of_pads": (((2, 3, 4), (2, 2, 4)),     # two boxes with a gap between them: zeroed first
                  lambda a, b: torch.nn.functional.pad(a, (0, 0, 0, 3)) + torch.nn.functional.pad(b, (0, 0, 4, 0))
                  if isinstance(a, torch.Tensor) else a.pad(((0, 0), (0, 3), (0, 0))) + b.pad(((0, 0), (4, 0), (0, 0)))),
  "slice_rows": (((6, 8),), lambda a: a[1:5].contiguous()),
  "permute_outer": (((3, 4, 5, 6),), lambda a: a.permute(1, 0, 2, 3).contiguous()),
  "flip_rows": (((5, 7),), lambda a: a.flip(0).contiguous()),
  "expand": (((1, 4, 5),), lambda a: a.expand(3, 4, 5).contiguous()),
  "big_cat": (((4, 200, 64), (4, 1, 64)), lambda a, b: torch.cat([a, b], 1) if isinstance(a, torch.Tensor) else a.cat(b, dim=1)),
}


@pytest.mark.parametrize("name", COPIES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int8, np.int64, np.bool_])
def test_copies_equal_torch(device, name, dtype):
  shapes, fn = COPIES[name]
  arrays = _inputs(shapes, dtype)
  out = fn(*[Tensor(a, device=device) for a in arrays])
  kernels = _kernels(out)
  assert kernels and all(copy_plan(item.ast) is not None for item in kernels), "expected only generic copies"
  expected = fn(*[torch.from_numpy(a) for a in arrays]).numpy()
  got = out.numpy()
  assert got.dtype == expected.dtype and got.shape == expected.shape
  assert got.tobytes() == expected.tobytes()


def test_negative_zero_survives_a_cat(device):
  a, b = np.array([[-0.0, 1.0]], np.float32), np.array([[-0.0, -2.0]], np.float32)
  got = Tensor(a, device=device).cat(Tensor(b, device=device), dim=0).numpy()
  assert got.tobytes() == torch.cat([torch.from_numpy(a), torch.from_numpy(b)]).numpy().tobytes()


@pytest.mark.parametrize("make", [
  lambda x: x.transpose(0, 1).contiguous(),                 # a transpose keeps its compiled SIMD block
  lambda x: (x + 1).contiguous(),                           # computes
  lambda x: x.cast(dtypes.float16).contiguous(),            # converts
])
def test_kernels_that_do_more_than_move_rows_are_compiled(make):
  x = Tensor(np.ones((64, 64), np.float32)).realize()
  assert all(copy_plan(item.ast) is None for item in _kernels(make(x)))


def test_big_copies_are_compiled():
  rows = MAX_BYTES // 4 // 64
  a, b = Tensor(np.ones((rows, 64), np.float32)).realize(), Tensor(np.ones((1, 64), np.float32)).realize()
  assert all(copy_plan(item.ast) is None for item in _kernels(a.cat(b, dim=0)))


def test_a_growing_cache_compiles_nothing(device, monkeypatch):
  cache = Tensor(np.zeros((1, 2, 1, 8), np.float32), device=device).realize()
  rows = [np.full((1, 2, 1, 8), i, np.float32) for i in range(1, 6)]

  def no_compiles(*args, **kwargs): raise AssertionError("a copy kernel was compiled")
  monkeypatch.setattr(type(Device[device]), "library", no_compiles)
  for row in rows: cache = cache.cat(Tensor(row, device=device), dim=2).realize()
  expected = np.concatenate([np.zeros((1, 2, 1, 8), np.float32)] + rows, axis=2)
  assert np.array_equal(cache.numpy(), expected)


def test_noopt_compiles_copies(device, set_noopt):
  set_noopt("1")
  a = Tensor(np.ones((3, 5), np.float32), device=device)
  out = a.cat(a * 2, dim=0).realize()
  assert np.array_equal(out.numpy(), np.concatenate([np.ones((3, 5)), 2 * np.ones((3, 5))]))
  assert all(not getattr(kernel, "constants", ()) for kernel in Device[device].programs.values())


def test_generic_copies_in_a_launch_and_a_replay(device):
  """Several kernels (a generic copy among them) in one native call: the remembered launch of a graph seen before,
  and TinyJit's replay, write the buffers around the copy's constant argument."""
  rng = np.random.default_rng(1)
  w = rng.standard_normal((16, 8)).astype(np.float32)
  tw = Tensor(w, device=device).realize()

  def step(cache: Tensor, row: Tensor) -> tuple[Tensor, Tensor]:
    grown = cache.cat(row, dim=0)
    out = (grown @ tw).relu().sum(axis=0)
    return grown, out.realize(grown)

  def expected(cache: np.ndarray, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    grown = np.concatenate([cache, row])
    return grown, np.maximum(grown @ w, 0).sum(axis=0)

  cache, row = rng.standard_normal((5, 16)).astype(np.float32), rng.standard_normal((1, 16)).astype(np.float32)
  grown, _ = step(Tensor(cache, device=device), Tensor(row, device=device))
  kernels = _kernels(Tensor(cache, device=device).cat(Tensor(row, device=device), dim=0))
  assert [copy_plan(item.ast) is not None for item in kernels] == [True]
  jitted = TinyJit(step)
  for i in range(4):
    want_grown, want_out = expected(cache + i, row - i)
    for fn in (step, jitted):
      got_grown, got_out = fn(Tensor(cache + i, device=device), Tensor(row - i, device=device))
      assert np.array_equal(got_grown.numpy(), want_grown)
      np.testing.assert_allclose(got_out.numpy(), want_out, rtol=1e-5, atol=1e-5)
