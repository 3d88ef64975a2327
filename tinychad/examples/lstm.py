"""Train a character-level LSTM language model on text that ships with Python, then sample from it.

in: a text file (--data; default Python's pydoc_data/topics.py); flags --hidden --layers --embed --dropout,
    --steps --batch-size --block-size --lr --save --plot --seed
out: a tqdm bar (loss, validation loss), the weights as safetensors (lstm_char.safetensors), the loss curve as a PNG
     (lstm_char_loss.png), a line `validation loss 0.97 after 600 steps (N s)` and samples.
Each training window starts from a zero state (no state carried between batches), which keeps every step's
shapes equal so TinyJit replays it. README's "Text models" section has the default run's numbers.
  python -m tinychad.examples.lstm
  python -m tinychad.examples.lstm --hidden 512 --layers 2 --steps 2000
"""
from __future__ import annotations
import argparse
import math
from tinychad import Tensor
from tinychad.examples.chartext import CharData, add_training_flags, train_lm
from tinychad.models.lstm import LSTMLanguageModel


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add_training_flags(parser, steps=600, lr=3e-3, batch_size=16, block_size=64)
  parser.add_argument("--embed", type=int, default=64)
  parser.add_argument("--hidden", type=int, default=256)
  parser.add_argument("--layers", type=int, default=2)
  parser.add_argument("--dropout", type=float, default=0.0)
  parser.add_argument("--temperature", type=float, default=0.8)
  parser.add_argument("--top-k", type=int, default=None)
  parser.add_argument("--top-p", type=float, default=0.95)
  parser.set_defaults(save="lstm_char.safetensors", plot="lstm_char_loss.png")
  return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> float:
  """Train as the flags say, print samples; returns the final validation loss."""
  args = parse_args(argv)
  Tensor.manual_seed(args.seed)
  data = CharData(args.data, limit=args.limit)
  model = LSTMLanguageModel(data.vocab_size, args.embed, args.hidden, args.layers, args.dropout)
  print(f"{data.path.name}: {len(data.train)} training and {len(data.val)} validation characters, vocabulary {data.vocab_size}; "
        f"LSTM of {sum(t.numel() for t in model.parameters()) / 1e6:.2f}M parameters")
  curves = train_lm(model, data, args, "LSTM")
  print(f"validation loss {curves.val[1][-1]:.2f} after {args.steps} steps ({math.ceil(curves.seconds)} s)")
  for i in range(args.samples):
    out = model.generate(Tensor([data.encode("\n")]), args.sample_length, temperature=args.temperature,
                         top_k=args.top_k, top_p=args.top_p)
    print(f"--- sample {i + 1}\n{data.decode(out.numpy()[0])}")
  return curves.val[1][-1]


if __name__ == "__main__":
  main()
