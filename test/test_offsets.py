"""Kernel trees that differ only in where their inputs start share one kernel (codegen/offsets.py).

in: slices of one realized buffer at several offsets, computed eagerly, in one realize, and under TinyJit
out: pass when the shifted trees are equal exactly when the offsets agree modulo 64 bytes, the output and a gather's
     table are never shifted, every slice's result matches numpy, and the slices build one kernel between them (with
     NOOPT=1, which builds every tree plainly, one each).
"""
import numpy as np
import pytest
from tinychad import Tensor, TinyJit
from tinychad.codegen import lower_item
from tinychad.codegen.offsets import SHIFT_ALIGN, split_offsets
from tinychad.engine import realize
from tinychad.engine.schedule import create_schedule
from tinychad.nn import functional as F
from tinychad.ops import BufferOps


def _tree(t: Tensor):
  (item,) = create_schedule([t.lazydata])
  return item.ast


def _load_offsets(tree) -> list[int]:
  return sorted(n.arg[1].views[0].offset for n in tree.walk() if n.op is BufferOps.LOAD)


def test_offsets_that_agree_modulo_64_bytes_give_one_tree():
  x = Tensor(np.zeros((8, 24), np.float32)).realize()        # a row is 96 bytes
  row2, row4, row1 = (_tree(x[t] * 2 + 1) for t in (2, 4, 1))
  (tree2, shifts2), (tree4, shifts4), (tree1, shifts1) = (split_offsets(tree) for tree in (row2, row4, row1))
  assert tree2 is tree4 and shifts2 == (0, 48 * 4) and shifts4 == (0, 96 * 4)
  assert _load_offsets(tree2) == [0]
  # row 1 starts 24 elements in: 16 of them (64 bytes) move to the address, 8 stay in the tree
  assert shifts1 == (0, 16 * 4) and _load_offsets(tree1) == [8] and tree1 is not tree2
  assert all(shift % SHIFT_ALIGN == 0 for shift in shifts1 + shifts2 + shifts4)


def test_a_buffer_read_at_several_offsets_moves_by_its_lowest():
  x = Tensor(np.zeros((8, 32), np.float32)).realize()
  tree, shifts = split_offsets(_tree(x[5] * x[3] + x[6]))
  assert shifts == (0, 3 * 32 * 4) and _load_offsets(tree) == [0, 64, 96]


def test_a_plain_read_and_a_gathers_table_stay_where_they_are():
  x = Tensor(np.zeros((8, 32), np.float32)).realize()
  plain = _tree(x * 2)
  assert split_offsets(plain) == (plain, ())
  # the table is a slice 16 rows in, read at rows its indices pick: its buffer is passed as it is
  table = Tensor(np.zeros((64, 16), np.float32)).realize()
  indices = Tensor(np.array([1, 2, 3], np.int64)).realize()
  (gathered,) = [item.ast for item in create_schedule([(F.embedding(indices, table[16:]) * 2).lazydata])
                 if BufferOps.GATHER in {n.op for n in item.ast.walk()}]
  assert split_offsets(gathered) == (gathered, ())


def _count_lowerings(monkeypatch, tmp_path, set_noopt, noopt: str = "0") -> list[str]:
  """The names of the kernels lowered from here on, with NOOPT as given (NOOPT=1 builds each tree plainly)."""
  monkeypatch.setenv("TINYCHAD_CACHE", str(tmp_path))     # no kernel record from an earlier run
  set_noopt(noopt)                                        # and no kernel loaded before
  lowered: list[str] = []
  def counted(item, opts=None):
    lowered.append(item.name)
    return lower_item(item, opts)
  monkeypatch.setattr(realize, "lower_item", counted)
  return lowered


# 40 x 48 (1,920 points: one thread) and 300 x 256 (76,800 points: the thread pool); a step is a multiple of 16 floats
@pytest.mark.parametrize("device", ["CPU", "LLVM"])
@pytest.mark.parametrize("shape", [(9, 40, 48), (9, 300, 256)])
@pytest.mark.parametrize("noopt", ["0", "1"])
def test_eager_slices_at_each_offset_build_one_kernel(monkeypatch, tmp_path, set_noopt, device, shape, noopt):
  lowered = _count_lowerings(monkeypatch, tmp_path, set_noopt, noopt)
  x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
  xt = Tensor(x, device=device).realize()
  for t in range(shape[0]):
    np.testing.assert_allclose((xt[t] * 2 + 1).numpy(), x[t] * 2 + 1, rtol=1e-6)
  assert lowered == [f"E_{shape[1]}_{shape[2]}"] * (shape[0] if noopt == "1" else 1)


@pytest.mark.parametrize("device", ["CPU", "LLVM"])
def test_shifted_kernels_in_one_launch_and_in_a_replay(monkeypatch, tmp_path, set_noopt, device):
  lowered = _count_lowerings(monkeypatch, tmp_path, set_noopt)
  rng = np.random.default_rng(1)
  x = rng.standard_normal((6, 40, 48)).astype(np.float32)
  xt = Tensor(x, device=device).realize()
  for t in range(1, 5):
    # two kernels in one realize: its launch runs both in one native call, then again from the prepared launch
    for _ in range(2):
      a, b = xt[t] * 3, (xt[t + 1] - xt[t - 1]).exp()
      Tensor.realize(a, b)
      np.testing.assert_allclose(a.numpy(), x[t] * 3, rtol=1e-6)
      np.testing.assert_allclose(b.numpy(), np.exp(x[t + 1] - x[t - 1]), rtol=1e-5)

  @TinyJit
  def step(inputs: Tensor) -> Tensor: return (inputs[4] * 2 + inputs[2]).realize()
  for call in range(4):     # records on the second call, replays from the third on new buffers each time
    fresh = rng.standard_normal((6, 40, 48)).astype(np.float32)
    np.testing.assert_allclose(step(Tensor(fresh, device=device)).numpy(), fresh[4] * 2 + fresh[2], rtol=1e-6)
  assert len(lowered) == 3, lowered    # x * 3, the exp of a difference and the replayed step: one kernel each
