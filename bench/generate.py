"""Issue 22 item 3: KV-cached generation, tokens/s, tinychad (TinyJit replay, and eager) beside PyTorch eager.

A GPT of 4 layers, d 256, 4 heads, vocabulary 1024 (tinychad.models.gpt, and a plain-torch twin with the same
weights); one prompt of 16 tokens, 256 new tokens, batch 1, greedy so both produce the same tokens (checked).
PyTorch's loop is the usual hand-written one: keys and values concatenated onto the cache each step,
torch.inference_mode, F.scaled_dot_product_attention. Both libraries run with the same thread count, in one
process, one after the other, best of `--repeats`; the machine is shared, so compare ratios within a run.
--cpu-time times CPU seconds of the process (time.process_time) instead of wall time: with --threads 1 other
processes on the machine barely move it (with more threads it counts the pools' spinning workers too).
  python bench/generate.py [--threads 2] [--new 256] [--repeats 3] [--cpu-time]
"""
from __future__ import annotations
import argparse
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""): sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LAYERS, DIM, HEADS, VOCAB, PROMPT = 4, 256, 4, 1024, 16


def torch_generate(state: dict, prompt, new: int):
  """Greedy decoding with a growing KV cache, written in plain torch; returns a function of no arguments."""
  import torch
  import torch.nn.functional as F
  w = {k: torch.tensor(v) for k, v in state.items()}
  hd = DIM // HEADS

  def block(i: int, x, cache: list, pos: int):
    p = f"transformer.h.{i}."
    h = F.layer_norm(x, (DIM,), w[p + "ln_1.weight"], w[p + "ln_1.bias"])
    q, k, v = F.linear(h, w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"]).split(DIM, dim=2)
    q, k, v = (t.view(1, -1, HEADS, hd).transpose(1, 2) for t in (q, k, v))
    if cache[i] is not None: k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
    cache[i] = (k, v)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=pos == 0)
    x = x + F.linear(y.transpose(1, 2).reshape(1, -1, DIM), w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"])
    h = F.layer_norm(x, (DIM,), w[p + "ln_2.weight"], w[p + "ln_2.bias"])
    h = F.gelu(F.linear(h, w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"]))
    return x + F.linear(h, w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"])

  def forward(idx, cache: list, pos: int):
    x = w["transformer.wte.weight"][idx] + w["transformer.wpe.weight"][pos:pos + idx.shape[1]]
    for i in range(LAYERS): x = block(i, x, cache, pos)
    x = F.layer_norm(x, (DIM,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"])
    return x[:, -1] @ w["transformer.wte.weight"].T

  @torch.inference_mode()
  def generate():
    cache, idx = [None] * LAYERS, torch.tensor(prompt)
    out, pos = [], 0
    for _ in range(new):
      token = forward(idx, cache, pos).argmax(-1, keepdim=True)
      pos += idx.shape[1]
      idx = token
      out.append(int(token))
    return out
  return generate


def best(fn, repeats: int, clock=time.perf_counter) -> tuple[float, object]:
  times, out = [], None
  for _ in range(repeats):
    start = clock()
    out = fn()
    times.append(clock() - start)
  return min(times), out


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--threads", type=int, default=2)
  parser.add_argument("--new", type=int, default=256)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--cpu-time", action="store_true", help="CPU seconds of the process instead of wall time")
  args = parser.parse_args(argv)
  clock = time.process_time if args.cpu_time else time.perf_counter
  os.environ["THREADS"] = str(args.threads)
  import numpy as np
  import torch
  torch.set_num_threads(args.threads)
  from tinychad import Tensor
  from tinychad.models.gpt import GPT, GPTConfig
  Tensor.manual_seed(0)
  model = GPT(GPTConfig(n_layer=LAYERS, n_head=HEADS, n_embd=DIM, vocab_size=VOCAB, block_size=PROMPT + args.new))
  prompt = np.random.default_rng(0).integers(0, VOCAB, (1, PROMPT))
  idx = Tensor(prompt)
  rows = []
  for name, jit in (("tinychad TinyJit", True), ("tinychad eager", False)):
    start = time.perf_counter()
    model.generate(idx, args.new, greedy=True, jit=jit).numpy()
    first_s = time.perf_counter() - start
    seconds, out = best(lambda: model.generate(idx, args.new, greedy=True, jit=jit).numpy()[0, PROMPT:].tolist(), args.repeats,
                        clock)
    rows.append((name, seconds, first_s, out))
  torch_fn = torch_generate({k: v.numpy() for k, v in model.state_dict().items()}, prompt, args.new)
  start = time.perf_counter()
  torch_fn()
  first_s = time.perf_counter() - start
  seconds, out = best(torch_fn, args.repeats, clock)
  rows.append(("torch eager (KV cache)", seconds, first_s, out))
  torch_s = rows[-1][1]
  print(f"GPT {LAYERS}L d{DIM} h{HEADS} vocab {VOCAB}: prompt {PROMPT}, {args.new} new tokens, batch 1, greedy, {args.threads} threads, "
        f"{'CPU' if args.cpu_time else 'wall'} time, best of {args.repeats}")
  print(f"{'':24s} {'tok/s':>8s} {'ms/token':>9s} {'first call s':>13s} {'vs torch':>9s}  same tokens")
  for name, seconds, first_s, out in rows:
    print(f"{name:24s} {args.new / seconds:8.0f} {seconds / args.new * 1e3:9.3f} {first_s:13.2f} "
          f"{seconds / torch_s:8.2f}x  {out == rows[-1][3]}")


if __name__ == "__main__": main()
