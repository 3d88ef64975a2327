"""The examples end to end, on the shared MNIST copy (test/conftest.py points $TINYCHAD_DATA at it; no network).

The CNN test is the issue's acceptance test: 5,000 training images, one pass, >= 95% on 1,000 test images.
It takes ~15 s on the compiled CPU device (2 threads, the training step replayed by TinyJit); the NUMPY
device is far slower. The full recipe (2 epochs of 60,000 images, >= 99%) is bench/mnist.py's to run.
"""
from __future__ import annotations
import os
import re
import numpy as np
from tinychad import Tensor
from tinychad.examples import mnist as mnist_example
from tinychad.examples import transfer
from tinychad.examples.mnist import CNN
from tinychad.nn.state import get_state_dict, load_state_dict, safe_load



def data_flags() -> list[str]:
  """--data naming the shared copy explicitly, so a missing copy fails here instead of trying a download."""
  folder = os.environ.get("TINYCHAD_DATA")
  assert folder, "TINYCHAD_DATA is unset: test/conftest.py sets it when ../shared/datasets/mnist exists"
  return ["--data", folder]


def test_cnn_reaches_95_percent_on_5000_images(tmp_path, capsys):
  weights = tmp_path / "cnn.safetensors"
  accuracy = mnist_example.main(["--model", "cnn", "--limit", "5000", "--epochs", "1", "--batch-size", "16", "--test-sample", "1000",
                                 "--save", str(weights), *data_flags()])
  out = capsys.readouterr().out
  assert re.search(r"^test accuracy \d+\.\d% after 1 epoch \(\d+ s\)$", out, re.M), out
  assert accuracy >= 0.95, out
  # the saved file reloads into a fresh model that scores the same on the same 1,000 images (seed 0's sample)
  model = CNN()
  load_state_dict(model, safe_load(weights))
  _, _, X_test, Y_test, _ = mnist_example.load_data(data_flags()[1])
  rows = np.random.default_rng(0).permutation(len(Y_test))[:1000]
  assert mnist_example.evaluate(model, X_test[rows], Y_test[rows]) == accuracy


def test_bobnet_from_the_seed_still_trains(tmp_path, capsys):
  accuracy = mnist_example.main(["--model", "bobnet", "--limit", "3000", "--epochs", "1", "--batch-size", "64", "--test-sample", "1000",
                                 "--save", str(tmp_path / "b.safetensors"), *data_flags()])
  # the seed's lr 1e-3 is slow: 46 steps take it well above chance (10%), not to convergence
  assert accuracy > 0.5, capsys.readouterr().out
  assert list(get_state_dict(mnist_example.BobNet())) == ["l1.weight", "l1.bias", "l2.weight", "l2.bias"]


def test_jit_trains_exactly_like_eager():
  """The replayed step (parameters, Adam's moments, batchnorm statistics and the one-cycle lr all followed
  through assign) gives the same losses and weights as building every step's graph anew."""
  _, _, X_test, Y_test, _ = mnist_example.load_data(data_flags()[1])
  X, Y = X_test[:256], Y_test[:256]
  results = []
  for jit in (False, True):
    Tensor.manual_seed(0)
    model = CNN(channels=(4, 8))
    opt, scheduler = mnist_example.make_optimizer(model, "cnn", 3e-3, "onecycle", total_steps=16)
    losses = [mnist_example.train_epoch(model, opt, X, Y, 32, seed=epoch, scheduler=scheduler, jit=jit) for epoch in range(2)]
    results.append((losses, {k: t.numpy() for k, t in get_state_dict(model).items()}))
  (eager_losses, eager_state), (jit_losses, jit_state) = results
  assert jit_losses == eager_losses
  for name, value in eager_state.items(): np.testing.assert_array_equal(jit_state[name], value, err_msg=name)


def test_falls_back_to_digits_without_mnist(tmp_path, monkeypatch, capsys):
  # a named folder without MNIST: DatasetUnavailable without any download attempt, then scikit-learn's digits
  monkeypatch.setenv("TINYCHAD_DATA", str(tmp_path))
  accuracy = mnist_example.main(["--model", "mlp", "--limit", "600", "--save", str(tmp_path / "m.safetensors")])
  captured = capsys.readouterr()
  assert "falling back to scikit-learn's digits" in captured.err
  assert captured.out.startswith("digits_28x28:")
  assert accuracy > 0.6


def test_main_job_finds_the_shared_mnist_next_to_the_checkout(monkeypatch):
  """Without --data or $TINYCHAD_DATA the main job uses ../shared/datasets/mnist (this machine has no
  internet, so the loader's download would fail and fall back to the digits)."""
  monkeypatch.delenv("TINYCHAD_DATA", raising=False)
  assert mnist_example.default_data_dir() == str(mnist_example.SHARED_MNIST)
  assert mnist_example.SHARED_MNIST.is_dir()
  _, _, X_test, Y_test, name = mnist_example.load_data(None)
  assert name == "MNIST" and X_test.shape == (10000, 1, 28, 28) and Y_test.shape == (10000,)


def test_transfer_prints_both_accuracies(capsys):
  pretrain_acc, finetune_acc = transfer.main(["--limit", "300", *data_flags()])
  out = capsys.readouterr().out
  assert re.search(r"^pretrain \(digits 0-4\): test accuracy \d+\.\d%$", out, re.M), out
  assert re.search(r"^fine-tune \(digits 5-9, frozen trunk\): test accuracy \d+\.\d%$", out, re.M), out
  # far above chance (20%) for both, even from 300 images
  assert pretrain_acc > 0.6 and finetune_acc > 0.5, out


def test_transfer_split_renumbers_labels():
  X, Y = np.arange(10).reshape(10, 1), np.arange(10)
  Xs, Ys = transfer.split(X, Y, range(5, 10), limit=3)
  assert Xs.ravel().tolist() == [5, 6, 7] and Ys.tolist() == [0, 1, 2]
  assert Tensor.training is False
