"""Each layer in tinychad.nn against PyTorch's: same weights (copied through load_state_dict), same input ->
same output, same input gradient and same parameter gradients; plus state-dict names, shapes and init ranges."""
from __future__ import annotations
import numpy as np
import pytest
import torch
from tinychad import Tensor, dtypes, nn
from tinychad.nn.state import get_parameters, get_state_dict, load_state_dict

ATOL, RTOL = 1e-4, 1e-4


def copy_weights(ours, theirs: torch.nn.Module) -> None:
  """PyTorch's state_dict into our layer: the names must agree key for key (strict)."""
  load_state_dict(ours, {k: v.detach().numpy() for k, v in theirs.state_dict().items()})


def check_layer(ours, theirs: torch.nn.Module, *inputs: np.ndarray, grad_inputs: bool = True,
                call=lambda layer, *xs: layer(*xs)) -> None:
  """Forward and backward of both layers on the same inputs. `call(layer, *inputs)` runs a layer and returns
  the one tensor to compare (for layers taking tuples or returning several tensors)."""
  copy_weights(ours, theirs)
  x_ours = [Tensor(a, requires_grad=grad_inputs and a.dtype == np.float32) for a in inputs]
  x_theirs = [torch.tensor(a, requires_grad=grad_inputs and a.dtype == np.float32) for a in inputs]
  out_ours, out_theirs = call(ours, *x_ours), call(theirs, *x_theirs)
  np.testing.assert_allclose(out_ours.numpy(), out_theirs.detach().numpy(), atol=ATOL, rtol=RTOL)
  # a random weighting of the outputs, so every output element's gradient matters
  weight = np.random.default_rng(1).standard_normal(out_theirs.shape).astype(np.float32)
  (out_ours * Tensor(weight)).sum().backward()
  (out_theirs * torch.tensor(weight)).sum().backward()
  for xo, xt in zip(x_ours, x_theirs):
    if not xt.requires_grad: continue
    # an input the output doesn't depend on may get no gradient at all (None), in either framework
    grad_ours = xo.grad.numpy() if xo.grad is not None else 0
    np.testing.assert_allclose(grad_ours, xt.grad.numpy() if xt.grad is not None else 0, atol=ATOL, rtol=RTOL)
  ours_sd = get_state_dict(ours)
  for name, p in theirs.named_parameters():
    if p.grad is None:  # the compared output does not depend on this parameter
      assert ours_sd[name].grad is None or not ours_sd[name].grad.numpy().any(), name
      continue
    assert ours_sd[name].grad is not None, f"{name} got no gradient"
    np.testing.assert_allclose(ours_sd[name].grad.numpy(), p.grad.numpy(), atol=ATOL, rtol=RTOL, err_msg=name)


def randn(*shape: int) -> np.ndarray: return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def test_linear():
  check_layer(nn.Linear(7, 5), torch.nn.Linear(7, 5), randn(3, 7))
  check_layer(nn.Linear(7, 5, bias=False), torch.nn.Linear(7, 5, bias=False), randn(2, 3, 7))


@pytest.mark.parametrize("kwargs", [{}, {"stride": 2, "padding": 1}, {"groups": 2, "dilation": 2, "padding": "same"}])
def test_conv1d(kwargs):
  check_layer(nn.Conv1d(4, 6, 3, **kwargs), torch.nn.Conv1d(4, 6, 3, **kwargs), randn(2, 4, 11))


@pytest.mark.parametrize("kwargs", [{}, {"stride": 2, "padding": 1}, {"groups": 2, "bias": False}])
def test_conv2d(kwargs):
  check_layer(nn.Conv2d(4, 6, (3, 2), **kwargs), torch.nn.Conv2d(4, 6, (3, 2), **kwargs), randn(2, 4, 9, 8))


@pytest.mark.parametrize("kwargs", [{}, {"stride": 2, "padding": 1, "output_padding": 1}])
def test_conv_transpose2d(kwargs):
  check_layer(nn.ConvTranspose2d(4, 3, 3, **kwargs), torch.nn.ConvTranspose2d(4, 3, 3, **kwargs), randn(2, 4, 5, 5))


@pytest.mark.parametrize("ours,theirs,shape", [(nn.BatchNorm1d, torch.nn.BatchNorm1d, (6, 4)),
                                               (nn.BatchNorm1d, torch.nn.BatchNorm1d, (6, 4, 5)),
                                               (nn.BatchNorm2d, torch.nn.BatchNorm2d, (3, 4, 5, 5))])
def test_batchnorm_train_then_eval(ours, theirs, shape):
  a, b = ours(4), theirs(4)
  try:
    nn.train()
    b.train()
    check_layer(a, b, randn(*shape))
    # a second batch: the running statistics follow PyTorch's momentum update, unbiased variance and counter
    a(Tensor(randn(*shape) * 2 + 1))
    b(torch.tensor(randn(*shape) * 2 + 1))
    for name in ("running_mean", "running_var", "num_batches_tracked"):
      np.testing.assert_allclose(getattr(a, name).numpy(), getattr(b, name).numpy(), atol=1e-5, rtol=1e-5, err_msg=name)
  finally:
    nn.eval()
  b.eval()
  np.testing.assert_allclose(a(Tensor(randn(*shape))).numpy(), b(torch.tensor(randn(*shape))).detach().numpy(), atol=ATOL, rtol=RTOL)


def test_batchnorm_cumulative_momentum_and_module_switches():
  a, b = nn.BatchNorm1d(3, momentum=None), torch.nn.BatchNorm1d(3, momentum=None)
  assert a.train() is a and Tensor.training
  for i in range(3):
    a(Tensor(randn(5, 3) + i))
    b(torch.tensor(randn(5, 3) + i))
  a.eval()
  assert not Tensor.training
  np.testing.assert_allclose(a.running_mean.numpy(), b.running_mean.numpy(), atol=1e-6)
  np.testing.assert_allclose(a.running_var.numpy(), b.running_var.numpy(), atol=1e-6)
  assert [t.requires_grad for t in (a.running_mean, a.running_var)] == [False, False]
  assert len(get_parameters(a)) == 2  # weight and bias only: running stats are not trained


def test_layernorm():
  check_layer(nn.LayerNorm(6), torch.nn.LayerNorm(6), randn(3, 6))
  check_layer(nn.LayerNorm((4, 6), elementwise_affine=True, bias=False), torch.nn.LayerNorm((4, 6), bias=False), randn(2, 4, 6))


def test_groupnorm():
  check_layer(nn.GroupNorm(2, 6), torch.nn.GroupNorm(2, 6), randn(3, 6, 4, 4))
  check_layer(nn.GroupNorm(3, 6, affine=False), torch.nn.GroupNorm(3, 6, affine=False), randn(3, 6, 5))


def test_rmsnorm():
  check_layer(nn.RMSNorm(6), torch.nn.RMSNorm(6), randn(3, 6))
  check_layer(nn.RMSNorm((2, 6), eps=1e-3), torch.nn.RMSNorm((2, 6), eps=1e-3), randn(3, 2, 6))


def test_embedding():
  idx = np.array([[0, 3, 3], [9, 1, 0]], dtype=np.int64)
  check_layer(nn.Embedding(10, 4), torch.nn.Embedding(10, 4), idx, grad_inputs=False)
  a, b = nn.Embedding(10, 4, padding_idx=3), torch.nn.Embedding(10, 4, padding_idx=3)
  assert np.all(a.weight.numpy()[3] == 0)
  check_layer(a, b, idx, grad_inputs=False)
  assert np.all(a.weight.grad.numpy()[3] == 0)


def test_dropout():
  x = Tensor.ones(200, 100)
  assert (nn.Dropout(0.3)(x).numpy() == 1).all()  # eval: identity
  try:
    nn.train()
    out = nn.Dropout(0.3)(x).numpy()
  finally:
    nn.eval()
  kept = out != 0
  assert abs(kept.mean() - 0.7) < 0.02
  np.testing.assert_allclose(out[kept], 1 / 0.7, rtol=1e-6)
  with pytest.raises(ValueError, match="p must be in"): nn.Dropout(1.5)


def test_lstm_cell():
  # h' and c' both matter: compare a mix of the two, so both paths of the gradient are checked
  check_layer(nn.LSTMCell(5, 4), torch.nn.LSTMCell(5, 4), randn(3, 5), randn(3, 4) * 0.5, randn(3, 4) * 0.5,
              call=lambda cell, x, h, c: (lambda hc: hc[0] * 2 + hc[1])(cell(x, (h, c))))
  check_layer(nn.LSTMCell(5, 4, bias=False), torch.nn.LSTMCell(5, 4, bias=False), randn(3, 5), call=lambda cell, x: cell(x)[0])


@pytest.mark.parametrize("kwargs", [{}, {"num_layers": 2, "batch_first": True}, {"bidirectional": True, "num_layers": 2}])
def test_lstm(kwargs):
  shape = (2, 4, 3) if kwargs.get("batch_first") else (4, 2, 3)
  check_layer(nn.LSTM(3, 5, **kwargs), torch.nn.LSTM(3, 5, **kwargs), randn(*shape), call=lambda lstm, x: lstm(x)[0])
  # the final states, given initial ones
  directions = 2 if kwargs.get("bidirectional") else 1
  h0 = randn(kwargs.get("num_layers", 1) * directions, 2, 5) * 0.5
  check_layer(nn.LSTM(3, 5, **kwargs), torch.nn.LSTM(3, 5, **kwargs), randn(*shape), h0, h0 + 0.1,
              call=lambda lstm, x, h, c: (lambda out: out[1][0] + 3 * out[1][1])(lstm(x, (h, c))))


def test_lstm_long_sequence():
  """150 steps: the backward graph is thousands of ops deep, which the scheduler walks without recursion."""
  check_layer(nn.LSTM(3, 4), torch.nn.LSTM(3, 4), randn(150, 2, 3) * 0.5, call=lambda lstm, x: lstm(x)[0])


def test_lstm_unbatched_and_names():
  check_layer(nn.LSTM(3, 4), torch.nn.LSTM(3, 4), randn(6, 3), call=lambda lstm, x: lstm(x)[0])
  names = list(get_state_dict(nn.LSTM(3, 4, num_layers=2, bidirectional=True)))
  assert names == list(torch.nn.LSTM(3, 4, num_layers=2, bidirectional=True).state_dict())


@pytest.mark.parametrize("batch_first", [False, True])
def test_multihead_attention(batch_first):
  q, kv = randn(4, 2, 8), randn(5, 2, 8) * 0.7
  if batch_first: q, kv = q.transpose(1, 0, 2).copy(), kv.transpose(1, 0, 2).copy()
  make = lambda lib: lib.MultiheadAttention(8, 2, batch_first=batch_first)  # noqa: E731
  check_layer(make(nn), make(torch.nn), q, kv, kv + 0.3, call=lambda mha, q, k, v: mha(q, k, v)[0])
  check_layer(make(nn), make(torch.nn), q, kv, kv, call=lambda mha, q, k, v: mha(q, k, v)[1])
  # self-attention, one tensor as query, key and value: the packed projection (one matmul 3E wide), both paths
  for need_weights in (True, False):
    check_layer(make(nn), make(torch.nn), q, call=lambda mha, x: mha(x, x, x, need_weights=need_weights)[0])
  # a boolean attention mask and a key padding mask: True means "may not attend", as in PyTorch
  attn_mask = np.triu(np.ones((4, 5), dtype=bool), 2)
  padding = np.array([[False] * 4 + [True], [False] * 5])
  check_layer(make(nn), make(torch.nn), q, kv, kv,
              call=lambda mha, q, k, v: mha(q, k, v, attn_mask=type(q)(attn_mask), key_padding_mask=type(q)(padding))[0]
              if isinstance(q, Tensor) else mha(q, k, v, attn_mask=torch.tensor(attn_mask), key_padding_mask=torch.tensor(padding))[0])


def test_multihead_attention_self_causal_per_head_weights():
  x = randn(3, 1, 6)
  ours, theirs = nn.MultiheadAttention(6, 3), torch.nn.MultiheadAttention(6, 3)
  copy_weights(ours, theirs)
  mask = np.triu(np.ones((3, 3), dtype=bool), 1)
  out_o, w_o = ours(Tensor(x), Tensor(x), Tensor(x), attn_mask=Tensor(mask), average_attn_weights=False)
  out_t, w_t = theirs(torch.tensor(x), torch.tensor(x), torch.tensor(x), attn_mask=torch.tensor(mask), average_attn_weights=False)
  np.testing.assert_allclose(out_o.numpy(), out_t.detach().numpy(), atol=ATOL)
  np.testing.assert_allclose(w_o.numpy(), w_t.detach().numpy(), atol=ATOL)
  out_c, _ = ours(Tensor(x), Tensor(x), Tensor(x), is_causal=True, need_weights=False)
  np.testing.assert_allclose(out_c.numpy(), out_t.detach().numpy(), atol=ATOL)


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")   # PyTorch still runs mixed kinds
@pytest.mark.parametrize("masks", ["float 3-d attn_mask + float padding", "bool attn_mask + float padding",
                                   "is_causal with its attn_mask"])
def test_multihead_attention_masks_match_pytorch(masks):
  """Each mask kind MultiheadAttention hands to scaled_dot_product_attention (bool ones inverted, mixed
  kinds added), output and per-head weights against PyTorch, batch_first."""
  rng = np.random.default_rng(4)
  x, kv = randn(2, 3, 8), randn(2, 4, 8) * 0.5
  causal = np.triu(np.ones((3, 4), dtype=bool), 1)
  padding = np.array([[False, False, False, True], [False, False, False, False]])
  float_mask = rng.standard_normal((2 * 2, 3, 4)).astype(np.float32)      # (N * heads, L, S)
  float_padding = rng.standard_normal((2, 4)).astype(np.float32)
  kwargs = {"float 3-d attn_mask + float padding":
            dict(attn_mask=float_mask, key_padding_mask=np.where(padding, -1e9, float_padding).astype(np.float32)),
            "bool attn_mask + float padding": dict(attn_mask=causal, key_padding_mask=float_padding),
            "is_causal with its attn_mask": dict(attn_mask=causal, is_causal=True)}[masks]
  ours, theirs = nn.MultiheadAttention(8, 2, batch_first=True), torch.nn.MultiheadAttention(8, 2, batch_first=True)
  copy_weights(ours, theirs)
  wrap = lambda lib, kw: {k: (lib(v) if isinstance(v, np.ndarray) else v) for k, v in kw.items()}  # noqa: E731
  out_o, w_o = ours(Tensor(x), Tensor(kv), Tensor(kv), average_attn_weights=False, **wrap(Tensor, kwargs))
  out_t, w_t = theirs(torch.tensor(x), torch.tensor(kv), torch.tensor(kv), average_attn_weights=False,
                      **wrap(torch.tensor, kwargs))
  np.testing.assert_allclose(out_o.numpy(), out_t.detach().numpy(), atol=ATOL, rtol=RTOL)
  np.testing.assert_allclose(w_o.numpy(), w_t.detach().numpy(), atol=ATOL, rtol=RTOL)


def test_sequential_names_and_call():
  ours = nn.Sequential(nn.Linear(4, 8), Tensor.relu, nn.Linear(8, 3))
  theirs = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
  assert list(get_state_dict(ours)) == list(theirs.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
  check_layer(ours, theirs, randn(5, 4))
  assert len(ours.parameters()) == 4


@pytest.mark.parametrize("ours,theirs", [
  (lambda: nn.Linear(30, 20), lambda: torch.nn.Linear(30, 20)),
  (lambda: nn.Conv2d(6, 8, 3, groups=2), lambda: torch.nn.Conv2d(6, 8, 3, groups=2)),
  (lambda: nn.ConvTranspose2d(6, 8, 3), lambda: torch.nn.ConvTranspose2d(6, 8, 3)),
  (lambda: nn.LSTM(7, 9, num_layers=2), lambda: torch.nn.LSTM(7, 9, num_layers=2)),
  (lambda: nn.MultiheadAttention(12, 3), lambda: torch.nn.MultiheadAttention(12, 3)),
  (lambda: nn.Embedding(50, 6), lambda: torch.nn.Embedding(50, 6)),
  (lambda: nn.BatchNorm2d(5), lambda: torch.nn.BatchNorm2d(5)),
])
def test_init_shapes_and_ranges_match_pytorch(ours, theirs):
  """Same names, shapes and dtypes as PyTorch, and values spread over the same range (the 90th percentile
  of |w| and the std within 25%; constants equal). Not max |w|: for a normal init (Embedding) the max of a
  few hundred draws moves by 30% between seeds, which made this test fail at random."""
  Tensor.manual_seed(0)
  torch.manual_seed(0)
  a, b = get_state_dict(ours()), theirs().state_dict()
  assert list(a) == list(b)
  for name, tb in b.items():
    ta = a[name].numpy()
    assert ta.shape == tuple(tb.shape), name
    assert ta.dtype == tb.numpy().dtype, name
    if tb.numel() == 1 or (tb == tb.flatten()[0]).all():  # constants (norm weights, running stats, zero biases)
      np.testing.assert_array_equal(ta, tb.numpy(), err_msg=name)
    elif ta.size >= 100:  # enough samples for max and std to be stable
      assert abs(np.quantile(np.abs(ta), 0.9) / np.quantile(tb.abs().numpy(), 0.9) - 1) < 0.25, name
      assert abs(ta.std() / tb.float().std().item() - 1) < 0.25, name
    else:
      assert ta.std() > 0, name


def test_errors_name_the_problem():
  with pytest.raises(ValueError, match="expects 4"): nn.Linear(4, 2)(Tensor.zeros(3, 5))
  with pytest.raises(ValueError, match="3 channels, expected 4"): nn.BatchNorm2d(4)(Tensor.zeros(2, 3, 5, 5))
  with pytest.raises(ValueError, match="4-d input"): nn.BatchNorm2d(4)(Tensor.zeros(2, 4))
  with pytest.raises(ValueError, match="divide by num_heads"): nn.MultiheadAttention(10, 3)
  with pytest.raises(TypeError, match="integers"): nn.Embedding(4, 2)(Tensor([0.5]))
  assert nn.Embedding(4, 2)(Tensor([1, 2], dtype=dtypes.int32)).shape == (2, 2)


# ---- issue 23: layers with PyTorch's names, on every device ----
LAYERS = [
  (lambda: nn.ReLU(), lambda: torch.nn.ReLU(), (3, 5)),
  (lambda: nn.GELU(), lambda: torch.nn.GELU(), (3, 5)),
  (lambda: nn.GELU("tanh"), lambda: torch.nn.GELU("tanh"), (3, 5)),
  (lambda: nn.SiLU(), lambda: torch.nn.SiLU(), (3, 5)),
  (lambda: nn.Tanh(), lambda: torch.nn.Tanh(), (3, 5)),
  (lambda: nn.Sigmoid(), lambda: torch.nn.Sigmoid(), (3, 5)),
  (lambda: nn.LeakyReLU(0.2), lambda: torch.nn.LeakyReLU(0.2), (3, 5)),
  (lambda: nn.Softmax(dim=1), lambda: torch.nn.Softmax(dim=1), (3, 5)),
  (lambda: nn.LogSoftmax(dim=0), lambda: torch.nn.LogSoftmax(dim=0), (3, 5)),
  (lambda: nn.Identity(54, unused=1), lambda: torch.nn.Identity(54, unused=1), (3, 5)),
  (lambda: nn.Flatten(), lambda: torch.nn.Flatten(), (2, 3, 4, 5)),
  (lambda: nn.Flatten(0, 2), lambda: torch.nn.Flatten(0, 2), (2, 3, 4, 5)),
  (lambda: nn.Unflatten(1, (3, 4)), lambda: torch.nn.Unflatten(1, (3, 4)), (2, 12, 5)),
  (lambda: nn.MaxPool2d(2), lambda: torch.nn.MaxPool2d(2), (2, 3, 6, 7)),
  (lambda: nn.MaxPool2d(3, 2, 1), lambda: torch.nn.MaxPool2d(3, 2, 1), (2, 3, 6, 7)),
  (lambda: nn.AvgPool2d(2), lambda: torch.nn.AvgPool2d(2), (2, 3, 6, 7)),
  (lambda: nn.AvgPool2d(3, 1, 1, count_include_pad=False), lambda: torch.nn.AvgPool2d(3, 1, 1, count_include_pad=False), (2, 3, 6, 7)),
  (lambda: nn.AdaptiveAvgPool2d((1, 1)), lambda: torch.nn.AdaptiveAvgPool2d((1, 1)), (2, 3, 6, 7)),
  (lambda: nn.AdaptiveAvgPool2d(4), lambda: torch.nn.AdaptiveAvgPool2d(4), (2, 3, 6, 7)),
  (lambda: nn.ConvTranspose1d(4, 3, 3), lambda: torch.nn.ConvTranspose1d(4, 3, 3), (2, 4, 7)),
  (lambda: nn.ConvTranspose1d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
   lambda: torch.nn.ConvTranspose1d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2), (2, 4, 7)),
  (lambda: nn.Upsample(scale_factor=2), lambda: torch.nn.Upsample(scale_factor=2), (2, 3, 4, 5)),
  (lambda: nn.Upsample(size=(7, 9), mode="bilinear", align_corners=True),
   lambda: torch.nn.Upsample(size=(7, 9), mode="bilinear", align_corners=True), (2, 3, 4, 5)),
  (lambda: nn.PixelShuffle(2), lambda: torch.nn.PixelShuffle(2), (2, 8, 3, 4)),
  (lambda: nn.MaxPool2d(3, 2, 1, ceil_mode=True), lambda: torch.nn.MaxPool2d(3, 2, 1, ceil_mode=True), (2, 3, 6, 7)),
  (lambda: nn.AvgPool2d(2, ceil_mode=True), lambda: torch.nn.AvgPool2d(2, ceil_mode=True), (2, 3, 5, 7)),
  (lambda: nn.MaxPool1d(2, ceil_mode=True), lambda: torch.nn.MaxPool1d(2, ceil_mode=True), (2, 3, 7)),
  (lambda: nn.AvgPool1d(3, 2, 1), lambda: torch.nn.AvgPool1d(3, 2, 1), (2, 3, 7)),
  (lambda: nn.Unfold(2, padding=1), lambda: torch.nn.Unfold(2, padding=1), (2, 3, 4, 5)),
  (lambda: nn.ReLU6(), lambda: torch.nn.ReLU6(), (3, 5)),
  (lambda: nn.ELU(0.5), lambda: torch.nn.ELU(0.5), (3, 5)),
  (lambda: nn.Softplus(2.0), lambda: torch.nn.Softplus(2.0), (3, 5)),
  (lambda: nn.Mish(), lambda: torch.nn.Mish(), (3, 5)),
  (lambda: nn.Hardswish(), lambda: torch.nn.Hardswish(), (3, 5)),
  (lambda: nn.LogSigmoid(), lambda: torch.nn.LogSigmoid(), (3, 5)),
  (lambda: nn.Softsign(), lambda: torch.nn.Softsign(), (3, 5)),
  (lambda: nn.GLU(), lambda: torch.nn.GLU(), (3, 6)),
]


@pytest.mark.usefixtures("each_device")
@pytest.mark.parametrize("ours, theirs, shape", LAYERS, ids=[f"{i}" for i in range(len(LAYERS))])
def test_pytorch_named_layers(ours, theirs, shape):
  torch.manual_seed(0)
  check_layer(ours(), theirs(), randn(*shape))


@pytest.mark.usefixtures("each_device")
@pytest.mark.parametrize("kwargs", [{}, {"norm_first": True, "activation": "gelu", "batch_first": True}])
def test_transformer_encoder(kwargs):
  torch.manual_seed(0)
  ours = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, **kwargs), 2, norm=nn.LayerNorm(8))
  theirs = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, **kwargs), 2,
                                       norm=torch.nn.LayerNorm(8), enable_nested_tensor=False)
  assert list(get_state_dict(ours)) == list(theirs.state_dict())
  # the copies start equal, as PyTorch's deep copies do
  np.testing.assert_array_equal(ours.layers[0].linear1.weight.numpy(), ours.layers[1].linear1.weight.numpy())
  mask = np.triu(np.full((5, 5), -np.inf, dtype=np.float32), 1)
  x = randn(3, 5, 8) if kwargs.get("batch_first") else randn(5, 3, 8)   # sequence length 5 either way
  check_layer(ours, theirs, x, call=lambda layer, x: layer(x, mask=type(x)(mask)))


# ---- issue 23: nn.Module habits ----
class Block(nn.Module):
  def __init__(self):
    super().__init__()
    self.fc = nn.Linear(4, 4)
    self.drop = nn.Dropout(0.5)
    self.bn = nn.BatchNorm1d(4)
  def forward(self, x): return self.drop(self.bn(self.fc(x)).relu())


class TorchBlock(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.fc = torch.nn.Linear(4, 4)
    self.drop = torch.nn.Dropout(0.5)
    self.bn = torch.nn.BatchNorm1d(4)
  def forward(self, x): return self.drop(self.bn(self.fc(x)).relu())


class Model(nn.Module):
  def __init__(self):
    super().__init__()
    self.body = nn.ModuleList([Block(), Block()])
    self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 3)})
    self.scale = nn.Parameter(Tensor.ones(1))
    self.register_buffer("offset", Tensor.zeros(4))
    self.register_buffer("scratch", Tensor.zeros(4), persistent=False)
  def forward(self, x):
    for block in self.body: x = block(x) + self.offset
    return self.heads["a"](x) * self.scale, self.heads["b"](x)


class TorchModel(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.body = torch.nn.ModuleList([TorchBlock(), TorchBlock()])
    self.heads = torch.nn.ModuleDict({"a": torch.nn.Linear(4, 2), "b": torch.nn.Linear(4, 3)})
    self.scale = torch.nn.Parameter(torch.ones(1))
    self.register_buffer("offset", torch.zeros(4))
    self.register_buffer("scratch", torch.zeros(4), persistent=False)


def test_module_names_match_pytorch():
  ours, theirs = Model(), TorchModel()
  assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
  assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()]
  assert [n for n, _ in ours.named_modules()] == [n for n, _ in theirs.named_modules()]
  assert [type(m).__name__ for m in ours.children()] == [type(m).__name__ for m in theirs.children()]
  assert list(ours.state_dict()) == list(theirs.state_dict())   # no "scratch": not persistent
  ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})  # strict: doesn't expect "scratch"
  assert isinstance(ours.scale, nn.Parameter) and ours.scale.requires_grad
  assert all(t.requires_grad is False for t in ours.buffers())


def test_module_call_runs_forward_and_zero_grad_requires_grad():
  model = Model()
  out_a, out_b = model(Tensor.ones(3, 4))
  assert out_a.shape == (3, 2) and out_b.shape == (3, 3)
  (out_a.sum() + out_b.sum()).backward()
  assert all(p.grad is not None for p in model.parameters())
  model.zero_grad()
  assert all(p.grad is None for p in model.parameters())
  model.body.requires_grad_(False)
  assert len(get_parameters(model)) == 5 and len(model.parameters()) == 13  # frozen ones stay parameters
  model.requires_grad_()
  assert len(get_parameters(model)) == 13
  with pytest.raises(NotImplementedError, match="forward"): nn.Module()(Tensor.ones(1))


def test_module_to_dtype_keeps_identity():
  model = Model()
  weight = model.heads["a"].weight
  assert model.double() is model and weight.dtype == dtypes.float64 and model.offset.dtype == dtypes.float64
  assert model.body[0].bn.num_batches_tracked.dtype == dtypes.int64   # integers keep their dtype, as PyTorch
  assert model.heads["a"].weight is weight
  assert model(Tensor.ones(2, 4, dtype=dtypes.float64))[0].dtype == dtypes.float64
  assert model.half().offset.dtype == dtypes.float16 and model.float().offset.dtype == dtypes.float32


def test_train_eval_per_module():
  model = Model()
  previous = Tensor.training
  try:
    model.body.eval()
    model.heads.train()
    assert not model.body[0].training and not model.body[1].drop.training and model.heads["a"].training
    x = Tensor.ones(8, 4)
    np.testing.assert_array_equal(model.body[0].drop(x).numpy(), x.numpy())   # eval: no dropout
    model.train()
    assert all(m.training for m in model.modules())
    assert (model.body[0].drop(Tensor.ones(200, 50)).numpy() == 0).mean() > 0.4
    model.eval()
    assert not any(m.training for m in model.modules()) and not Tensor.training
    # a module no train()/eval() has reached follows the global Tensor.training, as before
    fresh = nn.Dropout(0.5)
    Tensor.training = True
    assert fresh.training and (fresh(Tensor.ones(100, 10)).numpy() == 0).any()
    Tensor.training = False
    assert not fresh.training
  finally:
    Tensor.training = previous


def test_maxpool_return_indices_module():
  x = randn(2, 3, 6, 7)
  values, indices = nn.MaxPool2d(2, return_indices=True)(Tensor(x))
  want_values, want_indices = torch.nn.MaxPool2d(2, return_indices=True)(torch.tensor(x))
  np.testing.assert_array_equal(values.numpy(), want_values.numpy())
  np.testing.assert_array_equal(indices.numpy(), want_indices.numpy())
