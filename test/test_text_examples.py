"""The text examples end to end on a cut-down setting: a few training steps on the first 20,000 characters of
Python's pydoc_data/topics.py, tiny models; the validation loss falls well below a uniform guess's, the weights
and the loss curve are written, the weights reload, samples print, speculative decoding reports its numbers."""
from __future__ import annotations
import math
import re
import numpy as np
from tinychad.examples import gpt as gpt_example
from tinychad.examples import lstm as lstm_example
from tinychad.examples import speculative as speculative_example
from tinychad.examples.chartext import CharData
from tinychad.models.gpt import GPT
from tinychad.models.lstm import LSTMLanguageModel
from tinychad.nn.state import load_state_dict, safe_load

QUICK = ["--limit", "20000", "--steps", "40", "--eval-every", "20", "--eval-batches", "2", "--sample-length", "30"]


def test_gpt_example_trains_saves_and_samples(tmp_path, capsys):
  weights, curve = tmp_path / "gpt.safetensors", tmp_path / "gpt.png"
  val = gpt_example.main([*QUICK, "--n-layer", "1", "--n-embd", "32", "--block-size", "32", "--batch-size", "16",
                          "--save", str(weights), "--plot", str(curve)])
  out = capsys.readouterr().out
  vocab = CharData(limit=20000).vocab_size
  assert val < math.log(vocab) - 0.8, out   # a uniform guess scores log(vocab)
  assert re.search(r"^validation loss \d+\.\d\d after 40 steps \(\d+ s\)$", out, re.M), out
  assert out.count("--- sample") == 2
  assert curve.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  model = GPT.from_pretrained(str(weights), n_head=4)
  assert model.config.n_layer == 1 and model.config.vocab_size == vocab


def test_rotary_gpt_example_trains(tmp_path, capsys):
  val = gpt_example.main([*QUICK, "--n-layer", "1", "--n-embd", "32", "--block-size", "32", "--batch-size", "16", "--rotary",
                          "--samples", "0", "--save", str(tmp_path / "g.safetensors"), "--plot", str(tmp_path / "g.png")])
  assert val < math.log(CharData(limit=20000).vocab_size) - 0.8, capsys.readouterr().out


def test_lstm_example_trains_saves_and_samples(tmp_path, capsys):
  weights = tmp_path / "lstm.safetensors"
  val = lstm_example.main([*QUICK, "--embed", "16", "--hidden", "32", "--layers", "1", "--block-size", "16",
                           "--save", str(weights), "--plot", str(tmp_path / "lstm.png")])
  out = capsys.readouterr().out
  data = CharData(limit=20000)
  assert val < math.log(data.vocab_size) - 0.8, out
  assert out.count("--- sample") == 2
  model = LSTMLanguageModel(data.vocab_size, 16, 32, 1)
  load_state_dict(model, safe_load(weights))
  x, y = data.batch("val", 4, 16, np.random.default_rng(0))
  assert model(x, y)[1].item() < math.log(data.vocab_size) - 0.8


def test_speculative_example_reports_acceptance_and_speed_up(capsys):
  results = speculative_example.main(["--limit", "20000", "--steps", "30", "--eval-every", "30", "--eval-batches", "1",
                                      "--block-size", "48", "--target-layers", "2", "--target-embd", "32",
                                      "--draft-embd", "16", "--new", "24", "--batch-size", "8"])
  out = capsys.readouterr().out
  assert 0 <= results["greedy_acceptance"] <= 1 and 0 <= results["sampled_acceptance"] <= 1
  assert results["greedy_speedup"] > 0
  assert re.search(r"greedy .* acceptance \d+%", out) and re.search(r"sampled .* speed-up \d+\.\d\dx", out), out
