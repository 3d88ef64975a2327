"""A character- or word-level LSTM language model on nn.LSTM.

in: token ids (B, T) int (and targets (B, T) to train on)
out: LSTMLanguageModel(vocab)(idx, targets, state) -> (logits (B, T, vocab), loss or None, (h, c));
     model.generate(idx, max_new_tokens, temperature, top_k, top_p, greedy) -> (B, T + max_new_tokens) ids.
embedding -> nn.LSTM (batch_first, num_layers, dropout between layers) -> dropout -> head (Linear to the
vocabulary, tied to the embedding when their sizes agree and tie_weights is set). The same names as PyTorch's
word_language_model example (encoder / rnn / decoder would be its names; here embedding / lstm / head).
Generation carries (h, c) from token to token, so each new token costs one LSTM step; the step (LSTM, head,
sampling) replays under TinyJit after two tokens.
"""
from __future__ import annotations
import numpy as np
from tinychad import nn
from tinychad.engine.jit import TinyJit
from tinychad.models.gpt import sample_logits, sampling_settings
from tinychad.tensor import Tensor, no_grad


class LSTMLanguageModel(nn.Module):
  def __init__(self, vocab_size: int, embed_dim: int = 128, hidden_size: int = 256, num_layers: int = 2,
               dropout: float = 0.0, tie_weights: bool = False):
    if tie_weights and embed_dim != hidden_size:
      raise ValueError(f"LSTMLanguageModel: tied weights need embed_dim == hidden_size, got {embed_dim} and {hidden_size}")
    self.vocab_size, self.hidden_size, self.num_layers = vocab_size, hidden_size, num_layers
    self.embedding = nn.Embedding(vocab_size, embed_dim)
    self.lstm = nn.LSTM(embed_dim, hidden_size, num_layers, batch_first=True, dropout=dropout)
    self.drop = nn.Dropout(dropout)
    self.head = nn.Linear(hidden_size, vocab_size)
    if tie_weights: self.head.weight = self.embedding.weight
    self._steps: dict[tuple, TinyJit] = {}

  def forward(self, idx: Tensor, targets: Tensor | None = None,
              state: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor | None, tuple[Tensor, Tensor]]:
    """idx (B, T) -> (logits (B, T, vocab), mean cross-entropy against targets or None, final (h, c) each
    (num_layers, B, hidden)); `state` continues from a previous call's (h, c) (truncated backpropagation)."""
    if idx.ndim != 2 or idx.dtype.is_float:
      raise TypeError(f"LSTMLanguageModel: idx must be (B, T) integers, got {idx.shape} {idx.dtype}")
    out, state = self.lstm(self.embedding(idx), state)
    logits = self.head(self.drop(out))
    if targets is None: return logits, None, state
    B, T = idx.shape
    return logits, logits.reshape(B * T, -1).cross_entropy(targets.reshape(B * T)), state

  def generate(self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
               top_p: float | None = None, greedy: bool = False) -> Tensor:
    """idx (B, T) -> (B, T + max_new_tokens), each token drawn as GPT.generate draws them (gpt.sample_logits)."""
    if idx.ndim != 2 or idx.shape[1] == 0: raise ValueError(f"generate: idx must be (B, T) with T >= 1, got {idx.shape}")
    if max_new_tokens < 0: raise ValueError(f"generate: max_new_tokens must be >= 0, got {max_new_tokens}")
    if max_new_tokens == 0: return idx
    settings = sampling_settings(temperature, top_k, top_p, greedy, self.vocab_size)
    with no_grad():
      logits, _, (h, c) = self(idx)
      token = sample_logits(logits[:, -1, :], **settings).unsqueeze(1)
      Tensor.realize(token, h, c)
      step, out = self._step(settings), [token.numpy()]
      for _ in range(1, max_new_tokens):
        token, h, c = step(token, h, c)
        out.append(token.numpy())
    return Tensor(np.concatenate([idx.numpy()] + out, axis=1).astype(np.int64), device=idx.device)

  def _step(self, settings: dict) -> TinyJit:
    """One generation step under TinyJit: (token (B, 1), h, c) -> (next token (B, 1), h, c)."""
    key = tuple(sorted(settings.items()))
    if key not in self._steps:
      def step(token: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        logits, _, (h, c) = self(token, state=(h, c))
        return sample_logits(logits[:, -1, :], **settings).unsqueeze(1), h.contiguous(), c.contiguous()
      self._steps[key] = TinyJit(step)
    return self._steps[key]
