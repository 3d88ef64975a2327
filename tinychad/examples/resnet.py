"""Train a ResNet-18 (tinychad.models.resnet, torchvision's names) on MNIST, test it, save its weights.

in: MNIST as examples/mnist.py finds it (--data, $TINYCHAD_DATA, the shared copy, the cache, a download);
    flags as examples/vision.py's plus --width (channels of the first stage; torchvision's is 64) and --small-input
out: a tqdm bar, mnist_resnet18.safetensors (torchvision names: resnet18(weights=...) loads it), the loss curve in
     mnist_resnet18_loss.png, and `test accuracy ...% after N epoch(s) (... s)`.
The model is ResNet-18 on one input channel with stages 16/32/64/128 wide (--width 16): 0.7M parameters.
The stem is torchvision's (7x7 stride-2 conv, 3x3 stride-2 max pool), so the stages see 7x7, 4x4, 2x2 and 1x1
maps; --small-input swaps in the CIFAR stem (3x3 stride 1, no pool), which keeps the 28x28 detail at 16x the cost.
  python -m tinychad.examples.resnet                  # the recipe in README.md's table
  python -m tinychad.examples.resnet --limit 5000     # a quick run
"""
from __future__ import annotations
import argparse
from tinychad.examples.vision import parse_args, run
from tinychad.models import ResNet, resnet18


def build(args: argparse.Namespace) -> ResNet:
  return resnet18(num_classes=10, in_channels=1, small_input=args.small_input, width=args.width)


def add_flags(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--width", type=int, default=16, help="first stage's channels")
  parser.add_argument("--small-input", action="store_true", help="3x3 stride-1 stem without max pool")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
  """The flags, with this example's recipe as the defaults."""
  return parse_args("resnet18", __doc__.split("\n")[0], epochs=1, batch_size=64, lr=4e-3, argv=argv,
                    extra=add_flags)


def main(argv: list[str] | None = None) -> float:
  """Train and test as the flags say; returns the test accuracy (0..1)."""
  return run("resnet18", build, parse(argv))[0]


if __name__ == "__main__":
  main()
