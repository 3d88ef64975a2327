"""Layout packing decided over kernel trees (codegen/pack.py).

in: the unpacked kernel trees of matmuls (scheduled with NOOPT=1, which packs nothing)
out: pass when pack_plan picks exactly the operands the rules name (a strided B too big to stage, a
     transposed weight read by enough rows, A read down its columns over enough reduce steps) with their
     lane axis and panel width, the packed y.T @ x equals numpy's, and split_lanes hands each load its
     view over the split shape and, for a packed one, panels in (panel, reduce, lane) order.
"""
from tinychad import Tensor
from tinychad.codegen.opt import STAGE_MAX_BYTES, panel_width
import numpy as np
from tinychad.codegen.pack import (COLUMN_PACK_MIN_STEPS, PACK_MIN_STRIDE_BYTES, TRANSPOSED_PACK_MIN_REUSE, pack_plan,
                                 split_lanes)
from tinychad.dtype import dtypes
from tinychad.engine.schedule import create_schedule
from tinychad.ops import BufferOps, KernelNode

P = panel_width(dtypes.float32)


def _unpacked_kernel(out: Tensor, monkeypatch) -> tuple[KernelNode, tuple]:
  monkeypatch.setenv("NOOPT", "1")
  (item,) = [it for it in create_schedule([out.lazydata]) if it.is_kernel]
  return item.ast, item.inputs


def _planned(ast: KernelNode, inputs: tuple) -> dict:
  """{input buffer: (lane axis, panel width)} of the loads pack_plan picks."""
  return {inputs[load.arg[0] - 1]: lane for load, lane in pack_plan(ast).items()}


def test_strided_operand_too_big_to_stage_is_packed(monkeypatch):
  m, k, n = 32, STAGE_MAX_BYTES // (4 * P) + 16, PACK_MIN_STRIDE_BYTES // 4
  a, b = Tensor.rand(m, k).realize(), Tensor.rand(k, n).realize()
  ast, inputs = _unpacked_kernel(a @ b, monkeypatch)
  # the matmul runs over (m, n, k) as (m, 1, k) x (1, k, n) viewed: the lane axis is n's
  assert _planned(ast, inputs) == {b.lazydata.base: (1, P)}
  # small enough to stage in the kernel: nothing to pack
  small = Tensor.rand(64, n).realize()
  assert _planned(*_unpacked_kernel(a[:, :64] @ small, monkeypatch)) == {}


def test_transposed_operand_is_packed_from_enough_rows(monkeypatch):
  k, n = 64, 2 * P
  w = Tensor.rand(n, k).realize()
  many, few = Tensor.rand(TRANSPOSED_PACK_MIN_REUSE, k).realize(), Tensor.rand(TRANSPOSED_PACK_MIN_REUSE // 2, k).realize()
  assert _planned(*_unpacked_kernel(many @ w.T, monkeypatch)) == {w.lazydata.base: (1, P)}
  assert _planned(*_unpacked_kernel(few @ w.T, monkeypatch)) == {}


def test_column_read_operand_is_transposed(monkeypatch):
  # y.T @ x, a weight's gradient: y is read down its columns, one new line per reduce step
  k, m, n = COLUMN_PACK_MIN_STEPS, TRANSPOSED_PACK_MIN_REUSE, 2 * P
  y, x = Tensor.rand(k, m).realize(), Tensor.rand(k, n).realize()
  assert _planned(*_unpacked_kernel(y.T @ x, monkeypatch)) == {y.lazydata.base: (0, 1)}   # its lane: m's axis
  # fewer reduce steps stay in L1; fewer columns of x don't repay the transpose
  assert _planned(*_unpacked_kernel(y[:k // 2].T @ x[:k // 2], monkeypatch)) == {}
  assert _planned(*_unpacked_kernel(y.T @ x[:, :TRANSPOSED_PACK_MIN_REUSE // 2], monkeypatch)) == {}
  monkeypatch.setenv("NOOPT", "0")
  np.testing.assert_allclose((y.T @ x).numpy(), y.numpy().T @ x.numpy(), rtol=1e-5, atol=1e-4)


def test_split_lanes_hands_each_load_its_split_view(monkeypatch):
  m, k, n = TRANSPOSED_PACK_MIN_REUSE, 64, 2 * P
  x, w = Tensor.rand(m, k).realize(), Tensor.rand(n, k).realize()
  ast, inputs = _unpacked_kernel(x @ w.T, monkeypatch)
  plan = pack_plan(ast)
  seen = []

  def relink(load, st, panels):
    seen.append((inputs[load.arg[0] - 1], st.shape, panels))
    return KernelNode(BufferOps.LOAD, (), (load.arg[0], st if panels is None else panels.view), load.dtype)
  split = split_lanes(ast, plan, relink)
  assert split.arg[1].shape == (m, n // P, P, 1)   # the store: lane axis n split into (panels, P)
  assert {buf for buf, _, _ in seen} == {x.lazydata.base, w.lazydata.base}
  for buf, shape, panels in seen:
    assert shape == (m, n // P, P, k)
    assert (panels is not None) == (buf is w.lazydata.base)
  (panels,) = [p for _, _, p in seen if p is not None]
  # w's elements in (panel, reduce, lane) order, its broadcast row axis kept once
  assert panels.order == (0, 1, 3, 2) and panels.kept.shape == (1, n // P, P, k)


def test_one_operand_packed_alike_for_two_kernels_is_copied_once(set_noopt):
  set_noopt("0")     # NOOPT=1 packs nothing
  # an LSTM's gate gradients y, transposed for W_ih's gradient and for W_hh's, in kernels that order their axes
  # differently (a matmul, and a broadcast multiply summed over its middle axis): one copy serves both
  k, m, n = COLUMN_PACK_MIN_STEPS, TRANSPOSED_PACK_MIN_REUSE, 2 * P
  y, x1, x2 = Tensor.rand(k, m).realize(), Tensor.rand(k, n).realize(), Tensor.rand(k, n).realize()
  a, b = y.T @ x1, (y.T.reshape(m, k, 1) * x2.reshape(1, k, n)).sum(1)
  items = create_schedule([a.lazydata, b.lazydata])
  copies = [it for it in items if it.inputs == (y.lazydata.base,)]
  assert len(copies) == 1 and len(items) == 3
  Tensor.realize(a, b)
  np.testing.assert_allclose(a.numpy(), y.numpy().T @ x1.numpy(), rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(b.numpy(), y.numpy().T @ x2.numpy(), rtol=1e-5, atol=1e-4)
