"""Train one of tinychad.models' image classifiers on MNIST: what examples/resnet.py and examples/vit.py share.

in: a model builder and its recipe (epochs, batch size, peak lr) from the example; the flags parse_args adds
    (--epochs --batch-size --lr --limit --test-sample --data --save --plot --no-jit --device --seed)
out: a tqdm bar per epoch, the weights in a .safetensors file, the loss curve (every batch's loss and its running
     mean) as a PNG, and a last line like `test accuracy 99.0% after 1 epoch (250 s)`.
Data loading, the training step (replayed by TinyJit), Adam with a one-cycle lr and the test pass are
examples/mnist.py's, reused as they are.
"""
from __future__ import annotations
import argparse
import math
import time
from typing import Callable
import numpy as np
from tinychad import Device, Tensor, nn
from tinychad.examples.mnist import evaluate, load_data, make_optimizer, train_epoch, train_loader
from tinychad.examples.plot import save_loss_curve
from tinychad.nn.state import get_state_dict, safe_save


def parse_args(name: str, description: str, epochs: int, batch_size: int, lr: float, argv: list[str] | None,
               extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
  """The shared flags with this example's recipe as defaults; `extra` adds the example's own flags."""
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--epochs", type=int, default=epochs)
  parser.add_argument("--batch-size", type=int, default=batch_size)
  parser.add_argument("--lr", type=float, default=lr, help="the peak of Adam's one-cycle lr")
  parser.add_argument("--limit", type=int, default=None, help="train on the first N training images only")
  parser.add_argument("--test-sample", type=int, default=None, help="test on N test images drawn at random (seeded)")
  parser.add_argument("--data", default=None, help="folder with the four MNIST .gz files")
  parser.add_argument("--save", default=f"mnist_{name}.safetensors", help="where to write the weights")
  parser.add_argument("--plot", default=f"mnist_{name}_loss.png", help="where to write the loss curve")
  parser.add_argument("--no-jit", dest="jit", action="store_false", help="build every step's graph anew")
  parser.add_argument("--device", default=None, help="NUMPY, CPU or LLVM (default: the fastest available)")
  parser.add_argument("--seed", type=int, default=0)
  if extra is not None: extra(parser)
  return parser.parse_args(argv)


def running_mean(values: list[float], window: int) -> list[float]:
  """The mean of the last `window` values at each point (fewer at the start): the curve under the noise."""
  sums = np.cumsum([0.0] + values)
  return [(sums[i + 1] - sums[max(0, i + 1 - window)]) / min(i + 1, window) for i in range(len(values))]


def train_mnist(name: str, model: nn.Module, args: argparse.Namespace) -> tuple[float, list[float]]:
  """Train model on MNIST as args say, test it, save weights and loss curve; returns (test accuracy, batch losses)."""
  X_train, Y_train, X_test, Y_test, dataset = load_data(args.data)
  X_train, Y_train = X_train[:args.limit], Y_train[:args.limit]
  if args.test_sample is not None:
    rows = np.random.default_rng(args.seed).permutation(len(Y_test))[:args.test_sample]
    X_test, Y_test = X_test[rows], Y_test[rows]
  params = sum(p.numel() for p in model.parameters())
  print(f"{dataset}: training {name} ({params:,} parameters) on {len(Y_train)} images, testing on {len(Y_test)}, "
        f"device {Device.DEFAULT}")
  steps_per_epoch = len(train_loader(X_train, Y_train, args.batch_size, args.seed))
  opt, scheduler = make_optimizer(model, name, args.lr, "onecycle", args.epochs * steps_per_epoch)
  losses: list[float] = []
  start = time.perf_counter()
  for epoch in range(args.epochs):
    train_epoch(model, opt, X_train, Y_train, args.batch_size, seed=args.seed + epoch,
                desc=f"epoch {epoch + 1}/{args.epochs}", scheduler=scheduler, jit=args.jit, losses=losses)
  accuracy = evaluate(model, X_test, Y_test, batch_size=500)
  seconds = time.perf_counter() - start
  safe_save(get_state_dict(model), args.save)
  steps, window = list(range(1, len(losses) + 1)), max(1, min(50, len(losses) // 10))
  curves = {"batch loss": (steps, losses), f"running mean ({window})": (steps, running_mean(losses, window))}
  save_loss_curve(args.plot, curves, title=f"{name} on {dataset}", ylabel="cross-entropy")
  print(f"weights saved to {args.save}, loss curve to {args.plot}")
  plural = "" if args.epochs == 1 else "s"
  print(f"test accuracy {100 * accuracy:.1f}% after {args.epochs} epoch{plural} ({math.ceil(seconds)} s)")
  return accuracy, losses


def run(name: str, build: Callable[[argparse.Namespace], nn.Module], args: argparse.Namespace) -> tuple[float, list[float]]:
  """Seed, pick the device, build the model from args, train and test it."""
  if args.device: Device.DEFAULT = args.device
  Tensor.manual_seed(args.seed)
  return train_mnist(name, build(args), args)
