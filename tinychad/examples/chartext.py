"""What the text examples share: a character vocabulary over a text file, batches of it, a training loop.

in: a text file (default: pydoc_data/topics.py, the ~750 KB of Python's own help topics, which ships with Python)
out: CharData (encode / decode, train and validation ids), random (x, y) batches of block_size characters
     (y is x shifted by one), and train_lm: AdamW steps of a language model under TinyJit with a tqdm bar,
     validation loss every so often, the curve as a PNG and the weights as safetensors.
A language model here is a module whose call (idx, targets) returns (logits, loss, ...): models.GPT and
models.LSTMLanguageModel both do.
"""
from __future__ import annotations
import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
import numpy as np
from tqdm import tqdm
from tinychad import Tensor, TinyJit, no_grad
from tinychad.nn.optim import AdamW
from tinychad.nn.state import get_parameters, get_state_dict, safe_save


def default_text() -> Path:
  import pydoc_data.topics
  return Path(pydoc_data.topics.__file__)


class CharData:
  """The characters of a file as ids (vocabulary: the sorted distinct characters); the last `val_fraction`
  of the text is held out for validation."""
  def __init__(self, path: str | Path | None = None, val_fraction: float = 0.1, limit: int | None = None):
    self.path = Path(path) if path is not None else default_text()
    text = self.path.read_text(encoding="utf-8")[:limit]
    if len(text) < 100: raise ValueError(f"{self.path}: {len(text)} characters is too little text to train on")
    self.chars = sorted(set(text))
    self.index = {c: i for i, c in enumerate(self.chars)}
    ids = np.array([self.index[c] for c in text], dtype=np.int64)
    cut = int(len(ids) * (1 - val_fraction))
    self.train, self.val = ids[:cut], ids[cut:]

  @property
  def vocab_size(self) -> int: return len(self.chars)

  def encode(self, text: str) -> list[int]:
    """Ids of text's characters; characters the training text never had are left out (a prompt may have them)."""
    return [self.index[c] for c in text if c in self.index]
  def decode(self, ids) -> str: return "".join(self.chars[int(i)] for i in ids)

  def batch(self, split: str, batch_size: int, block_size: int, rng: np.random.Generator) -> tuple[Tensor, Tensor]:
    """batch_size random windows of block_size characters and the characters one step later."""
    ids = self.train if split == "train" else self.val
    starts = rng.integers(0, len(ids) - block_size - 1, batch_size)
    x = np.stack([ids[s:s + block_size] for s in starts])
    y = np.stack([ids[s + 1:s + block_size + 1] for s in starts])
    return Tensor(x), Tensor(y)


def add_training_flags(parser: argparse.ArgumentParser, steps: int, lr: float, batch_size: int, block_size: int) -> None:
  parser.add_argument("--data", default=None, help="a UTF-8 text file (default: Python's pydoc_data/topics.py)")
  parser.add_argument("--steps", type=int, default=steps)
  parser.add_argument("--batch-size", type=int, default=batch_size)
  parser.add_argument("--block-size", type=int, default=block_size, help="characters per training sequence")
  parser.add_argument("--lr", type=float, default=lr, help="AdamW's learning rate")
  parser.add_argument("--eval-every", type=int, default=100)
  parser.add_argument("--eval-batches", type=int, default=8)
  parser.add_argument("--limit", type=int, default=None, help="use only the first N characters of the file")
  parser.add_argument("--save", default=None, help="weights file (.safetensors)")
  parser.add_argument("--plot", default=None, help="loss curve file (.png)")
  parser.add_argument("--samples", type=int, default=2, help="samples printed after training")
  parser.add_argument("--sample-length", type=int, default=200)
  parser.add_argument("--no-jit", dest="jit", action="store_false", help="build each step's graph anew")
  parser.add_argument("--seed", type=int, default=0)


@dataclass
class Curves:
  train: tuple[list[int], list[float]] = field(default_factory=lambda: ([], []))
  val: tuple[list[int], list[float]] = field(default_factory=lambda: ([], []))
  seconds: float = 0.0


def evaluate(model, data: CharData, args: argparse.Namespace, rng: np.random.Generator) -> float:
  """Mean loss over args.eval_batches random validation batches (eval mode, no graph)."""
  model.eval()
  with no_grad():
    losses = [model(*data.batch("val", args.batch_size, args.block_size, rng))[1].item() for _ in range(args.eval_batches)]
  model.train()
  return float(np.mean(losses))


def train_lm(model, data: CharData, args: argparse.Namespace, name: str) -> Curves:
  """AdamW (weight decay 0.01, constant lr) on random training windows, the step replayed by TinyJit. The lr is
  constant because TinyJit records a step afresh whenever a Python number it can see changes, and the optimizer
  keeps the last lr it was given as one. Validation loss every args.eval_every steps and at the end; the curve
  goes to args.plot, the weights to args.save."""
  opt = AdamW(get_parameters(model), lr=args.lr)
  rng, val_rng = np.random.default_rng(args.seed), np.random.default_rng(args.seed + 1)

  def step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    loss = model(x, y)[1]
    loss.backward()
    opt.step()
    return loss.realize()

  train_step = TinyJit(step) if args.jit else step
  curves, start = Curves(), time.perf_counter()
  model.train()
  with tqdm(range(args.steps), desc=f"train {name}", unit="step") as bar:
    for i in bar:
      loss = train_step(*data.batch("train", args.batch_size, args.block_size, rng)).item()
      curves.train[0].append(i)
      curves.train[1].append(loss)
      if (i + 1) % args.eval_every == 0 or i + 1 == args.steps:
        curves.val[0].append(i)
        curves.val[1].append(evaluate(model, data, args, val_rng))
      bar.set_postfix(loss=f"{loss:.3f}", val=f"{curves.val[1][-1]:.3f}" if curves.val[1] else "-")
  curves.seconds = time.perf_counter() - start
  model.eval()
  if args.save:
    safe_save(get_state_dict(model), args.save)
    print(f"weights saved to {args.save}")
  if args.plot:
    from tinychad.examples.plot import save_loss_curve
    save_loss_curve(args.plot, {"train": curves.train, "validation": curves.val}, title=f"{name} on {data.path.name}")
    print(f"loss curve saved to {args.plot}")
  return curves
