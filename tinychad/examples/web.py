"""Draw a digit in a web page and watch the MNIST CNN read it, or watch an LSTM write text, computed in
WebAssembly in the page.

in: the CNN's weights (--weights, default mnist_cnn.safetensors as `python -m tinychad.examples.mnist` saves
    them); when that file is missing, a quick one is trained first (1 epoch on --quick-limit images) and saved
    there. The character-level LSTM's weights (--lm-weights, default lstm_char.safetensors), likewise trained
    quickly when missing (examples/webtext.py, the text page).
out: the pages' files (index.html, model.js, model.wasm, model.d.ts, model.json; text.html and its lm.* files,
     webtext.py) in --export DIR, or in a temporary folder served on http://127.0.0.1:PORT until Ctrl-C; the
     two pages link to each other.
The model is exported with tinychad.export(target="wasm"): forward(pixels) takes one image, 784 values in
[0, 1] (white ink on black, shape (1, 1, 28, 28)) and returns the 10 class probabilities; MNIST's
normalization and the softmax are part of the exported function. The page (web/index.html) turns the
drawing into such an image the way MNIST's digits were made: the ink's bounding box scaled into 20x20
(box-filtered), then placed in 28x28 with its center of mass at the center. It predicts on every stroke
move; nothing goes back to the server.
  python -m tinychad.examples.web                    # serve on 127.0.0.1:8000 (index.html and text.html)
  python -m tinychad.examples.web --export site/     # write the files, to host anywhere
"""
from __future__ import annotations
import argparse
import functools
import http.server
import shutil
import tempfile
import threading
from pathlib import Path
import tinychad
from tinychad import Tensor, nn
from tinychad.examples.mnist import CNN, MEAN, STD, parse_args as mnist_args, train_and_test
from tinychad.examples.webtext import export_text_page, load_lm
from tinychad.nn.state import get_state_dict, load_state_dict, safe_load, safe_save

PAGE = Path(__file__).resolve().parent / "web"


def load_cnn(path: str | Path, quick_limit: int = 6000) -> nn.Module:
  """The CNN saved at `path` (its widths read from the file), or a quick one trained and saved there."""
  path = Path(path)
  if not path.exists():
    print(f"{path} not found: training a quick CNN (1 epoch on {quick_limit} images) and saving it there")
    model, run = train_and_test(mnist_args(["--limit", str(quick_limit), "--epochs", "1", "--test-sample", "1000"]))
    print(f"quick CNN: {100 * run.accuracy:.1f}% on 1000 test images")
    safe_save(get_state_dict(model), path)
    return nn.eval(model)
  state = safe_load(path)
  if "trunk.0.weight" not in state or "head.weight" not in state:
    raise ValueError(f"{path}: not the CNN of tinychad/examples/mnist.py (keys {sorted(state)[:4]}...)")
  model = CNN(channels=(state["trunk.0.weight"].shape[0], state["trunk.4.weight"].shape[0]),
              classes=state["head.weight"].shape[0])
  load_state_dict(model, state)
  return nn.eval(model)


def probabilities(model: nn.Module):
  """The exported function: pixels in [0, 1] -> class probabilities."""
  return lambda pixels: model((pixels - MEAN) / STD).softmax(axis=1)


def export_page(model: nn.Module, out_dir: str | Path) -> dict:
  """Write the page and the model's wasm and loader to out_dir; returns the export's manifest."""
  out = Path(out_dir)
  manifest = tinychad.export(probabilities(model), [Tensor.zeros(1, 1, 28, 28)], target="wasm", out_dir=out,
                             names={"inputs": ["pixels"], "outputs": ["probs"]}, name="model")
  shutil.copyfile(PAGE / "index.html", out / "index.html")
  return manifest


def serve(directory: str | Path, port: int = 8000) -> http.server.ThreadingHTTPServer:
  """An HTTP server for `directory` on 127.0.0.1 (port 0: any free one), running in a daemon thread."""
  handler = functools.partial(_QuietHandler, directory=str(directory))
  server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  return server


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
  extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".wasm": "application/wasm",
                    ".js": "text/javascript"}

  def log_message(self, format: str, *args) -> None: pass


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--export", metavar="DIR", help="write the page's files to DIR and exit")
  parser.add_argument("--weights", default="mnist_cnn.safetensors", help="the CNN's weights (trained if missing)")
  parser.add_argument("--quick-limit", type=int, default=6000, help="training images for a quick CNN")
  parser.add_argument("--lm-weights", default="lstm_char.safetensors", help="the text page's LSTM (trained if missing)")
  parser.add_argument("--port", type=int, default=8000)
  args = parser.parse_args(argv)
  model = load_cnn(args.weights, args.quick_limit)
  lm, vocabulary = load_lm(args.lm_weights)
  if args.export:
    files = ["index.html"] + export_page(model, args.export)["files"]
    files += ["text.html", "lm_vocab.json"] + export_text_page(lm, vocabulary, args.export)["files"]
    print(f"wrote {', '.join(files)} to {args.export}")
    return
  with tempfile.TemporaryDirectory(prefix="tinychad-web-") as tmp:
    export_page(model, tmp)
    export_text_page(lm, vocabulary, tmp)
    server = serve(tmp, args.port)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    print(f"serving the MNIST demo on {url}/ and the text page on {url}/text.html (Ctrl-C stops)")
    try:
      threading.Event().wait()
    except KeyboardInterrupt:
      server.shutdown()


if __name__ == "__main__":
  main()
