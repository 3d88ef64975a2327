"""scaled_dot_product_attention, lowered flash-style, against PyTorch's: forward and every gradient.

in: seeded random q, k, v and masks (torch_reference.compare), each case on every device and with NOOPT=1
out: pass/fail. Covers no mask, causal (L = S and L != S, PyTorch's top-left alignment), bool and additive masks
(broadcast, with the additive mask's gradient), a query that sees no key, tinychad's sliding window (against
PyTorch given the same window as a bool mask), grouped-query attention, 2-d, 3-d and 4-d inputs, float64, the
errors bad shapes raise, and that no buffer of L x S elements is scheduled for T = 1024, forward or backward.
"""
import math
import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from tinychad import Tensor, dtypes
import tinychad.nn.functional as F
from tinychad.ops import LoadOps
from torch_reference import compare, random_inputs

# the numeric tests run on every device, and with NOOPT=1 (each_device); the checks of errors and schedules once
on_each_device = pytest.mark.usefixtures("each_device")


def _bool_mask(shape: tuple[int, ...], seed: int = 2, empty_row: int | None = None) -> np.ndarray:
  mask = np.random.default_rng(seed).random(shape) < 0.6
  mask[..., 0] = True
  if empty_row is not None: mask[..., empty_row, :] = False
  return mask


def _window_mask(length: int, source: int, window: int) -> np.ndarray:
  i, j = np.arange(length)[:, None], np.arange(source)[None, :]
  return (j <= i) & (j > i - window)


CASES = {
  "plain": dict(q=(2, 3, 10, 16), k=(2, 3, 13, 16), v=(2, 3, 13, 8)),
  "causal": dict(q=(1, 2, 37, 64), k=(1, 2, 37, 64), v=(1, 2, 37, 64), is_causal=True),
  "causal_short_queries": dict(q=(1, 2, 7, 8), k=(1, 2, 20, 8), v=(1, 2, 20, 8), is_causal=True),
  "causal_long_queries": dict(q=(1, 2, 20, 8), k=(1, 2, 7, 8), v=(1, 2, 7, 8), is_causal=True),
  "scale": dict(q=(2, 1, 5, 4), k=(2, 1, 6, 4), v=(2, 1, 6, 4), scale=0.3),
  "bool_mask_broadcast": dict(q=(2, 3, 9, 8), k=(2, 3, 11, 8), v=(2, 3, 11, 8), mask=_bool_mask((9, 11))),
  "bool_mask_empty_row": dict(q=(1, 2, 9, 8), k=(1, 2, 21, 8), v=(1, 2, 21, 8), mask=_bool_mask((2, 9, 21), empty_row=4)),
  "bool_mask_and_causal": dict(q=(1, 2, 19, 8), k=(1, 2, 19, 8), v=(1, 2, 19, 8), mask=_bool_mask((19, 19), 5), is_causal=True),
  "additive_mask_per_key": dict(q=(1, 2, 3, 4), k=(1, 2, 5, 4), v=(1, 2, 5, 6), mask=random_inputs((2, 1, 5), seed=3)[0]),
  "additive_mask_full": dict(q=(2, 2, 6, 8), k=(2, 2, 17, 8), v=(2, 2, 17, 8), mask=random_inputs((2, 2, 6, 17), seed=4)[0]),
  "additive_mask_per_query": dict(q=(1, 3, 6, 8), k=(1, 3, 7, 8), v=(1, 3, 7, 8), mask=random_inputs((6, 1), seed=5)[0]),
  "gqa": dict(q=(2, 6, 9, 8), k=(2, 2, 9, 8), v=(2, 2, 9, 4), enable_gqa=True),
  "gqa_causal_mask": dict(q=(1, 4, 33, 16), k=(1, 1, 33, 16), v=(1, 1, 33, 16), enable_gqa=True, is_causal=True,
                          mask=random_inputs((4, 33, 33), seed=6)[0]),
  # a block of 5 vectors of keys with 16 lanes (a ViT's 65 tokens), of 1 vector (causal over 100 keys)
  "vit_tokens": dict(q=(1, 2, 65, 16), k=(1, 2, 65, 16), v=(1, 2, 65, 16)),
  "causal_blocks_of_one_vector": dict(q=(1, 1, 100, 8), k=(1, 1, 100, 8), v=(1, 1, 100, 8), is_causal=True),
  "3d": dict(q=(4, 9, 8), k=(4, 12, 8), v=(4, 12, 3)),
  "2d_causal": dict(q=(6, 4), k=(6, 4), v=(6, 2), is_causal=True),
  "5d": dict(q=(2, 2, 2, 5, 4), k=(2, 2, 2, 5, 4), v=(2, 2, 2, 5, 4), is_causal=True),
}


@on_each_device
@pytest.mark.parametrize("name", list(CASES))
def test_matches_pytorch(name):
  case = CASES[name]
  kwargs = {key: case[key] for key in ("is_causal", "scale", "enable_gqa") if key in case}
  inputs = [case["q"], case["k"], case["v"]] + ([case["mask"]] if "mask" in case else [])
  def reference(q, k, v, m=None):
    if m is not None and kwargs.get("is_causal"):
      # PyTorch won't take both: the causal band joins the mask
      band = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
      m = m & band if m.dtype == torch.bool else m + torch.zeros(band.shape).masked_fill(~band, -math.inf)
      return TF.scaled_dot_product_attention(q, k, v, attn_mask=m, **dict(kwargs, is_causal=False))
    return TF.scaled_dot_product_attention(q, k, v, attn_mask=m, **kwargs)
  compare(inputs, reference, lambda q, k, v, m=None: F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kwargs), atol=2e-5)


@on_each_device
@pytest.mark.parametrize("window,length,source", [(1, 9, 9), (3, 21, 21), (16, 40, 40), (4, 30, 12)])
def test_window_is_a_causal_band(window, length, source):
  """window=w: query i sees keys i - w < j <= i; PyTorch gets the same band as a bool mask."""
  band = _window_mask(length, source, window)
  compare([(1, 2, length, 8), (1, 2, source, 8), (1, 2, source, 8)],
          lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, attn_mask=torch.tensor(band)),
          lambda q, k, v: F.scaled_dot_product_attention(q, k, v, window=window), atol=2e-5)
  # is_causal may be passed with it: the band already is causal
  compare([(1, 1, length, 4), (1, 1, source, 4), (1, 1, source, 4)],
          lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, attn_mask=torch.tensor(band)),
          lambda q, k, v: F.scaled_dot_product_attention(q, k, v, window=window, is_causal=True), atol=2e-5)


@on_each_device
def test_float64():
  shapes = [(1, 2, 19, 8), (1, 2, 23, 8), (1, 2, 23, 5)]
  arrays = [np.random.default_rng(i).standard_normal(shape) for i, shape in enumerate(shapes)]
  band = torch.ones(19, 23, dtype=torch.bool).tril()
  out = compare(arrays + [_bool_mask((19, 23))],
                lambda q, k, v, m: TF.scaled_dot_product_attention(q, k, v, attn_mask=m & band),
                lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=True), atol=1e-12, rtol=1e-10)
  assert out[0].dtype == dtypes.float64


@on_each_device
def test_gradients_through_transposed_heads():
  """(batch, seq, heads, dim) projections viewed as (batch, heads, seq, dim), as attention layers make them."""
  def heads(fn): return lambda q, k, v: fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
  compare([(2, 11, 3, 8), (2, 11, 3, 8), (2, 11, 3, 8)], heads(TF.scaled_dot_product_attention), heads(F.scaled_dot_product_attention))


def test_attention_weights_path_agrees():
  """attention() (the materialized path MultiheadAttention's need_weights takes) gives the same output, with the
  window and grouped heads too, and weights that sum to 1 over the visible keys."""
  rng = np.random.default_rng(0)
  q, k, v = (Tensor(rng.standard_normal(s).astype(np.float32)) for s in [(1, 4, 12, 8), (1, 2, 12, 8), (1, 2, 12, 8)])
  fused = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, window=5).numpy()
  out, weights = F.attention(q, k, v, enable_gqa=True, window=5)
  np.testing.assert_allclose(out.numpy(), fused, atol=1e-5)
  w = weights.numpy()
  assert w.shape == (1, 4, 12, 12)
  np.testing.assert_allclose(w.sum(-1), 1, atol=1e-5)
  assert np.all(w[..., ~_window_mask(12, 12, 5)] == 0)


@pytest.mark.parametrize("shapes,kwargs,error,words", [
  ([(1, 4, 5, 8), (1, 3, 5, 8), (1, 3, 5, 8)], dict(enable_gqa=True), ValueError, ["divisor", "(1, 4, 5, 8)", "(1, 3, 5, 8)"]),
  ([(1, 4, 5, 8), (1, 2, 5, 8), (1, 2, 5, 8)], {}, ValueError, ["enable_gqa", "(1, 2, 5, 8)"]),
  ([(1, 2, 5, 8), (1, 2, 5, 4), (1, 2, 5, 8)], {}, ValueError, ["last dim", "(1, 2, 5, 4)"]),
  ([(1, 2, 5, 8), (1, 2, 6, 8), (1, 2, 5, 8)], {}, ValueError, ["length", "(1, 2, 6, 8)"]),
  ([(1, 2, 5, 8), (1, 2, 6, 8), (1, 2, 6, 8)], dict(window=0), ValueError, ["window"]),
  ([(1, 2, 5, 8), (1, 2, 6, 8), (1, 2, 6, 8)], dict(attn_mask=(5, 5)), ValueError, ["attn_mask", "(5, 5)", "(1, 2, 5, 6)"]),
  ([(5, 8), (1, 6, 8), (1, 6, 8)], {}, ValueError, ["same number of dims"]),
])
def test_bad_input_raises_naming_shapes(shapes, kwargs, error, words):
  q, k, v = (Tensor.ones(*s) for s in shapes)
  if "attn_mask" in kwargs: kwargs = dict(kwargs, attn_mask=Tensor.ones(*kwargs["attn_mask"], dtype=dtypes.bool))
  with pytest.raises(error) as info:
    F.scaled_dot_product_attention(q, k, v, **kwargs)
  for word in words: assert word in str(info.value)


def test_mixed_dtypes_raise():
  with pytest.raises(TypeError, match="float32, float64"):
    F.scaled_dot_product_attention(Tensor.ones(2, 3), Tensor.ones(2, 3, dtype=dtypes.float64), Tensor.ones(2, 3))


def test_blocks_pad_the_fewest_keys():
  """Away from decoding, a kernel's block of keys pads the lane axis the least a block of at most MAX_BLOCK_VECTORS
  vectors can (65 keys: one block of 5 vectors of 16, not two of 4); a causal kernel takes smaller blocks where that
  pads no more. Decoding steps keep blocks of ATTENTION_BLOCK_VECTORS vectors (fewer for a short cache)."""
  from tinychad.function import ATTENTION_BLOCK_VECTORS, MAX_BLOCK_VECTORS, _lanes_and_block
  for length in range(2, 400):
    for causal in (False, True):
      lanes, block = _lanes_and_block(length, length, dtypes.float32, causal)
      fewest = min(-(-length // (lanes * v)) * lanes * v for v in range(1, MAX_BLOCK_VECTORS + 1))
      assert -(-length // block) * block == fewest, (length, causal, block)
    decoding = _lanes_and_block(1, length, dtypes.float32)
    assert decoding[1] == decoding[0] * min(ATTENTION_BLOCK_VECTORS, -(-length // decoding[0]))
  lanes = _lanes_and_block(2, 2, dtypes.float32)[0]
  if lanes == 16:
    assert _lanes_and_block(65, 65, dtypes.float32)[1] == 80
    assert _lanes_and_block(128, 128, dtypes.float32)[1] == 64
    assert _lanes_and_block(128, 128, dtypes.float32, True)[1] == 32


@on_each_device
def test_decoding_steps_share_an_attention_kernel():
  """One query row against a growing number of keys (a KV cache, no_grad) runs one attention kernel per block of the
  kernel's lane axis, not one per length: the keys are padded to the block and a mask hides the padding. Its results
  are the very ones of the kernel made for each length (the path a gradient takes), and PyTorch's."""
  from tinychad import no_grad
  from tinychad.function import _lanes_and_block
  rng = np.random.default_rng(3)
  kernels, blocks = set(), set()
  for source in range(17, 80, 3):
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in ((1, 4, 1, 16), (1, 4, source, 16), (1, 4, source, 8)))
    with no_grad():
      out = F.scaled_dot_product_attention(Tensor(q), Tensor(k), Tensor(v))
      kernels |= {item.ast for item in out.schedule() if item.ast.op is LoadOps.ATTENTION}
      decoded = out.numpy()
    per_length = F.scaled_dot_product_attention(Tensor(q, requires_grad=True), Tensor(k), Tensor(v)).numpy()
    np.testing.assert_array_equal(decoded, per_length)
    want = TF.scaled_dot_product_attention(*(torch.tensor(x) for x in (q, k, v))).numpy()
    np.testing.assert_allclose(decoded, want, rtol=1e-5, atol=1e-6)
    block = _lanes_and_block(1, source, dtypes.float32)[1]
    blocks.add(-(-source // block) * block)
  # at most one kernel per padded length (fewer where a mask made before a NOOPT switch pads to a longer block)
  assert len(kernels) <= len(blocks) < 21


def test_a_concatenated_kv_cache_compiles_nothing_within_a_block(set_noopt):
  """A user's decoding loop that grows its keys and values by concatenation (no_grad, realized each step): after
  the first step of a block of the attention kernel's lane axis, a step builds no kernel. The cats and the padding
  are generic copies (test_copy.py); the transposed keys and the attention kernel depend on the padded length alone.
  Lengths 35-47 share one padded length with AVX2 (32-key blocks) and AVX-512 (48 keys until 48)."""
  from tinychad import Device, no_grad
  set_noopt("0")      # NOOPT=1 compiles every copy, and its one-lane blocks pad to 4 keys
  device, rng = Device["CPU"], np.random.default_rng(4)
  def compiled() -> int: return sum(1 for kernel in device.programs.values() if not getattr(kernel, "constants", ()))
  k, v = (Tensor(rng.standard_normal((1, 4, 33, 16)).astype(np.float32), device="CPU").realize() for _ in range(2))
  ks, vs = [k.numpy()], [v.numpy()]
  with no_grad():
    for step in range(14):
      q, k_new, v_new = (Tensor(rng.standard_normal((1, 4, 1, 16)).astype(np.float32), device="CPU") for _ in range(3))
      ks.append(k_new.numpy()), vs.append(v_new.numpy())
      before = compiled()
      k, v = k.cat(k_new, dim=2), v.cat(v_new, dim=2)
      out = F.scaled_dot_product_attention(q, k, v).realize(k, v)
      if step > 0: assert compiled() == before, f"length {k.shape[2]} built {compiled() - before} kernels"
  want = TF.scaled_dot_product_attention(torch.tensor(q.numpy()), torch.tensor(np.concatenate(ks, 2)),
                                         torch.tensor(np.concatenate(vs, 2))).numpy()
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)


def test_no_score_sized_buffer_at_t1024():
  """Causal attention at T = 1024 (2 heads, d 64): no kernel of the forward pass or of the gradients of q, k and v
  writes a buffer of T x T elements (the materialized approach writes 2 x T x T per score-sized step)."""
  T = 1024
  q, k, v = (Tensor.empty(1, 2, T, 64, requires_grad=True) for _ in range(3))
  out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
  forward = out.schedule()
  assert any(item.ast.op is LoadOps.ATTENTION for item in forward)
  out.sum().backward()
  for t in [out, q.grad, k.grad, v.grad]:
    sizes = [item.output.size for item in t.schedule()]
    assert max(sizes) < T * T, f"a buffer of {max(sizes)} elements (T x T = {T * T})"


@on_each_device
def test_fully_masked_rows_give_zero_output_and_gradients():
  mask = np.ones((6, 9), dtype=bool)
  mask[2] = False
  compare([(1, 1, 6, 4), (1, 1, 9, 4), (1, 1, 9, 4), mask],
          lambda q, k, v, m: TF.scaled_dot_product_attention(q, k, v, attn_mask=m),
          lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m))
  q = Tensor.ones(1, 1, 6, 4)
  out = F.scaled_dot_product_attention(q, q, q, attn_mask=Tensor(mask[:, :6].copy())).numpy()
  assert np.all(out[0, 0, 2] == 0) and np.all(np.isfinite(out))


@on_each_device
def test_float16_computes_in_float32():
  rng = np.random.default_rng(1)
  arrays = [rng.standard_normal((1, 2, 10, 8)).astype(np.float16) for _ in range(3)]
  out = F.scaled_dot_product_attention(*(Tensor(a) for a in arrays), is_causal=True)
  assert out.dtype == dtypes.float16
  want = TF.scaled_dot_product_attention(*(torch.tensor(a.astype(np.float32)) for a in arrays), is_causal=True)
  np.testing.assert_allclose(out.numpy().astype(np.float32), want.numpy(), atol=2e-3)
  assert math.isfinite(float(out.numpy().astype(np.float32).sum()))


def test_replayed_by_tinyjit_with_new_inputs():
  """A jitted causal attention forward and backward replays its kernels on each call's own inputs."""
  from tinychad import TinyJit

  @TinyJit
  def step(q, k, v):
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    out.sum().backward()
    return out.realize(q.grad, k.grad, v.grad), q.grad, k.grad, v.grad

  for seed in range(4):
    arrays = [np.random.default_rng(seed * 3 + i).standard_normal(s).astype(np.float32)
              for i, s in enumerate([(1, 4, 20, 8), (1, 2, 20, 8), (1, 2, 20, 8)])]
    tensors = [Tensor(a, requires_grad=True) for a in arrays]
    torch_in = [torch.tensor(a, requires_grad=True) for a in arrays]
    want = TF.scaled_dot_product_attention(*torch_in, is_causal=True, enable_gqa=True)
    want.sum().backward()
    out, *grads = step(*tensors)
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), atol=2e-5)
    for grad, w in zip(grads, torch_in): np.testing.assert_allclose(grad.numpy(), w.grad.numpy(), atol=2e-5)
