"""Speculative decoding with a big and a small character-level GPT: acceptance rate and speed-up.

in: a text file (--data; default Python's pydoc_data/topics.py); the two models trained here for --steps each
    (target: --target-layers x --target-embd, draft: --draft-layers x --draft-embd), or loaded with --target/--draft
    from weights that examples/gpt.py saved; --new tokens after --prompt, --speculate-k, --temperature
out: each model's validation loss, then for greedy and for sampled decoding: tokens/s of the target alone and with
     the draft proposing speculate_k tokens per target pass, the draft's acceptance rate and the speed-up; greedy
     speculative output is checked token for token against the target's own greedy output.
  python -m tinychad.examples.speculative
  python -m tinychad.examples.speculative --target gpt_char.safetensors --steps 300
"""
from __future__ import annotations
import argparse
import time
import numpy as np
from tinychad import Tensor
from tinychad.examples.chartext import CharData, add_training_flags, train_lm
from tinychad.models.gpt import GPT, GPTConfig, speculative_generate


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add_training_flags(parser, steps=600, lr=2e-3, batch_size=32, block_size=128)
  parser.add_argument("--target", default=None, help="the target's weights (.safetensors from examples/gpt.py)")
  parser.add_argument("--draft", default=None, help="the draft's weights")
  parser.add_argument("--target-layers", type=int, default=4)
  parser.add_argument("--target-embd", type=int, default=128)
  parser.add_argument("--draft-layers", type=int, default=1)
  parser.add_argument("--draft-embd", type=int, default=64)
  parser.add_argument("--prompt", default="def ")
  parser.add_argument("--new", type=int, default=96)
  parser.add_argument("--speculate-k", type=int, default=4)
  parser.add_argument("--temperature", type=float, default=0.8)
  parser.set_defaults(save=None, plot=None, samples=0)
  return parser.parse_args(argv)


def model_for(path: str | None, layers: int, embd: int, data: CharData, args: argparse.Namespace, name: str) -> GPT:
  if path is not None: return GPT.from_pretrained(path, n_head=4)
  model = GPT(GPTConfig(n_layer=layers, n_head=4, n_embd=embd, block_size=args.block_size, vocab_size=data.vocab_size))
  curves = train_lm(model, data, args, name)
  print(f"{name}: {model.num_params() / 1e6:.2f}M parameters, validation loss {curves.val[1][-1]:.2f} after {args.steps} steps")
  return model


def timed(fn, repeats: int = 2) -> tuple[float, object]:
  """Best of `repeats` after one warm-up call (which compiles and records the decoders)."""
  out = fn()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    out = fn()
    best = min(best, time.perf_counter() - start)
  return best, out


def main(argv: list[str] | None = None) -> dict[str, float]:
  """Train (or load) both models, compare plain and speculative decoding; returns the measured numbers."""
  args = parse_args(argv)
  Tensor.manual_seed(args.seed)
  data = CharData(args.data, limit=args.limit)
  target = model_for(args.target, args.target_layers, args.target_embd, data, args, "target")
  draft = model_for(args.draft, args.draft_layers, args.draft_embd, data, args, "draft")
  prompt = Tensor([data.encode(args.prompt) or [0]])
  new = min(args.new, min(target.config.block_size, draft.config.block_size) - prompt.shape[1] - args.speculate_k)
  results = {}
  for mode, kwargs in (("greedy", dict(greedy=True)), ("sampled", dict(temperature=args.temperature))):
    plain_s, plain = timed(lambda: target.generate(prompt, new, **kwargs))
    spec_s, (spec, stats) = timed(lambda: speculative_generate(target, draft, prompt, new, speculate_k=args.speculate_k, **kwargs))
    if mode == "greedy" and not np.array_equal(plain.numpy(), spec.numpy()):
      raise AssertionError("greedy speculative decoding differs from the target's greedy output")
    results[f"{mode}_acceptance"], results[f"{mode}_speedup"] = stats.acceptance_rate, plain_s / spec_s
    print(f"{mode:8s} target alone {new / plain_s:6.0f} tok/s | speculative (k={args.speculate_k}) {new / spec_s:6.0f} tok/s, "
          f"acceptance {100 * stats.acceptance_rate:.0f}%, {stats.target_calls} target passes for {new} tokens, "
          f"speed-up {plain_s / spec_s:.2f}x")
    print(f"         {data.decode(spec.numpy()[0])!r}")
  return results


if __name__ == "__main__":
  main()
