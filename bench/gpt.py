"""Workload 7: forward pass of a small GPT, in tokens/s.

4 pre-norm transformer blocks, d=256, 4 heads, causal attention, GELU MLP (4x), vocab 1024, seq 128,
batch 8; tied to nothing, no dropout. Written with plain tensor ops (weights as tensors, layernorm,
matmuls, scaled_dot_product_attention with is_causal) so it needs no nn layers. tinychad and tinygrad
share one definition (their Tensor APIs agree on everything used); torch has the same model.
"""
import sys
from pathlib import Path

if __package__ in (None, ""): sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import Case, bind, main, tinygrad_realize

TITLE = "gpt forward"
LAYERS, DIM, HEADS, VOCAB = 4, 256, 4, 1024


def weight_shapes(seq: int) -> dict[str, tuple[int, ...]]:
  """Every weight by name; matrices are (in, out) so that y = x @ w + b."""
  shapes = {"tok_emb": (VOCAB, DIM), "pos_emb": (seq, DIM), "ln_f.g": (DIM,), "ln_f.b": (DIM,), "head": (DIM, VOCAB)}
  for i in range(LAYERS):
    shapes.update({f"{i}.ln1.g": (DIM,), f"{i}.ln1.b": (DIM,), f"{i}.ln2.g": (DIM,), f"{i}.ln2.b": (DIM,),
                   f"{i}.q": (DIM, DIM), f"{i}.k": (DIM, DIM), f"{i}.v": (DIM, DIM), f"{i}.o": (DIM, DIM),
                   f"{i}.fc": (DIM, 4 * DIM), f"{i}.fc.b": (4 * DIM,), f"{i}.proj": (4 * DIM, DIM), f"{i}.proj.b": (DIM,)})
  return shapes


def tensor_gpt(w: dict, tokens):
  """The forward pass in the Tensor API that tinychad and tinygrad share; returns the logits."""
  batch, seq = tokens.shape

  def heads(t): return t.reshape(batch, seq, HEADS, DIM // HEADS).permute(0, 2, 1, 3)

  x = w["tok_emb"][tokens] + w["pos_emb"]
  for i in range(LAYERS):
    h = x.layernorm() * w[f"{i}.ln1.g"] + w[f"{i}.ln1.b"]
    attn = heads(h @ w[f"{i}.q"]).scaled_dot_product_attention(heads(h @ w[f"{i}.k"]), heads(h @ w[f"{i}.v"]), is_causal=True)
    x = x + attn.permute(0, 2, 1, 3).reshape(batch, seq, DIM) @ w[f"{i}.o"]
    h = x.layernorm() * w[f"{i}.ln2.g"] + w[f"{i}.ln2.b"]
    x = x + ((h @ w[f"{i}.fc"] + w[f"{i}.fc.b"]).gelu() @ w[f"{i}.proj"] + w[f"{i}.proj.b"])
  return (x.layernorm() * w["ln_f.g"] + w["ln_f.b"]) @ w["head"]


def tinychad_gpt(batch: int, seq: int):
  from tinychad import Tensor, TinyJit
  w = {name: (Tensor.randn(*shape) * 0.02).realize() for name, shape in weight_shapes(seq).items()}
  tokens = Tensor.randint(0, VOCAB, size=(batch, seq)).realize()
  forward = TinyJit(lambda toks: tensor_gpt(w, toks))
  return lambda: forward(tokens).realize()


def tinygrad_gpt(batch: int, seq: int):
  from tinygrad import Tensor, TinyJit
  w = {name: (Tensor.randn(*shape) * 0.02).realize() for name, shape in weight_shapes(seq).items()}
  tokens = Tensor.randint(batch, seq, low=0, high=VOCAB).realize()
  forward = TinyJit(lambda toks: tinygrad_realize(tensor_gpt(w, toks)))
  return lambda: forward(tokens)


def torch_gpt(batch: int, seq: int):
  import torch
  import torch.nn.functional as F
  w = {name: torch.randn(*shape) * 0.02 for name, shape in weight_shapes(seq).items()}
  tokens = torch.randint(0, VOCAB, (batch, seq))

  def heads(t): return t.reshape(batch, seq, HEADS, DIM // HEADS).permute(0, 2, 1, 3)

  @torch.inference_mode()
  def forward():
    x = w["tok_emb"][tokens] + w["pos_emb"]
    for i in range(LAYERS):
      h = F.layer_norm(x, (DIM,), w[f"{i}.ln1.g"], w[f"{i}.ln1.b"])
      attn = F.scaled_dot_product_attention(heads(h @ w[f"{i}.q"]), heads(h @ w[f"{i}.k"]), heads(h @ w[f"{i}.v"]), is_causal=True)
      x = x + attn.permute(0, 2, 1, 3).reshape(batch, seq, DIM) @ w[f"{i}.o"]
      h = F.layer_norm(x, (DIM,), w[f"{i}.ln2.g"], w[f"{i}.ln2.b"])
      x = x + (F.gelu(h @ w[f"{i}.fc"] + w[f"{i}.fc.b"]) @ w[f"{i}.proj"] + w[f"{i}.proj.b"])
    return F.layer_norm(x, (DIM,), w["ln_f.g"], w["ln_f.b"]) @ w["head"]
  return forward


def cases(quick: bool) -> list[Case]:
  batch, seq = (2, 64) if quick else (8, 128)
  libraries = {"tinychad": tinychad_gpt, "torch": torch_gpt, "tinygrad": tinygrad_gpt}
  return [Case(f"GPT fwd {LAYERS}L d{DIM} b{batch}x{seq}", "tok/s", batch * seq,
               bind(libraries, batch, seq),
               repeats=3, warmup=1, missing_reason="no numpy GPT written")]


if __name__ == "__main__": main([f"bench.{Path(__file__).stem}"])
