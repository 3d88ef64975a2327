"""Datasets as numpy arrays: MNIST, and a small stand-in made from scikit-learn's digits.

in: a folder holding the four standard MNIST IDX `.gz` files, or nothing (then $TINYCHAD_DATA, then the
    cache ~/.cache/tinychad/mnist, then a download into that cache)
out: (X_train uint8 (60000, 1, 28, 28), Y_train int64 (60000,), X_test uint8 (10000, 1, 28, 28), Y_test int64 (10000,))
digits_28x28() returns the same four arrays (1438 train, 359 test) for machines that have no MNIST at all.
The lead exposes these functions as tinychad.nn.datasets too.
"""
from __future__ import annotations
import gzip
import hashlib
import http.client
import os
import urllib.request
import zlib
from pathlib import Path
import numpy as np
from tinychad.helpers import atomic_open

MNIST_MIRRORS = ("https://ossci-datasets.s3.amazonaws.com/mnist/", "https://storage.googleapis.com/cvdf-datasets/mnist/")
DOWNLOAD_TIMEOUT_S = 15.0

# file name -> (IDX magic number, the shape its header must declare)
MNIST_FILES: dict[str, tuple[int, tuple[int, ...]]] = {
  "train-images-idx3-ubyte.gz": (0x803, (60000, 28, 28)),
  "train-labels-idx1-ubyte.gz": (0x801, (60000,)),
  "t10k-images-idx3-ubyte.gz": (0x803, (10000, 28, 28)),
  "t10k-labels-idx1-ubyte.gz": (0x801, (10000,)),
}

# md5 of each .gz as distributed. The train images accept two: the original file the mirrors serve, and the
# rebuilt copy in the project's shared folder (same pixels, gzipped again, so its bytes differ).
MNIST_MD5: dict[str, frozenset[str]] = {
  "train-images-idx3-ubyte.gz": frozenset({"f68b3c2dcbeaaa9fbdd348bbdeb94873", "56f11203c65dcbeead45b51e76a4d637"}),
  "train-labels-idx1-ubyte.gz": frozenset({"d53e105ee54ea40749a09fcbcd1e9432"}),
  "t10k-images-idx3-ubyte.gz": frozenset({"9fb629c4189551a2d022fa330f9573f3"}),
  "t10k-labels-idx1-ubyte.gz": frozenset({"ec29112dd5afa0611ce80d1b7f02629c"}),
}

_IDX_UBYTE = 0x08  # the IDX type code for unsigned bytes, the only one MNIST uses
_CHUNK_BYTES = 1 << 20


class DatasetUnavailable(FileNotFoundError):
  """The dataset is neither on disk nor downloadable; the message says where we looked."""


class _BadChecksum(Exception):
  """A mirror served bytes whose md5 is not the file's: try the next mirror."""


def cache_dir() -> Path:
  """Where downloaded MNIST lives: ~/.cache/tinychad/mnist, or $TINYCHAD_CACHE/mnist."""
  return Path(os.environ.get("TINYCHAD_CACHE") or Path.home() / ".cache" / "tinychad") / "mnist"


def parse_idx(path: str | os.PathLike, magic: int, shape: tuple[int, ...]) -> np.ndarray:
  """Read a gzipped IDX file of unsigned bytes; ValueError naming the file if it is corrupt, truncated or not `shape`."""
  try:
    with gzip.open(path, "rb") as f: raw = f.read()
  except (gzip.BadGzipFile, EOFError, zlib.error) as e:
    raise ValueError(f"{path}: not a complete gzip file ({e})") from e
  ndim = magic & 0xFF
  header_bytes = 4 + 4 * ndim
  if len(raw) < header_bytes: raise ValueError(f"{path}: {len(raw)} bytes is shorter than the IDX header")
  found_magic = int.from_bytes(raw[:4], "big")
  if found_magic != magic: raise ValueError(f"{path}: IDX magic 0x{found_magic:08x}, expected 0x{magic:08x}")
  found_shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
  if found_shape != shape: raise ValueError(f"{path}: IDX header declares shape {found_shape}, expected {shape}")
  payload = len(raw) - header_bytes
  if payload != int(np.prod(shape)): raise ValueError(f"{path}: {payload} data bytes, shape {shape} needs {int(np.prod(shape))}")
  # frombuffer would give a read-only view of `raw`; copy so callers may normalise in place
  return np.frombuffer(raw, dtype=np.uint8, offset=header_bytes).reshape(shape).copy()


def download_file(name: str, dest_dir: Path, timeout_s: float = DOWNLOAD_TIMEOUT_S) -> Path:
  """Fetch one MNIST file from the first mirror that serves it with a known md5, into dest_dir/name.

  The bytes go to a temporary file in dest_dir that replaces dest_dir/name only once its md5 checks out,
  so an interrupted or bad download never leaves a file that a later call would mistake for the real one.
  """
  dest_dir.mkdir(parents=True, exist_ok=True)
  failures = []
  for mirror in MNIST_MIRRORS:
    url = mirror + name
    try:
      with atomic_open(dest_dir / name) as out, urllib.request.urlopen(url, timeout=timeout_s) as response:
        md5 = hashlib.md5()
        while chunk := response.read(_CHUNK_BYTES):
          md5.update(chunk)
          out.write(chunk)
        # raised inside the block, so the bytes are dropped instead of replacing dest_dir/name
        if md5.hexdigest() not in MNIST_MD5[name]:
          raise _BadChecksum(f"md5 {md5.hexdigest()} is not a known md5 of {name}")
      return dest_dir / name
    except _BadChecksum as e:
      failures.append(f"{url}: {e}")
    except (OSError, http.client.HTTPException) as e:  # URLError, timeouts and resets are all OSErrors
      failures.append(f"{url}: {type(e).__name__}: {e}")
  raise DatasetUnavailable(f"could not download {name}:\n  " + "\n  ".join(failures))


def _locate_mnist(data_dir: str | os.PathLike | None) -> Path:
  """The folder holding all four files, downloading missing ones into the cache only when no folder was named."""
  named = data_dir if data_dir is not None else os.environ.get("TINYCHAD_DATA")
  if named:
    # A named folder is a promise that the files are there: tests and CI name one and must never download
    folder = Path(named)
    missing = [name for name in MNIST_FILES if not (folder / name).is_file()]
    if missing:
      source = "data_dir" if data_dir is not None else "$TINYCHAD_DATA"
      raise DatasetUnavailable(f"MNIST files {missing} not found in {folder} (from {source})")
    return folder
  folder = cache_dir()
  failures = []
  for name in MNIST_FILES:
    if (folder / name).is_file(): continue
    try: download_file(name, folder)
    except DatasetUnavailable as e: failures.append(str(e))
  if failures:
    raise DatasetUnavailable(f"MNIST not found in {folder} (no data_dir, $TINYCHAD_DATA unset) and the download failed:\n"
                             + "\n".join(failures))
  return folder


def mnist(data_dir: str | os.PathLike | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """MNIST as (X_train, Y_train, X_test, Y_test): uint8 images (N, 1, 28, 28) in 0..255 and int64 labels (N,)."""
  folder = _locate_mnist(data_dir)
  arrays = {name: parse_idx(folder / name, magic, shape) for name, (magic, shape) in MNIST_FILES.items()}
  for labels_name in ("train-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
    if arrays[labels_name].max() > 9: raise ValueError(f"{folder / labels_name}: label {arrays[labels_name].max()} is not a digit")
  return (arrays["train-images-idx3-ubyte.gz"].reshape(-1, 1, 28, 28), arrays["train-labels-idx1-ubyte.gz"].astype(np.int64),
          arrays["t10k-images-idx3-ubyte.gz"].reshape(-1, 1, 28, 28), arrays["t10k-labels-idx1-ubyte.gz"].astype(np.int64))


def _bilinear_matrix(n_in: int, n_out: int) -> np.ndarray:
  """(n_out, n_in) weights that resample a row of n_in pixels to n_out by linear interpolation, pixel centres aligned."""
  centres = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
  left = np.floor(centres).astype(np.int64)
  right = np.minimum(left + 1, n_in - 1)
  frac = centres - left
  weights = np.zeros((n_out, n_in))
  np.add.at(weights, (np.arange(n_out), left), 1 - frac)
  np.add.at(weights, (np.arange(n_out), right), frac)
  return weights


def digits_28x28(test_fraction: float = 0.2, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """scikit-learn's 1797 8x8 digits laid out like MNIST, split deterministically into (X_train, Y_train, X_test, Y_test).

  Like MNIST, each digit is scaled to a 20x20 box (bilinear) centred in 28x28 with a 4-pixel empty border,
  and its 0..16 intensities become 0..255, so a model built for MNIST runs on it unchanged.
  """
  try:
    from sklearn.datasets import load_digits
  except ImportError as e:
    raise ImportError("digits_28x28 needs scikit-learn (pip install scikit-learn): it reads the digits bundled with it") from e
  digits = load_digits()
  images = digits.images.astype(np.float64) * (255.0 / 16.0)
  resample = _bilinear_matrix(8, 20)
  boxed = np.einsum("ij,njk,lk->nil", resample, images, resample)
  padded = np.zeros((len(images), 1, 28, 28), dtype=np.uint8)
  padded[:, 0, 4:24, 4:24] = np.clip(np.rint(boxed), 0, 255).astype(np.uint8)
  labels = digits.target.astype(np.int64)
  order = np.random.default_rng(seed).permutation(len(labels))
  n_test = int(len(labels) * test_fraction)
  test_idx, train_idx = order[:n_test], order[n_test:]
  return padded[train_idx], labels[train_idx], padded[test_idx], labels[test_idx]
