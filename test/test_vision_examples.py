"""The ResNet and ViT examples end to end on a cut-down setting (the shared MNIST copy; test/conftest.py points
$TINYCHAD_DATA at it): a few dozen steps of the real recipe (TinyJit, Adam with one-cycle), the loss falls,
the test accuracy is far above chance, the loss curve is a PNG and the weights reload by name into a fresh model
that scores the same. The full recipes and their accuracies are in README.md.
"""
from __future__ import annotations
import re
import numpy as np
from tinychad.examples import resnet as resnet_example
from tinychad.examples import vit as vit_example
from tinychad.examples.mnist import evaluate, load_data
from tinychad.examples.vision import run, running_mean
from tinychad.models import ViT, ViTConfig, resnet18
from test_examples import data_flags


def check_run(example, name: str, tmp_path, capsys, flags: list[str], fall: float):
  weights, plot = tmp_path / f"{name}.safetensors", tmp_path / f"{name}.png"
  argv = [*flags, "--test-sample", "300", "--save", str(weights), "--plot", str(plot), *data_flags()]
  accuracy, losses = run(name, example.build, example.parse(argv))
  out = capsys.readouterr().out
  assert re.search(r"^test accuracy \d+\.\d% after 1 epoch \(\d+ s\)$", out, re.M), out
  assert np.mean(losses[-5:]) < fall * np.mean(losses[:5]), losses   # from ~2.3 (chance: ln 10)
  assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  _, _, X_test, Y_test, _ = load_data(data_flags()[1])
  rows = np.random.default_rng(0).permutation(len(Y_test))[:300]
  return accuracy, weights, (X_test[rows], Y_test[rows])


def test_resnet_example_trains(tmp_path, capsys):
  accuracy, weights, (X, Y) = check_run(resnet_example, "resnet18", tmp_path, capsys,
                                        ["--limit", "1280", "--batch-size", "32", "--width", "8"], fall=0.6)
  assert accuracy > 0.5
  assert evaluate(resnet18(weights=weights, num_classes=10, in_channels=1, width=8), X, Y) == accuracy


def test_vit_example_trains(tmp_path, capsys):
  accuracy, weights, (X, Y) = check_run(vit_example, "vit", tmp_path, capsys,
                                        ["--limit", "1920", "--batch-size", "32", "--epochs", "1"], fall=0.85)
  assert accuracy > 0.3   # a transformer starts slower: 60 steps leave it well above chance (10%), not trained
  assert evaluate(ViT(ViTConfig.mnist(), weights=weights), X, Y) == accuracy


def test_running_mean():
  assert running_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
