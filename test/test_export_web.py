"""The web demo (tinychad/examples/web.py) in a real browser: headless Chromium, driven by Playwright, loads the
exported page, a "7" is drawn on its canvas with mouse strokes, and the page's prediction, computed by the
model's WebAssembly in the page, must equal the Python model's on the same rasterized image (the page shows
the 28x28 pixels it fed the model). On the text page (examples/webtext.py) a prompt is typed, and the text the
LSTM's WebAssembly writes at temperature 0 must be the Python model's greedy continuation. Screenshots are
saved (in the test's folder, and in $TINYCHAD_SCREENSHOTS when set). Also: `python -m tinychad.examples.web
--export DIR` writes both pages' files."""
from __future__ import annotations
import contextlib
import os
import shutil
import subprocess
import sys
import numpy as np
import pytest
from tinychad import Tensor, nn
from tinychad.examples import web, webtext

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


def needs_browser():
  """Playwright's sync API, or a skip saying what is missing."""
  if CHROMIUM is None: pytest.skip("no chromium (Debian: apt-get install chromium; .ci/run installs it)")
  return pytest.importorskip("playwright.sync_api", reason="no playwright (pip install playwright)")


@contextlib.contextmanager
def opened_page(tmp_path, site, name: str):
  """The page `name` of the exported `site`, served on 127.0.0.1 and opened in headless chromium (a fresh profile
  folder, which Playwright passes as --user-data-dir) once its model has loaded: yields the page and the list of
  page errors seen."""
  sync_api = needs_browser()
  server = web.serve(site, 0)
  try:
    with sync_api.sync_playwright() as p:
      browser = p.chromium.launch_persistent_context(tmp_path / "profile", executable_path=CHROMIUM, args=CHROMIUM_FLAGS,
                                                     viewport={"width": 900, "height": 700})
      page = browser.new_page()
      errors = []
      page.on("pageerror", lambda e: errors.append(str(e)))
      page.goto(f"http://127.0.0.1:{server.server_address[1]}/{name}")
      page.wait_for_function("window.modelReady === true || window.modelError", timeout=30000)
      assert page.evaluate("window.modelError || null") is None
      yield page, errors
      browser.close()
  finally:
    server.shutdown()


def save_screenshot(page, path) -> None:
  page.screenshot(path=str(path))
  if os.getenv("TINYCHAD_SCREENSHOTS"): shutil.copyfile(path, os.path.join(os.environ["TINYCHAD_SCREENSHOTS"], path.name))


@pytest.fixture(scope="module")
def trained_cnn(tmp_path_factory):
  """A quick CNN (1 epoch on 4000 images: ~90% accurate), saved as the demo saves one."""
  path = tmp_path_factory.mktemp("weights") / "mnist_cnn.safetensors"
  model = web.load_cnn(path, quick_limit=4000)
  assert path.exists()
  return path, model


@pytest.fixture(scope="module")
def trained_lm(tmp_path_factory):
  """A quick character-level LSTM (QUICK_STEPS_TEST steps: enough for its text to be more than one repeated
  character), saved as the demo saves one."""
  path = tmp_path_factory.mktemp("weights") / "lstm_char.safetensors"
  model, data = webtext.load_lm(path, quick_steps=QUICK_STEPS_TEST)
  assert path.exists()
  return path, model, data


QUICK_STEPS_TEST = 60


def test_export_writes_the_page(tmp_path, trained_cnn, trained_lm):
  path, lm_path = trained_cnn[0], trained_lm[0]
  result = subprocess.run([sys.executable, "-m", "tinychad.examples.web", "--weights", str(path), "--lm-weights", str(lm_path),
                           "--export", str(tmp_path)], capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr
  for name in ("index.html", "model.js", "model.wasm", "model.d.ts", "model.json", "text.html", "lm.js", "lm.wasm",
               "lm.d.ts", "lm.json", "lm.safetensors", "lm_vocab.json"):
    assert (tmp_path / name).exists(), name
  assert 'import { load } from "./model.js"' in (tmp_path / "index.html").read_text()
  assert 'import { load } from "./lm.js"' in (tmp_path / "text.html").read_text()
  assert 'href="text.html"' in (tmp_path / "index.html").read_text() and 'href="index.html"' in (tmp_path / "text.html").read_text()


def test_drawn_seven_is_read_in_the_browser(tmp_path, trained_cnn):
  needs_browser()
  _, model = trained_cnn
  site = tmp_path / "site"
  web.export_page(model, site)
  screenshot = tmp_path / "web_demo.png"
  with opened_page(tmp_path, site, "index.html") as (page, errors):
    box = page.locator("#pad").bounding_box()
    at = lambda x, y: (box["x"] + x * box["width"] / 280, box["y"] + y * box["height"] / 280)
    # a 7: the top bar left to right, then the slanted stem down to the bottom left
    strokes = [[(75, 60), (205, 60)], [(205, 60), (120, 235)]]
    for stroke in strokes:
      page.mouse.move(*at(*stroke[0]))
      page.mouse.down()
      for t in np.linspace(0, 1, 12)[1:]:
        page.mouse.move(*at(*[a + (b - a) * t for a, b in zip(*stroke)]))
      page.mouse.up()
    page.wait_for_function("window.lastProbs && document.getElementById('prediction').dataset.digit !== ''")
    shown = int(page.locator("#prediction").inner_text())
    pixels = np.array(page.evaluate("window.lastPixels"), dtype=np.float32).reshape(1, 1, 28, 28)
    page_probs = np.array(page.evaluate("window.lastProbs"), dtype=np.float32)
    save_screenshot(page, screenshot)
  assert not errors, errors
  assert pixels.max() == 1.0 and 40 < (pixels > 0.5).sum() < 400, "the page rasterized the drawing into a digit-sized image"
  python_probs = web.probabilities(nn.eval(model))(Tensor(pixels)).numpy()[0]
  np.testing.assert_allclose(page_probs, python_probs, rtol=1e-4, atol=1e-5)
  assert shown == int(python_probs.argmax())
  assert shown == 7, f"the quick CNN read the drawn 7 as {shown} ({python_probs.round(3)})"
  assert screenshot.stat().st_size > 10_000


def test_text_page_generates_the_greedy_continuation(tmp_path, trained_lm):
  needs_browser()
  _, model, data = trained_lm
  site = tmp_path / "site"
  webtext.export_text_page(model, data, site)
  prompt, length = "The default ", 120
  screenshot = tmp_path / "web_text.png"
  with opened_page(tmp_path, site, "text.html") as (page, errors):
    page.fill("#prompt", "")
    page.type("#prompt", prompt)
    page.fill("#temperature", "0")
    page.fill("#length", str(length))
    page.click("#generate")
    # characters appear while it runs: some are on the page before the last one is
    page.wait_for_function("window.generated && window.generated.length > 0", timeout=30000)
    partial = len(page.evaluate("window.generated"))
    page.wait_for_function("window.generating === false", timeout=60000)
    generated = page.evaluate("window.generated")
    shown = page.locator("#output").inner_text()
    save_screenshot(page, screenshot)
  assert not errors, errors
  want = webtext.greedy_continuation(model, data, prompt, length)
  assert len(generated) == length
  if generated != want: _assert_near_tie(model, data, prompt, generated, want)
  assert partial < length, "the page showed the text only when all of it was there"
  assert shown.replace("\n", "") == (prompt + want).replace("\n", "")
  assert len(set(want)) > 3, f"the quick LSTM writes one repeated character: {want!r}"
  assert screenshot.stat().st_size > 10_000


def _assert_near_tie(model, data, prompt: str, generated: str, want: str) -> None:
  """The page's text may leave Python's only where two characters' logits were a float rounding apart (the
  wasm's kernels add in another order): at the first difference, both must be within 1e-4 of the top logit."""
  k = next(i for i, (a, b) in enumerate(zip(generated, want)) if a != b)
  logits = model(Tensor([data.encode(prompt + want[:k])]))[0].numpy()[0, -1]
  top = logits.max()
  gaps = [top - logits[data.index[ch]] for ch in (generated[k], want[k])]
  assert max(gaps) < 1e-4, f"the page wrote {generated[k]!r} where Python's greedy text has {want[k]!r} (logit gaps {gaps}) " \
                           f"after {k} characters:\n{generated!r}\n{want!r}"
