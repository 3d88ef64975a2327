"""nn.LSTM's fused recurrence (tinychad/nn/lstm.py): outputs, final states and every gradient against
torch.nn.LSTM with the same weights, eager and TinyJit training giving identical weights, and the number of
kernels one training step schedules per time step."""
from __future__ import annotations
import numpy as np
import pytest
import torch
from conftest import OPENCL_DEVICES
from tinychad import GlobalCounters, Tensor, TinyJit, nn
from tinychad.nn import optim
from tinychad.nn.state import get_parameters, get_state_dict, load_state_dict

ATOL, RTOL = 2e-5, 1e-4


def randn(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def twins(*args, **kwargs) -> tuple[nn.LSTM, torch.nn.LSTM]:
  theirs = torch.nn.LSTM(*args, **kwargs)
  ours = nn.LSTM(*args, **kwargs)
  load_state_dict(ours, {k: v.detach().numpy() for k, v in theirs.state_dict().items()})
  return ours, theirs


CONFIGS = [
  dict(layers=1, batch_first=False, given_state=False, bias=True, bidirectional=False),
  dict(layers=2, batch_first=False, given_state=True, bias=True, bidirectional=False),
  dict(layers=2, batch_first=True, given_state=False, bias=True, bidirectional=False),
  dict(layers=3, batch_first=True, given_state=True, bias=False, bidirectional=False),
  dict(layers=2, batch_first=False, given_state=True, bias=True, bidirectional=True),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_outputs_states_and_every_gradient_match_pytorch(config):
  steps, batch, features, hidden = 7, 3, 5, 6
  directions = 2 if config["bidirectional"] else 1
  ours, theirs = twins(features, hidden, num_layers=config["layers"], bias=config["bias"],
                       batch_first=config["batch_first"], bidirectional=config["bidirectional"])
  x = randn(*((batch, steps, features) if config["batch_first"] else (steps, batch, features)))
  state_shape = (config["layers"] * directions, batch, hidden)
  h0, c0 = randn(*state_shape, seed=1) * 0.5, randn(*state_shape, seed=2) * 0.5
  x_o, h_o, c_o = (Tensor(a, requires_grad=True) for a in (x, h0, c0))
  x_t, h_t, c_t = (torch.tensor(a, requires_grad=True) for a in (x, h0, c0))
  out_o, (hn_o, cn_o) = ours(x_o, (h_o, c_o)) if config["given_state"] else ours(x_o)
  out_t, (hn_t, cn_t) = theirs(x_t, (h_t, c_t)) if config["given_state"] else theirs(x_t)
  for o, t in ((out_o, out_t), (hn_o, hn_t), (cn_o, cn_t)):
    np.testing.assert_allclose(o.numpy(), t.detach().numpy(), atol=ATOL, rtol=RTOL)
  # every output and both final states weighted at random, so each element's gradient path is checked
  weights = [randn(*t.shape, seed=10 + i) for i, t in enumerate((out_t, hn_t, cn_t))]
  sum(((o * Tensor(w)).sum() for o, w in zip((out_o, hn_o, cn_o), weights)), Tensor(0.0)).backward()
  sum((t * torch.tensor(w)).sum() for t, w in zip((out_t, hn_t, cn_t), weights)).backward()
  np.testing.assert_allclose(x_o.grad.numpy(), x_t.grad.numpy(), atol=ATOL, rtol=RTOL, err_msg="x")
  if config["given_state"]:
    np.testing.assert_allclose(h_o.grad.numpy(), h_t.grad.numpy(), atol=ATOL, rtol=RTOL, err_msg="h0")
    np.testing.assert_allclose(c_o.grad.numpy(), c_t.grad.numpy(), atol=ATOL, rtol=RTOL, err_msg="c0")
  ours_sd = get_state_dict(ours)
  for name, p in theirs.named_parameters():
    np.testing.assert_allclose(ours_sd[name].grad.numpy(), p.grad.numpy(), atol=ATOL, rtol=RTOL, err_msg=name)


def test_one_step_and_unbatched_match_pytorch():
  ours, theirs = twins(4, 3)
  x = randn(1, 2, 4)
  out_o, (hn_o, cn_o) = ours(Tensor(x))
  out_t, (hn_t, cn_t) = theirs(torch.tensor(x))
  np.testing.assert_allclose(out_o.numpy(), out_t.detach().numpy(), atol=ATOL, rtol=RTOL)
  np.testing.assert_allclose(cn_o.numpy(), cn_t.detach().numpy(), atol=ATOL, rtol=RTOL)
  h0 = randn(1, 3, seed=3)
  out_o, (hn_o, _) = ours(Tensor(x[:, 0]), (Tensor(h0), Tensor(h0)))
  out_t, (hn_t, _) = theirs(torch.tensor(x[:, 0]), (torch.tensor(h0), torch.tensor(h0)))
  assert out_o.shape == tuple(out_t.shape) and hn_o.shape == tuple(hn_t.shape) == (1, 3)
  np.testing.assert_allclose(out_o.numpy(), out_t.detach().numpy(), atol=ATOL, rtol=RTOL)


def test_bad_inputs_raise_clear_errors():
  lstm = nn.LSTM(4, 3, num_layers=2)
  with pytest.raises(ValueError, match=r"LSTM: input of shape \(5, 2, 7\)"): lstm(Tensor.zeros(5, 2, 7))
  with pytest.raises(ValueError, match=r"LSTM: h has shape \(1, 2, 3\), expected \(2, 2, 3\)"):
    lstm(Tensor.zeros(5, 2, 4), (Tensor.zeros(1, 2, 3), Tensor.zeros(2, 2, 3)))
  with pytest.raises(TypeError, match="LSTM: the state must be a tuple"): lstm(Tensor.zeros(5, 2, 4), Tensor.zeros(2, 2, 3))
  with pytest.raises(TypeError, match="floating point"): lstm(Tensor.zeros(5, 2, 4).cast("int32"))
  with pytest.raises(ValueError, match="no time step"): lstm(Tensor.zeros(0, 2, 4))
  with pytest.raises(ValueError, match="hidden_size must be a positive int"): nn.LSTM(4, 0)
  with pytest.raises(ValueError, match="dropout must be in"): nn.LSTM(4, 3, dropout=2.0)
  with pytest.raises(ValueError, match=r"LSTMCell: input of shape \(2, 5\)"): nn.LSTMCell(4, 3)(Tensor.zeros(2, 5))


class LanguageModel:
  """Embedding -> 2-layer LSTM -> Linear, the LSTM language model of bench/models.py, small."""
  def __init__(self, vocab: int, hidden: int):
    self.embed, self.lstm, self.head = nn.Embedding(vocab, hidden), nn.LSTM(hidden, hidden, num_layers=2), nn.Linear(hidden, vocab)

  def __call__(self, tokens: Tensor) -> Tensor: return self.head(self.lstm(self.embed(tokens))[0])


def make_training(steps: int, vocab: int = 11, hidden: int = 8, seed: int = 0):
  Tensor.manual_seed(seed)
  model = LanguageModel(vocab, hidden)
  opt = optim.Adam(get_parameters(model), lr=1e-2)
  rng = np.random.default_rng(seed)
  tokens, targets = (Tensor(rng.integers(0, vocab, (steps, 2)).astype(np.int32)) for _ in range(2))

  def train_step() -> Tensor:
    opt.zero_grad()
    loss = model(tokens).reshape(steps * 2, vocab).cross_entropy(targets.reshape(steps * 2))
    loss.backward()
    opt.step()
    return loss.realize()
  return model, train_step


def test_eager_and_tinyjit_train_identically():
  model_e, step_e = make_training(6)
  model_j, step_j = make_training(6)
  jitted = TinyJit(step_j)
  for _ in range(4):
    assert step_e().numpy() == jitted().numpy()
  for (name, a), b in zip(get_state_dict(model_e).items(), get_state_dict(model_j).values()):
    np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)


def kernels_of_a_training_step(steps: int) -> int:
  _, train_step = make_training(steps)
  train_step()          # the optimizer's state exists from here on
  GlobalCounters.reset()
  train_step()
  return GlobalCounters.kernel_count


def test_a_training_step_schedules_a_few_kernels_per_time_step():
  """Each time step of each layer is two kernels forward (gates with their activations; c and h) and two
  backward (dh; the gates' gradients with dc); the rest (embedding, head, loss, weight gradients, Adam) does
  not grow with the sequence. 2 layers: 8 kernels per time step. Stacking the steps' states and gradients is
  one kernel each up to 15 steps (function.cat), then ~sqrt(steps) kernels."""
  short, long = kernels_of_a_training_step(6), kernels_of_a_training_step(14)
  assert long - short == 8 * (14 - 6), (short, long)
  assert short <= 8 * 6 + 100, short   # embedding, head, loss and Adam on 11 parameters: ~95 kernels
  assert kernels_of_a_training_step(64) <= 8 * 64 + 100 + 4 * 9, "stacking 65 steps: groups of 9"


def recorded_of_a_training_step(steps: int, monkeypatch) -> int:
  """LazyBuffers a training step records once its graph was scheduled before (the third step: the first two make
  Adam's state)."""
  from tinychad.lazy import LazyBuffer
  _, train_step = make_training(steps)
  for _ in range(3): train_step()
  made = [0]
  init = LazyBuffer.__init__
  def counting(self, *args, **kwargs):
    made[0] += 1
    init(self, *args, **kwargs)
  with monkeypatch.context() as patch:
    patch.setattr(LazyBuffer, "__init__", counting)
    train_step()
  return made[0]


def test_a_training_step_records_the_same_few_ops_for_any_sequence_length(monkeypatch):
  """Each layer's recurrence is one node forward and one backward (LazyBuffer.subgraph), so the ops a step records
  don't grow with the sequence: the time steps' thousands are recorded only when the graph is scheduled anew."""
  short, long = recorded_of_a_training_step(6, monkeypatch), recorded_of_a_training_step(40, monkeypatch)
  assert short == long and short < 800, (short, long)


@pytest.mark.parametrize("device", OPENCL_DEVICES)
def test_training_on_a_gpu_style_device_matches_the_cpu(device):
  """The recurrence's subgraphs built for OPENCL (work-group kernels): the same losses as on the CPU."""
  from tinychad.device import Device
  previous, losses = Device.DEFAULT, {}
  try:
    for name in ("CPU", device):
      Device.DEFAULT = name
      _, train_step = make_training(6)
      losses[name] = [float(train_step().numpy()) for _ in range(3)]
  finally:
    Device.DEFAULT = previous
  np.testing.assert_allclose(losses[device], losses["CPU"], rtol=1e-4)
