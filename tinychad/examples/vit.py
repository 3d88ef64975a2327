"""Train a small ViT (tinychad.models.vit, timm's names) on MNIST, test it, save its weights.

in: MNIST as examples/mnist.py finds it (--data, $TINYCHAD_DATA, the shared copy, the cache, a download);
    flags as examples/vision.py's plus --depth and --dim
out: a tqdm bar, mnist_vit.safetensors (timm names: ViT(ViTConfig.mnist(), weights=...) loads it), the loss curve
     in mnist_vit_loss.png, and `test accuracy ...% after N epoch(s) (... s)`.
The model is ViTConfig.mnist(): 7x7 patches of the 28x28 digit (16 tokens and the class token), 4 pre-LN blocks
64 wide with 4 heads, an MLP twice as wide: 0.14M parameters.
  python -m tinychad.examples.vit                     # the recipe in README.md's table
  python -m tinychad.examples.vit --limit 5000        # a quick run
"""
from __future__ import annotations
import argparse
from tinychad.examples.vision import parse_args, run
from tinychad.models import ViT, ViTConfig


def build(args: argparse.Namespace) -> ViT:
  return ViT(ViTConfig.mnist(depth=args.depth, embed_dim=args.dim))


def add_flags(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--depth", type=int, default=4, help="transformer blocks")
  parser.add_argument("--dim", type=int, default=64, help="embedding width (4 heads)")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
  """The flags, with this example's recipe as the defaults."""
  return parse_args("vit", __doc__.split("\n")[0], epochs=3, batch_size=128, lr=3e-3, argv=argv, extra=add_flags)


def main(argv: list[str] | None = None) -> float:
  """Train and test as the flags say; returns the test accuracy (0..1)."""
  return run("vit", build, parse(argv))[0]


if __name__ == "__main__":
  main()
