"""Transfer learning: pretrain the MNIST CNN on digits 0-4, save it, reload it, freeze its conv trunk, and
fine-tune a new head on digits 5-9.

in: MNIST (as in examples/mnist.py: --data, $TINYCHAD_DATA, cache, download, else scikit-learn's digits);
    flags --limit N (at most N training and N test images per stage, for quick runs), --epochs, --batch-size, --lr, --device
out: the pretrained weights in a .safetensors file, and two lines:
     `pretrain (digits 0-4): test accuracy 99.0%` and `fine-tune (digits 5-9, frozen trunk): test accuracy 97.0%`.
Only the head is given to the optimizer and the trunk's tensors get requires_grad=False, so backward stops
at the head and the trunk's weights stay exactly as loaded (the script checks this).
"""
from __future__ import annotations
import argparse
import os
import tempfile
import numpy as np
from tinychad import Device, Tensor
from tinychad.examples.mnist import CNN, evaluate, load_data, train_epoch
from tinychad.nn.optim import Adam
from tinychad.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save


def split(X: np.ndarray, Y: np.ndarray, digits: range, limit: int | None) -> tuple[np.ndarray, np.ndarray]:
  """The rows whose label is in `digits` (the first `limit` of them), labels renumbered from 0."""
  rows = np.flatnonzero(np.isin(Y, list(digits)))[:limit]
  return X[rows], Y[rows] - digits.start


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--epochs", type=int, default=1, help="epochs for each of the two stages")
  parser.add_argument("--batch-size", type=int, default=32)
  parser.add_argument("--lr", type=float, default=1e-3)
  parser.add_argument("--device", default=None)
  parser.add_argument("--data", default=None, help="folder with the four MNIST .gz files")
  parser.add_argument("--limit", type=int, default=None, help="train and test on at most N images per stage")
  parser.add_argument("--save", default=None, help="where to keep the pretrained weights (default: a temporary folder)")
  parser.add_argument("--seed", type=int, default=0)
  return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> tuple[float, float]:
  """Run both stages; returns (pretrain accuracy on test 0-4, fine-tune accuracy on test 5-9)."""
  args = parse_args(argv)
  if args.device: Device.DEFAULT = args.device
  Tensor.manual_seed(args.seed)
  X_train, Y_train, X_test, Y_test, dataset = load_data(args.data)
  low, high = range(0, 5), range(5, 10)

  # stage 1: a 5-way classifier for 0-4
  model = CNN(classes=5)
  opt = Adam(get_parameters(model), lr=args.lr)
  X, Y = split(X_train, Y_train, low, args.limit)
  print(f"{dataset}: pretraining on {len(Y)} images of digits 0-4")
  for epoch in range(args.epochs): train_epoch(model, opt, X, Y, args.batch_size, seed=args.seed + epoch, desc="pretrain")
  pretrain_acc = evaluate(model, *split(X_test, Y_test, low, args.limit))
  print(f"pretrain (digits 0-4): test accuracy {100 * pretrain_acc:.1f}%")

  with tempfile.TemporaryDirectory() as tmp:
    path = args.save or os.path.join(tmp, "pretrained.safetensors")
    safe_save(get_state_dict(model), path)
    # stage 2: a fresh model gets the pretrained trunk from the file and a new 5-way head for 5-9
    model = CNN(classes=5)
    pretrained = {k: v for k, v in safe_load(path).items() if k.startswith("trunk.")}
    load_state_dict(model.trunk, {k.removeprefix("trunk."): v for k, v in pretrained.items()})
  for t in get_state_dict(model.trunk).values(): t.requires_grad = False
  frozen = {k: t.numpy().copy() for k, t in get_state_dict(model.trunk).items()}
  opt = Adam(get_parameters(model.head), lr=args.lr)
  X, Y = split(X_train, Y_train, high, args.limit)
  print(f"fine-tuning a new head on {len(Y)} images of digits 5-9, trunk frozen")
  # eval mode for the trunk's batchnorm: a frozen trunk keeps the statistics it was pretrained with
  for epoch in range(args.epochs): train_epoch(model, opt, X, Y, args.batch_size, seed=args.seed + epoch, desc="fine-tune", train_mode=False)
  changed = [k for k, t in get_state_dict(model.trunk).items() if not np.array_equal(t.numpy(), frozen[k])]
  if changed: raise RuntimeError(f"the frozen trunk changed during fine-tuning: {changed}")
  finetune_acc = evaluate(model, *split(X_test, Y_test, high, args.limit))
  print(f"fine-tune (digits 5-9, frozen trunk): test accuracy {100 * finetune_acc:.1f}%")
  return pretrain_acc, finetune_acc


if __name__ == "__main__":
  main()
