"""The kernel optimizations: SIMD lanes, register tiles, several accumulators, packed panels, threads.

in: matmul, convolution and reduce shapes (odd sizes the tiles don't divide included), run on the
    compiled devices with the optimizations on and off (NOOPT) and with THREADS=1 and 2
out: pass when every variant matches the NUMPY reference (float sums within tolerance, since partial
     sums reorder them; integers exactly), the matmul pattern gets a vector axis and a register tile,
     a matmul operand read with a page-sized step is packed into panels (and no other), the tile's
     loop runs inside the panel loop, and the thread split (native pool and Python fallback) covers
     the loop exactly once.
"""
import ctypes
import gc
import re
import numpy as np
import pytest
from tinychad import Tensor
from tinychad.codegen import linearize, UOps
from tinychad.codegen.opt import (REDUCE_UNROLL, STAGE_MAX_BYTES, TILE_ROWS, TRANSPOSE_LINE_BYTES, TRANSPOSE_MIN_POINTS,
                                  TRANSPOSE_SIMD_MIN_POINTS, TRANSPOSE_STORE_LANES, LeafAccess, choose_opts, panel_width,
                                  simd_bytes)
from tinychad.dtype import dtypes
from tinychad.codegen.pack import PACK_MIN_STRIDE_BYTES
from tinychad.engine.schedule import create_schedule
from tinychad.host import cpu_tuning, target_simd_bytes
from tinychad.ops import BinaryOps, BufferOps, TernaryOps
from tinychad.runtime import threads
from tinychad.renderer.cstyle import render_c
from tinychad.renderer.llvmir import render_llvm
from tinychad.runtime.cc import compile_c
from tinychad.runtime.threads import MIN_PARALLEL_WORK, chunks

DEVICES = ["CPU", "LLVM"]
# (threads, noopt): the optimized kernels on one and two threads, and plain loops
MODES = [("1", "0"), ("2", "0"), ("2", "1")]
rng = np.random.default_rng(0)


@pytest.fixture
def host_row():
  """Kernels shaped by the tuning table's "host" row (AVX-512's 6 x 4 tile, whose sizes the tests name) also on
  an AVX2 machine, whose own row test_avx2_row_is_three_rows_of_four checks."""
  with target_simd_bytes(simd_bytes(), "host"): yield


@pytest.fixture(params=MODES, ids=[f"threads{t}-noopt{n}" for t, n in MODES])
def mode(request, monkeypatch, set_noopt):
  threads, noopt = request.param
  monkeypatch.setenv("THREADS", threads)
  set_noopt(noopt)
  return request.param


def _check(build, *arrays, tol=1e-4):
  want = build(*[Tensor(a, device="NUMPY") for a in arrays]).numpy()
  for device in DEVICES:
    got = build(*[Tensor(a, device=device) for a in arrays]).numpy()
    assert got.dtype == want.dtype and got.shape == want.shape, device
    if want.dtype.kind == "f": np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=device)
    else: np.testing.assert_array_equal(got, want, err_msg=device)


# the last four have tiles of 6 rows with a tail tile after them: 4 rows, 1 row, 3 rows, only the tail
MATMULS = [(64, 64, 64), (33, 17, 65), (96, 128, 40), (5, 1, 7), (130, 48, 256), (1000, 256, 64), (7, 256, 128),
           (45, 200, 192), (5, 300, 64), (23, 150, 80), (30, 64, 112), (20, 200, 48)]   # the last three: 5, 7, 3 vectors


@pytest.mark.parametrize("n,k,m", MATMULS, ids=[f"{n}x{k}x{m}" for n, k, m in MATMULS])
def test_matmul(mode, n, k, m):
  a, b = rng.standard_normal((n, k), dtype=np.float32), rng.standard_normal((k, m), dtype=np.float32)
  _check(lambda x, y: x @ y, a, b)
  # the transposed weight of a linear layer: contiguous along k for both operands
  _check(lambda x, y: x @ y.T, a, np.ascontiguousarray(b.T))


@pytest.mark.parametrize("n,k,m", [(8, 256, 128), (7, 300, 192)], ids=["8x256x128", "7x300x192"])
def test_tail_tile_with_fused_consumer(mode, n, k, m):
  # one tile of 6 rows that needs no loop, then a tail tile of the rest, then relu * 2 on both: the
  # tail's rows once stored the first tile's relu (a linear layer + relu on a batch of 8)
  a, b = rng.standard_normal((n, k), dtype=np.float32), rng.standard_normal((k, m), dtype=np.float32)
  _check(lambda x, y: (x @ y).relu() * 2, a, b)


# 64 output channels: 4 vectors of lanes, tiles of 6 positions and a tail; 5x5 windows: tiles of 5 rows
CONVS = [((2, 3, 12, 12), 1, 0, 8, 3), ((3, 2, 9, 11), 2, 1, 8, 3), ((2, 3, 9, 9), 1, 1, 64, 3), ((4, 1, 14, 14), 1, 0, 32, 5),
         ((2, 4, 12, 12), 1, 2, 16, 5)]


@pytest.mark.parametrize("shape,stride,pad,cout,k", CONVS)
def test_conv_forward_backward(mode, shape, stride, pad, cout, k):
  x, w = rng.standard_normal(shape, dtype=np.float32), rng.standard_normal((cout, shape[1], k, k), dtype=np.float32)

  def grads(xt, wt):
    xt.requires_grad = wt.requires_grad = True
    out = xt.conv2d(wt, stride=stride, padding=pad).relu()
    (out * out).sum().backward()
    return out.flatten().cat(wt.grad.flatten(), xt.grad.flatten())
  _check(grads, x, w, tol=1e-3)


REDUCES = [((100003,), 0), ((64, 1000), 1), ((1000, 48), 0), ((7, 33, 16), 2), ((256, 256), (0, 1))]


@pytest.mark.parametrize("shape,axis", REDUCES, ids=[f"{s}-{a}" for s, a in REDUCES])
def test_reduces(mode, shape, axis):
  x = rng.standard_normal(shape, dtype=np.float32)
  _check(lambda t: t.sum(axis), x)
  _check(lambda t: t.max(axis), x)
  _check(lambda t: t.softmax(-1), x)
  # integer sums keep their exact value whatever the order
  _check(lambda t: t.sum(axis), rng.integers(-1000, 1000, size=shape, dtype=np.int32))


# at least TRANSPOSE_MIN_POINTS elements each, so the block is used (opts are not part of the kernel record's key)
TRANSPOSES = [((512, 512), np.float32), ((516, 512), np.float32), ((512, 512), np.float64), ((512, 512), np.int8)]


@pytest.mark.parametrize("shape,dtype", TRANSPOSES, ids=[f"{s}-{np.dtype(d).name}" for s, d in TRANSPOSES])
def test_transposing_copies(mode, shape, dtype):
  # blocks of a cache line by TRANSPOSE_STORE_LANES, or lines along the load with a plain store loop
  # when the store's axis (516) isn't a multiple of those
  assert shape[0] * shape[1] >= TRANSPOSE_MIN_POINTS
  x = rng.standard_normal(shape).astype(dtype)
  _check(lambda t: t.T.contiguous(), x)
  _check(lambda t: t.T * 2 + t.T.contiguous(), x)


def test_channels_last_to_nchw_copy(mode):
  channels_last = rng.standard_normal((16, 16, 16, 64), dtype=np.float32)
  _check(lambda t: t.permute(0, 3, 1, 2).contiguous().relu(), channels_last)


def test_transpose_moves_a_block_per_step(monkeypatch):
  # float32: a line along the load's axis, one SIMD vector along the store's, read as whole vectors and
  # transposed in registers (log2(width) rounds of `width` shuffles per square block)
  monkeypatch.setenv("NOOPT", "0")
  x = Tensor.rand(512, 512, device="NUMPY")
  (item,) = [it for it in create_schedule([x.T.contiguous().lazydata]) if it.is_kernel]
  uops = linearize(item.ast, item.name).uops
  width, line = simd_bytes() // 4, TRANSPOSE_LINE_BYTES // 4
  stores = [u for u in uops if u.op is UOps.STORE]
  assert len(stores) == line and all(u.srcs[2].vec == width for u in stores)
  assert all(u.vec == width for u in uops if u.op is UOps.LOAD)
  assert sum(1 for u in uops if u.op is UOps.SHUFFLE) == line * (width.bit_length() - 1)
  monkeypatch.setenv("NOOPT", "1")
  assert sum(1 for u in linearize(item.ast, item.name).uops if u.op is UOps.STORE) == 1


def test_smaller_transposes_take_only_the_simd_block(monkeypatch):
  # between the two thresholds a SIMD block pays for its compile, a scalar one doesn't: plain loops
  monkeypatch.setenv("NOOPT", "0")
  shape = (256, TRANSPOSE_SIMD_MIN_POINTS // 256)
  assert TRANSPOSE_SIMD_MIN_POINTS <= shape[0] * shape[1] < TRANSPOSE_MIN_POINTS
  for x, shuffles in ((Tensor.rand(*shape, device="NUMPY"), True), (Tensor(rng.random(shape) > 0.5, device="NUMPY"), False)):
    (item,) = [it for it in create_schedule([x.T.contiguous().lazydata]) if it.is_kernel]
    uops = linearize(item.ast, item.name).uops
    assert any(u.op is UOps.SHUFFLE for u in uops) == shuffles
    if not shuffles: assert sum(1 for u in uops if u.op is UOps.STORE) == 1


def test_narrow_transpose_moves_a_scalar_block(monkeypatch):
  # bool: a line along the load's axis is narrower than a SIMD vector of bytes, so the block is scalar lanes
  monkeypatch.setenv("NOOPT", "0")
  x = Tensor(rng.random((512, 512)) > 0.5, device="NUMPY")
  (item,) = [it for it in create_schedule([x.T.contiguous().lazydata]) if it.is_kernel]
  uops = linearize(item.ast, item.name).uops
  stores = [u for u in uops if u.op is UOps.STORE]
  assert len(stores) == min(16, TRANSPOSE_LINE_BYTES) * TRANSPOSE_STORE_LANES and all(u.srcs[2].vec == 1 for u in stores)
  assert not any(u.op is UOps.SHUFFLE for u in uops)


def test_transposed_block_with_other_loads(mode):
  # a momentum update reading a transposed gradient: loads along the store's axis, a broadcast, a transposed one
  v, g = rng.standard_normal((512, 4608), dtype=np.float32), rng.standard_normal((4608, 512), dtype=np.float32)
  bias = rng.standard_normal((512, 1), dtype=np.float32)
  _check(lambda v, g, bias: v * 0.9 + g.T - bias, v, g, bias)
  # float64 (half the lanes) and a mask along the transposed axis that changes inside a block (lane by lane)
  _check(lambda v, g: v + g.T, v.astype(np.float64)[:, :1024], g.astype(np.float64)[:1024])
  _check(lambda g: g.T.pad(((3, 5), (0, 0))).contiguous(), g[:, :504])


def _stacked_with_broadcast(a, b, c):
  # (16, 2, 64): slot 0 from a, slot 1 from b (each read through a mask along the slot axis), plus c read
  # along every slot (stride 0 there, so the slot axis can't merge with the next one)
  return Tensor.stack([a.exp(), b * 2], dim=1) + c.unsqueeze(1)


def test_masked_slots(mode):
  a, b, c = (rng.standard_normal((16, 64), dtype=np.float32) for _ in range(3))
  _check(_stacked_with_broadcast, a, b, c)
  _check(lambda x: x.pad(((0, 0), (1, 2))).reshape(16, 67, 1).expand(16, 67, 8) * x.sum(1).reshape(16, 1, 1), a[:, :64])


def test_masked_slot_axis_is_unrolled_and_its_masks_fold(monkeypatch):
  # the slot axis is unrolled whole: each copy knows which input is valid, so no select or comparison is left
  monkeypatch.setenv("NOOPT", "0")
  a, b, c = (Tensor.rand(16, 64, device="NUMPY") for _ in range(3))
  (item,) = [it for it in create_schedule([(Tensor.stack([a, b], dim=1) + c.unsqueeze(1)).lazydata]) if it.is_kernel]
  def selects(uops): return sum(1 for u in uops if u.op is UOps.ALU and u.arg in (TernaryOps.WHERE, BinaryOps.CMPLT))
  assert selects(linearize(item.ast, item.name).uops) == 0
  monkeypatch.setenv("NOOPT", "1")
  assert selects(linearize(item.ast, item.name).uops) > 0


def test_max_keeps_nan(mode):
  x = rng.standard_normal((64, 256), dtype=np.float32)
  x[3, 100] = np.nan
  _check(lambda t: t.max(1), x)


def test_threads_give_identical_results(monkeypatch):
  # each output is computed by one thread in either case, so the results match bit for bit
  a, b = rng.standard_normal((256, 128), dtype=np.float32), rng.standard_normal((128, 512), dtype=np.float32)
  assert 256 * 512 * 128 >= MIN_PARALLEL_WORK
  for device in DEVICES:
    results = []
    for threads in ("1", "2"):
      monkeypatch.setenv("THREADS", threads)
      results.append(((Tensor(a, device=device) @ Tensor(b, device=device)).exp() + 1).numpy())
    np.testing.assert_array_equal(results[0], results[1], err_msg=device)


def test_matmul_gets_vector_and_tile(monkeypatch):
  monkeypatch.setenv("NOOPT", "0")
  a, b = Tensor.rand(64, 64, device="NUMPY"), Tensor.rand(64, 64, device="NUMPY")
  (item,) = [it for it in create_schedule([(a @ b).lazydata]) if it.is_kernel]
  program = linearize(item.ast, item.name)
  assert max(u.vec for u in program.uops) > 1
  assert program.contract and program.parallel > 1
  # several accumulators: a register tile, not one running sum
  assert sum(1 for u in program.uops if u.op.name == "DEFINE_ACC") >= 4
  # the reduce loop (the innermost) asks the C compiler to unroll it; the outer loops don't
  ranges = [u.arg for u in program.uops if u.op is UOps.RANGE]
  assert ranges[-1][0].startswith("ridx") and ranges[-1][3] == REDUCE_UNROLL > 1
  assert all(unroll == 1 for *_, unroll in ranges[:-1])
  source = render_c(program)
  assert f"#pragma GCC unroll {REDUCE_UNROLL}\n" in source
  # a tile row's second vector is read at a constant step from the first, as a pointer step
  assert re.search(r"\(const float32x16u\*\)\(data2\+alu\d+\+16\)", source) or simd_bytes() < 64
  # LLVM: each SIMD accumulator is one vector (one phi once promoted), not a scalar per lane
  width = max(u.vec for u in program.uops if u.op is UOps.DEFINE_ACC)
  assert f"alloca <{width} x float>" in render_llvm(program)
  monkeypatch.setenv("NOOPT", "1")
  program = linearize(item.ast, item.name)
  assert max(u.vec for u in program.uops) == 1 and not program.contract
  assert sum(1 for u in program.uops if u.op.name == "DEFINE_ACC") == 1
  assert "#pragma" not in render_c(program)


def test_five_row_window_gets_a_five_row_tile(monkeypatch, host_row):
  # a 5x5 convolution's weight gradient (one input channel): outputs (ky, kx, cout), reduced over
  # (batch, positions); the gradient vector is the same for every (ky, kx), so a register tile along
  # ky shares it. None of 8, 6, 4, 3, 2 divides 5: without 5 in TILE_AMOUNTS there was no tile.
  monkeypatch.setenv("NOOPT", "0")    # NOOPT=1 chooses plain loops
  dims = [(5, False), (5, False), (32, False), (8, True), (576, True)]
  leaves = [LeafAccess((160, 32, 1, 0, 0), is_load=False, is_store=True, below_reduce=False),
            LeafAccess((28, 1, 0, 784, 1), is_load=True, is_store=False, below_reduce=True),
            LeafAccess((0, 0, 1, 18432, 32), is_load=True, is_store=False, below_reduce=True)]
  opts = choose_opts(dims, leaves, {dtypes.float32}, {BinaryOps.MUL, BinaryOps.ADD})
  assert opts.vector is not None and opts.vector[0] == 2
  assert opts.upcast.get(0) == 5 or opts.upcast.get(1) == 5


def test_batched_matmul_threads_split_the_batch(monkeypatch):
  """Each (batch, head) of attention's q @ k^T is its own matmul: the batch axis goes outermost (the
  loop the threads split); a plain matmul's weights don't move along its batch, so it stays inside."""
  from tinychad.codegen.linearize import opt_inputs
  from tinychad.codegen.opt import choose_opts
  monkeypatch.setenv("NOOPT", "0")
  monkeypatch.setenv("THREADS", "1")
  q, kt, w = Tensor.rand(32, 128, 64, device="NUMPY"), Tensor.rand(32, 64, 128, device="NUMPY"), Tensor.rand(64, 128, device="NUMPY")
  for b, batched in ((kt, True), (w, False)):
    (item,) = [it for it in create_schedule([(q @ b).lazydata]) if it.is_kernel]
    dims, *_ = inputs = opt_inputs(item.ast)
    opts = choose_opts(*inputs)
    if batched: assert dims[0] == (32, False) and opts.order[0] == 0, (dims, opts)
    else: assert opts.order[0] == opts.vector[0], (dims, opts)


def _matmul_opts(m: int, k: int, n: int):
  from tinychad.codegen.linearize import opt_inputs
  from tinychad.codegen.opt import choose_opts
  a, b = Tensor.rand(m, k, device="NUMPY"), Tensor.rand(k, n, device="NUMPY")
  (item,) = [it for it in create_schedule([(a @ b).lazydata]) if it.is_kernel]
  return item, choose_opts(*opt_inputs(item.ast))


@pytest.mark.parametrize("threads,k,panels,rows_outer", [("2", 768, 3, True), ("1", 768, 3, False), ("3", 768, 3, False),
                                                         ("2", 768, 4, False), ("2", 4096, 3, False)],
                         ids=["3-panels-2-threads", "1-thread", "3-threads", "4-panels", "big-b"])
def test_few_panels_put_the_rows_outermost(monkeypatch, threads, k, panels, rows_outer):
  """Threads split the outermost loop: 3 panels of columns on 2 threads would run as 2 and 1, so the tile's rows go
  outermost instead; 1 or 3 threads, 4 panels on 2, or a b too big to read whole per tile of rows keep the panels
  outermost. An export's kernels (one thread) never move. Either way the product is right."""
  from tinychad.codegen.opt import BALANCE_MAX_BYTES
  m, n = 1040, panels * panel_width(dtypes.float32)
  assert (k * n * 4 > BALANCE_MAX_BYTES) == (k == 4096)
  monkeypatch.setenv("NOOPT", "0")
  monkeypatch.setenv("THREADS", threads)
  item, opts = _matmul_opts(m, k, n)
  outer = opts.order[0]
  assert (outer != opts.vector[0]) == rows_outer, opts
  program = linearize(item.ast, item.name, opts)
  assert program.parallel == (m // opts.upcast[outer] if rows_outer else panels)
  with target_simd_bytes(simd_bytes(), cpu_tuning(simd_bytes())):
    assert _matmul_opts(m, k, n)[1].order[0] == opts.vector[0]
  if rows_outer:
    a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    _check(lambda x, y: x @ y, a, b, tol=1e-3)


@pytest.mark.parametrize("m", [997, 1042], ids=["prime-rows", "rows-2-times-prime"])
def test_rows_that_no_tile_divides_keep_their_tile(monkeypatch, m):
  """Thread balance can't put rows outermost with a tail tile (the tail runs once per call). 997 rows (prime) keep the
  host's tile and its tail, inside the panel loop; 1042 rows keep a tile too (a 2-row one outermost, or the host's
  with a tail where 2 rows are much fewer: the 6-row AVX-512 tile). Both compute the product."""
  n = 3 * panel_width(dtypes.float32)
  monkeypatch.setenv("NOOPT", "0")
  monkeypatch.setenv("THREADS", "2")
  item, opts = _matmul_opts(m, 768, n)
  rows = next(d for d in opts.upcast if d != opts.vector[0])
  assert opts.upcast[rows] >= 2, opts
  if m == 997: assert opts.upcast[rows] > 2 and opts.order[0] == opts.vector[0], opts
  a, b = rng.standard_normal((m, 768), dtype=np.float32), rng.standard_normal((768, n), dtype=np.float32)
  _check(lambda x, y: x @ y, a, b, tol=1e-3)


def test_register_tile_shapes(monkeypatch, host_row):
  """A long matmul's tile is 6 rows of 4 vectors, with a tail tile where 6 doesn't divide the rows;
  attention's q @ k^T (a reduce over 64) gets 4 rows of 4 vectors, and 2 vectors of lanes 8 rows."""
  from tinychad.codegen.opt import NARROW_ROW_VECTORS, ODD_ROW_TILES, SHORT_REDUCE, TILE_ROW_VECTORS, TILE_ROWS
  from tinychad.host import simd_bytes
  monkeypatch.setenv("NOOPT", "0")
  lanes = simd_bytes() // 4
  # 5, 3 or 7 vectors of lanes (where 4 don't divide): 5x5, 8x3, 3x7, short reduce or not
  odd = [(k, count * lanes, count, rows) for count, rows in ODD_ROW_TILES.items() for k in (64, SHORT_REDUCE * 2)]
  for k, n, row_vectors, rows in [(64, 128, TILE_ROW_VECTORS, 4), (SHORT_REDUCE * 2, 128, TILE_ROW_VECTORS, TILE_ROWS),
                                  (SHORT_REDUCE * 2, 2 * lanes, NARROW_ROW_VECTORS, 8)] + odd:
    _, opts = _matmul_opts(120, k, n)     # rows that 4, 5, 6, 8 and 3 divide: no tail tile
    axis, width = opts.vector
    (row_axis,) = [d for d in opts.upcast if d != axis]
    assert width == lanes and opts.upcast[axis] == row_vectors * lanes and opts.upcast[row_axis] == rows, (k, opts)
  # 100 rows: 16 tiles of 6 in the loop inside the one over 2 panels of columns (which threads split),
  # then one tile of the last 4 rows (24 + 4 * 4 accumulators)
  item, opts = _matmul_opts(100, 256, 2 * TILE_ROW_VECTORS * lanes)
  program = linearize(item.ast, item.name, opts)
  assert [u.arg[1] for u in program.uops if u.op is UOps.RANGE and u.arg[0].startswith("gidx")] == [2, 100 // TILE_ROWS]
  assert sum(1 for u in program.uops if u.op is UOps.DEFINE_ACC) == 6 * 4 + 4 * 4
  # with no loop outside it (one panel), a tail would run once per thread: 5 rows divide 100 instead
  _, opts = _matmul_opts(100, 256, TILE_ROW_VECTORS * lanes)
  (rows,) = [amount for d, amount in opts.upcast.items() if d != opts.vector[0]]
  assert rows == 5


@pytest.mark.parametrize("extent,parts", [(10, 3), (2, 2), (7, 1), (100, 8)])
def test_chunks_cover_the_loop_once(extent, parts):
  ranges = chunks(extent, parts)
  assert len(ranges) == parts and ranges[0][0] == 0 and ranges[-1][1] == extent
  assert all(hi == lo for (_, hi), (lo, _) in zip(ranges, ranges[1:]))
  assert max(hi - lo for lo, hi in ranges) - min(hi - lo for lo, hi in ranges) <= 1


# (m, k, n) of a @ b where the kernel stages panels of b (the first two: b's rows a page apart, the
# last one: a tail tile) and where the panel is too big to stage, so the scheduler packs b first
STAGE_K = STAGE_MAX_BYTES // (4 * panel_width(dtypes.float32))
PACKED_MATMULS = [(32, 64, PACK_MIN_STRIDE_BYTES // 4), (48, 40, 2 * PACK_MIN_STRIDE_BYTES // 4), (50, 30, 192),
                  (8, STAGE_K + 16, PACK_MIN_STRIDE_BYTES // 4)]


@pytest.mark.parametrize("m,k,n", PACKED_MATMULS, ids=[f"{m}x{k}x{n}" for m, k, n in PACKED_MATMULS])
def test_packed_matmul(mode, m, k, n):
  a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
  _check(lambda x, y: x @ y, a, b)
  # a fused elementwise consumer and a batch axis keep working through the split lane axis
  _check(lambda x, y: (x @ y).relu() * 2, a, b)
  _check(lambda x, y: x.reshape(2, m // 2, k) @ y, a, b)


def _kernels(out: Tensor) -> list:
  return [it for it in create_schedule([out.lazydata]) if it.is_kernel]


def test_avx2_row_is_three_rows_of_four(monkeypatch):
  """AVX2's 16 registers hold 3 rows of 4 vectors (12 accumulators), not the 6 x 4 of AVX-512's 32."""
  monkeypatch.setenv("NOOPT", "0")
  assert cpu_tuning(32) == "avx2" and cpu_tuning(64) == cpu_tuning(16) == "host"
  with target_simd_bytes(32, "avx2"): _, opts = _matmul_opts(120, 256, 128)
  axis, width = opts.vector
  (row_axis,) = [d for d in opts.upcast if d != axis]
  assert width == 8 and opts.upcast[axis] == 32 and opts.upcast[row_axis] == 3


def test_strided_operand_is_packed_into_panels(monkeypatch, host_row):
  monkeypatch.setenv("NOOPT", "0")
  m, k, n, p = 32, STAGE_K + 16, PACK_MIN_STRIDE_BYTES // 4, panel_width(dtypes.float32)
  a, b = Tensor.rand(m, k, device="NUMPY").realize(), Tensor.rand(k, n, device="NUMPY").realize()
  pack, matmul = _kernels(a @ b)
  # the packing kernel is a plain copy of b into (panel, k, lane) order
  assert pack.inputs == (b.lazydata.base,) and pack.output.shape == (1, n // p, k, p) and pack.op_count == 0
  assert matmul.inputs[1] is pack.output
  # the matmul reads the panels with stride 1 across the lanes and p from one reduce step to the next
  (load,) = [node for node in matmul.ast.walk() if node.op is BufferOps.LOAD and node.arg[0] == 2]
  assert load.arg[1].views[0].strides == (0, k * p, 1, p)
  # the register tile's loop runs inside the panel loop: threads split the panels
  program = linearize(matmul.ast, matmul.name)
  ranges = [u.arg for u in program.uops if u.op is UOps.RANGE]
  assert ranges[0][:3] == ("gidx1", n // p, True) and ranges[1][1] == m // TILE_ROWS and program.parallel == n // p


# (m, k, n) of x @ w.T with w (n, k), a Linear layer's weight: w's panels are packed ahead, except
# for the third (too few rows: TRANSPOSED_PACK_MIN_REUSE)
LINEAR_MATMULS = [(64, 64, 128), (70, 30, 192), (6, 40, 64 * 3), (2 * 32, 24, 64)]


@pytest.mark.parametrize("m,k,n", LINEAR_MATMULS, ids=[f"{m}x{k}x{n}" for m, k, n in LINEAR_MATMULS])
def test_transposed_operand_matmul(mode, m, k, n):
  x, w = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((n, k), dtype=np.float32)
  bias = rng.standard_normal(n, dtype=np.float32)
  _check(lambda a, b: a @ b.T, x, w)
  _check(lambda a, b, c: a.linear(b.T, c).relu(), x, w, bias)
  _check(lambda a, b: a.reshape(2, m // 2, k) @ b.T, x, w)


def test_transposed_operand_is_packed_into_panels(monkeypatch):
  """x @ w.T reads w along the reduce axis: left alone, the kernel's SIMD lanes would run along the
  reduce (dot products). Packed into panels, w's lanes run along the output columns, and the kernel
  is the broadcast-times-vector register tile of a plain matmul."""
  monkeypatch.setenv("NOOPT", "0")
  m, k, n, p = 64, 48, 128, panel_width(dtypes.float32)
  x, w = Tensor.rand(m, k, device="NUMPY").realize(), Tensor.rand(n, k, device="NUMPY").realize()
  pack, matmul = _kernels(x @ w.T)
  assert pack.inputs == (w.lazydata.base,) and pack.output.shape == (1, n // p, k, p) and pack.op_count == 0
  (load,) = [node for node in matmul.ast.walk() if node.op is BufferOps.LOAD and node.arg[0] == 2]
  assert load.arg[1].views[0].strides == (0, k * p, 1, p)
  program = linearize(matmul.ast, matmul.name)
  vector_loads = [u for u in program.uops if u.op is UOps.LOAD and u.vec > 1]
  assert vector_loads and all(u.srcs[0] is not program.globals[1] for u in vector_loads)   # x: broadcast scalars
  assert not [u for u in program.uops if u.op is UOps.GEP]                                  # no horizontal sums


@pytest.mark.parametrize("m,noopt,other", [(32, "0", False), (64, "1", False), (64, "0", True)], ids=["few-rows", "noopt", "transposed-consumer"])
def test_transposed_operand_not_packed(monkeypatch, m, noopt, other):
  # too few rows to repay the transposing copy (32, where a plain operand would be packed from 16),
  # NOOPT, and a fused consumer that reads the output's transpose (no lanes along its columns for it)
  monkeypatch.setenv("NOOPT", noopt)
  x, w = Tensor.rand(m, 48, device="NUMPY").realize(), Tensor.rand(128, 48, device="NUMPY").realize()
  out = x @ w.T
  if other: out = out + Tensor.rand(128, m, device="NUMPY").realize().T
  assert len(_kernels(out)) == 1


@pytest.mark.parametrize("m,k,n,noopt", [(32, 64, 256, "0"), (1, 64, 4096, "0"), (32, 64, 4096, "0"), (32, STAGE_K + 16, 4096, "1")],
                         ids=["short-rows", "no-reuse", "staged", "noopt"])
def test_operand_not_packed(monkeypatch, m, k, n, noopt):
  # rows closer than a page, a matrix-vector product (each element read once), a panel the kernel
  # stages itself and NOOPT: no copy ahead
  monkeypatch.setenv("NOOPT", noopt)
  a, b = Tensor.rand(m, k, device="NUMPY").realize(), Tensor.rand(k, n, device="NUMPY").realize()
  assert len(_kernels(a @ b)) == 1


def _staged_program(monkeypatch, a: Tensor, b: Tensor, noopt: str = "0"):
  monkeypatch.setenv("NOOPT", noopt)
  monkeypatch.setenv("THREADS", "1")    # the loop order of one thread (test_few_panels_put_the_rows_outermost: more)
  (item,) = _kernels(a @ b)
  return linearize(item.ast, item.name)


def test_shared_operand_is_staged(monkeypatch):
  """The tile's shared operand (b) is copied into a stack panel inside the loop over panels, and the
  tile reads only that panel: b's global buffer is read in the copy loop, before the tile's loop."""
  m, k, n, p = 64, 96, 256, panel_width(dtypes.float32)
  a, b = Tensor.rand(m, k, device="NUMPY").realize(), Tensor.rand(k, n, device="NUMPY").realize()
  program = _staged_program(monkeypatch, a, b)
  (local,) = [u for u in program.uops if u.op is UOps.DEFINE_LOCAL]
  assert local.arg == k * p and local.dtype == dtypes.float32
  ranges = [u for u in program.uops if u.op is UOps.RANGE]
  assert [r.arg[0] for r in ranges[:4]] == ["gidx1", "ridx0", "gidx0", "ridx0"] and ranges[0].arg[1] == n // p
  b_buffer = program.globals[2]
  b_reads = [u.num for u in program.uops if u.op is UOps.LOAD and u.srcs[0] is b_buffer]
  panel_writes = [u.num for u in program.uops if u.op is UOps.STORE and u.srcs[0] is local]
  assert b_reads and max(b_reads) < ranges[2].num and len(panel_writes) == p // (simd_bytes() // 4)
  assert all(u.vec > 1 for u in program.uops if u.op is UOps.LOAD and u.srcs[0] is local)
  assert f"float local{local.num}[{k * p}] __attribute__((aligned(64)));" in render_c(program)
  assert f"alloca float, i64 {k * p}, align 64" in render_llvm(program)
  # a caller's Opts that stages a load the tile doesn't share (a, which moves along the tile's rows)
  from tinychad.codegen.linearize import opt_inputs
  from tinychad.codegen.opt import choose_opts
  (item,) = _kernels(a @ b)
  opts = choose_opts(*opt_inputs(item.ast))
  opts.stage = 1 - opts.stage if opts.stage in (0, 1) else 0
  with pytest.raises(ValueError, match="can't be staged"): linearize(item.ast, item.name, opts)


@pytest.mark.parametrize("m,n,noopt", [(8, 256, "0"), (64, panel_width(dtypes.float32), "0"), (64, 256, "1")],
                         ids=["few-rows", "one-panel", "noopt"])
def test_operand_not_staged(monkeypatch, host_row, m, n, noopt):
  # two tiles of rows don't repay the copy, a b exactly one panel wide is a panel already, NOOPT
  a, b = Tensor.rand(m, 96, device="NUMPY").realize(), Tensor.rand(96, n, device="NUMPY").realize()
  assert not any(u.op is UOps.DEFINE_LOCAL for u in _staged_program(monkeypatch, a, b, noopt).uops)


def test_freed_kernel_lists_leave_no_cyclic_garbage():
  """A KernelList's arrays of argument counts nothing else has (a launch replaced by another) die by reference
  counting: their ctypes array types, each a reference cycle, stay cached (threads.c_array)."""
  gc.collect()
  for count in (7919, 7907, 7901):
    threads.KernelList([(0, [0] * count, 1, 1), (0, [0] * 3, 1, 1)])
  assert gc.collect() == 0


# the first piece is slow, so the other thread takes the rest of the first thread's block
CHUNK_RECORDER = """#include <time.h>
void record(long long* out, long long start, long long end) {
  if (start == 0) nanosleep(&(struct timespec){0, 200000}, 0);
  for (long long i = start; i < end; i++) out[i] += 1;
}"""


@pytest.mark.parametrize("extent", [2, 7, 1000])
@pytest.mark.parametrize("native", [True, False], ids=["native-pool", "python-pool"])
def test_thread_pool_runs_every_index_once(monkeypatch, extent, native):
  monkeypatch.setenv("THREADS", "2")
  if not native: monkeypatch.setattr(threads, "_native_pool", lambda: None)
  fn = compile_c(CHUNK_RECORDER, "record").record
  fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64], None
  counts = np.zeros(extent, dtype=np.int64)
  for _ in range(50): threads.run_parallel(fn, [counts.ctypes.data], extent, MIN_PARALLEL_WORK)
  np.testing.assert_array_equal(counts, 50)


def test_kernel_with_more_buffers_than_the_native_pool_takes(monkeypatch):
  monkeypatch.setenv("THREADS", "2")
  xs = [rng.standard_normal((256, 300), dtype=np.float32) for _ in range(threads.POOL_MAX_ARGS + 2)]
  _check(lambda *ts: sum(ts[1:], ts[0]), *xs)
