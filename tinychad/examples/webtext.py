"""The web demo's text page: a character-level LSTM language model writing text in the page, in WebAssembly.

in: the LSTM's weights (web.py's --lm-weights, default lstm_char.safetensors as `python -m tinychad.examples.lstm`
    saves them; its sizes are read from the file); when that file is missing, a quick one is trained first
    (QUICK_STEPS AdamW steps of a small LSTM) and saved there. The vocabulary is the
    sorted characters of the text it was trained on (CharData: Python's pydoc_data/topics.py by default).
out: in the page's folder, text.html, lm.wasm, lm.js, lm.d.ts, lm.json, lm.safetensors and lm_vocab.json.
The exported function is one step of the model, (token (1, 1) int32, h, c (layers, 1, hidden)) -> (logits
(1, vocab), h, c), so the page carries the LSTM's state from character to character as generate() does:
it feeds the prompt's characters one by one, then draws each next character from softmax(logits /
temperature) in JavaScript (temperature 0: the most likely one, as generate(greedy=True) picks) and feeds it
back, showing each as it comes.
"""
from __future__ import annotations
import json
import shutil
from pathlib import Path
import tinychad
from tinychad import Tensor, dtypes
from tinychad.examples.chartext import CharData, train_lm
from tinychad.helpers import atomic_write
from tinychad.examples.lstm import parse_args as lstm_args
from tinychad.models.lstm import LSTMLanguageModel
from tinychad.nn.state import get_state_dict, load_state_dict, safe_load, safe_save

PAGE = Path(__file__).resolve().parent / "web" / "text.html"
# the quick model: 150 steps train in about a minute on 2 cores once the step's kernels are compiled (the
# first run compiles them: a minute or two more); validation loss 1.31 after the 150 steps
QUICK_STEPS = 150
QUICK_SIZES = ["--embed", "32", "--hidden", "128", "--layers", "2", "--lr", "1e-2"]


def load_lm(path: str | Path, quick_steps: int = QUICK_STEPS) -> tuple[LSTMLanguageModel, CharData]:
  """The LSTM language model saved at `path` (its sizes read from the file) and its vocabulary, or a quick
  one trained on the default text and saved there."""
  path, data = Path(path), CharData()
  if not path.exists():
    print(f"{path} not found: training a quick LSTM ({quick_steps} steps) and saving it there")
    args = lstm_args([*QUICK_SIZES, "--steps", str(quick_steps), "--eval-every", str(quick_steps), "--eval-batches", "2"])
    args.save, args.plot = None, None
    Tensor.manual_seed(args.seed)
    model = LSTMLanguageModel(data.vocab_size, args.embed, args.hidden, args.layers)
    curves = train_lm(model, data, args, "LSTM")
    print(f"quick LSTM: validation loss {curves.val[1][-1]:.2f} after {quick_steps} steps")
    safe_save(get_state_dict(model), path)
    return model, data
  state = safe_load(path)
  if "embedding.weight" not in state or "lstm.weight_ih_l0" not in state or "head.weight" not in state:
    raise ValueError(f"{path}: not an LSTMLanguageModel's weights (keys {sorted(state)[:4]}...)")
  vocab, embed = state["embedding.weight"].shape
  if vocab != data.vocab_size:
    raise ValueError(f"{path}: a vocabulary of {vocab} characters, but {data.path.name} has {data.vocab_size}: "
                     "it was trained on another text")
  layers = sum(1 for k in state if k.startswith("lstm.weight_ih_l"))
  model = LSTMLanguageModel(vocab, embed, state["lstm.weight_hh_l0"].shape[1], layers)
  load_state_dict(model, state)
  return model.eval(), data


def step_fn(model: LSTMLanguageModel):
  """The exported function: one character in, the next character's logits and the new state out."""
  def step(token: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    logits, _, (h, c) = model(token, state=(h, c))
    return logits[:, -1, :], h, c
  return step


def step_inputs(model: LSTMLanguageModel) -> list[Tensor]:
  """Example inputs of step_fn: a token and a zero state."""
  state = (model.num_layers, 1, model.hidden_size)
  return [Tensor([[0]], dtype=dtypes.int32), Tensor.zeros(*state), Tensor.zeros(*state)]


def export_text_page(model: LSTMLanguageModel, data: CharData, out_dir: str | Path) -> dict:
  """Write text.html, the step's wasm and loader (lm.*) and the vocabulary to out_dir; returns the manifest."""
  out = Path(out_dir)
  model.eval()
  manifest = tinychad.export(step_fn(model), step_inputs(model), target="wasm", out_dir=out, weights="safetensors",
                             names={"inputs": ["token", "h", "c"], "outputs": ["logits", "h_next", "c_next"]}, name="lm")
  atomic_write(out / "lm_vocab.json", json.dumps({"chars": data.chars}).encode())
  (out / "lm_vocab.json").chmod(0o644)
  shutil.copyfile(PAGE, out / PAGE.name)
  return manifest


def greedy_continuation(model: LSTMLanguageModel, data: CharData, prompt: str, length: int) -> str:
  """What the page writes after `prompt` at temperature 0: generate(greedy=True)'s characters."""
  ids = data.encode(prompt) or data.encode("\n")
  out = model.generate(Tensor([ids]), length, greedy=True).numpy()[0]
  return data.decode(out[len(ids):])
