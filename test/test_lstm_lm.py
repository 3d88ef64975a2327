"""models/lstm.py against a PyTorch twin (nn.Embedding -> nn.LSTM(batch_first) -> nn.Linear, same names and
weights): logits, loss, final state and every gradient; generation carries the state (greedy equals recomputing
the whole sequence) and replays under TinyJit without scheduling kernels."""
from __future__ import annotations
import numpy as np
import pytest
import torch
import torch.nn as tnn
from tinychad import GlobalCounters, Tensor
from tinychad.models.lstm import LSTMLanguageModel

VOCAB, EMBED, HIDDEN, LAYERS = 13, 8, 16, 2


class TorchLM(tnn.Module):
  def __init__(self):
    super().__init__()
    self.embedding = tnn.Embedding(VOCAB, EMBED)
    self.lstm = tnn.LSTM(EMBED, HIDDEN, LAYERS, batch_first=True)
    self.head = tnn.Linear(HIDDEN, VOCAB)

  def forward(self, idx, targets):
    out, state = self.lstm(self.embedding(idx))
    logits = self.head(out)
    return logits, tnn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()), state


def twins() -> tuple[LSTMLanguageModel, TorchLM]:
  torch.manual_seed(0)
  reference = TorchLM()
  model = LSTMLanguageModel(VOCAB, EMBED, HIDDEN, LAYERS)
  model.load_state_dict({k: v.detach().numpy() for k, v in reference.state_dict().items()})
  return model, reference


def test_logits_loss_state_and_gradients_match_pytorch():
  model, reference = twins()
  assert list(model.state_dict()) == list(reference.state_dict())
  rng = np.random.default_rng(0)
  idx, targets = rng.integers(0, VOCAB, (3, 7)), rng.integers(0, VOCAB, (3, 7))
  logits, loss, (h, c) = model(Tensor(idx), Tensor(targets))
  t_logits, t_loss, (t_h, t_c) = reference(torch.tensor(idx), torch.tensor(targets))
  np.testing.assert_allclose(logits.numpy(), t_logits.detach().numpy(), atol=1e-5, rtol=1e-4)
  np.testing.assert_allclose(loss.item(), t_loss.item(), rtol=1e-5)
  np.testing.assert_allclose(h.numpy(), t_h.detach().numpy(), atol=1e-5)
  np.testing.assert_allclose(c.numpy(), t_c.detach().numpy(), atol=1e-5)
  loss.backward()
  t_loss.backward()
  ours = dict(model.named_parameters())
  for name, p in reference.named_parameters():
    np.testing.assert_allclose(ours[name].grad.numpy(), p.grad.numpy(), atol=1e-5, rtol=1e-4, err_msg=name)


def test_generation_carries_the_state():
  model, _ = twins()
  prompt = np.array([[1, 5, 2], [7, 7, 0]])
  seq = prompt
  for _ in range(9):
    logits = model(Tensor(seq))[0].numpy()
    seq = np.concatenate([seq, logits[:, -1].argmax(-1)[:, None]], 1)
  np.testing.assert_array_equal(model.generate(Tensor(prompt), 9, greedy=True).numpy(), seq)
  Tensor.manual_seed(0)
  sampled = model.generate(Tensor(prompt), 9, temperature=1.0, top_k=4).numpy()
  assert sampled.shape == (2, 12) and (sampled[:, :3] == prompt).all() and sampled.max() < VOCAB


def test_the_generation_step_replays_without_scheduling():
  model, _ = twins()
  step = model._step(dict(temperature=1.0, top_k=None, top_p=None))
  token = Tensor(np.array([[3]]))
  h, c = (Tensor.zeros(LAYERS, 1, HIDDEN).contiguous().realize() for _ in range(2))
  for _ in range(3): token, h, c = step(token, h, c)
  GlobalCounters.reset()
  for _ in range(20): token, h, c = step(token, h, c)
  token.numpy()
  assert GlobalCounters.kernel_count == 0


def test_bad_input():
  model, _ = twins()
  with pytest.raises(TypeError, match="integers"): model(Tensor.ones(2, 3))
  with pytest.raises(ValueError, match="tied weights"): LSTMLanguageModel(VOCAB, 8, 16, tie_weights=True)
