"""Tests for tinychad.datasets: MNIST from the shared folder, the download path, and the scikit-learn digits fallback.

in: the shared MNIST files ($TINYCHAD_DATA, else ../shared/datasets/mnist beside the repo)  ->  out: pass/fail.
No test touches the network: downloads are served by a fake urllib.request.urlopen reading the shared files.
"""
import gzip
import io
import os
import shutil
import sys
import urllib.error
from pathlib import Path
import numpy as np
import pytest
from tinychad import datasets
from tinychad.datasets import DatasetUnavailable, digits_28x28, download_file, mnist, parse_idx

SHARED_MNIST = Path(os.environ.get("TINYCHAD_DATA") or Path(__file__).resolve().parents[2] / "shared" / "datasets" / "mnist")
# the well-known class counts of MNIST's train and test splits
TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


@pytest.fixture(scope="module")
def shared_mnist():
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("TINYCHAD_DATA", str(SHARED_MNIST))
    return mnist()


@pytest.fixture
def no_network(monkeypatch):
  def refuse(url, *args, **kwargs): raise AssertionError(f"test tried to reach the network: {url}")
  monkeypatch.setattr(datasets.urllib.request, "urlopen", refuse)


def serve_shared_files(calls: list, broken_mirror: str | None = None, mutate=lambda data: data):
  """A fake urlopen answering each mirror URL with the shared file of that name (after `mutate`)."""
  def fake_urlopen(url, timeout=None):
    calls.append((url, timeout))
    if broken_mirror is not None and url.startswith(broken_mirror): raise urllib.error.URLError("mirror down")
    return io.BytesIO(mutate((SHARED_MNIST / url.rsplit("/", 1)[1]).read_bytes()))
  return fake_urlopen


def test_mnist_shapes_dtypes_and_contents(shared_mnist):
  X_train, Y_train, X_test, Y_test = shared_mnist
  assert X_train.shape == (60000, 1, 28, 28) and X_train.dtype == np.uint8
  assert X_test.shape == (10000, 1, 28, 28) and X_test.dtype == np.uint8
  assert Y_train.shape == (60000,) and Y_train.dtype == np.int64
  assert Y_test.shape == (10000,) and Y_test.dtype == np.int64
  assert np.bincount(Y_train).tolist() == TRAIN_COUNTS and np.bincount(Y_test).tolist() == TEST_COUNTS
  assert X_train.min() == 0 and X_train.max() == 255 and X_test.max() == 255
  # the mean pixel of the train set is the 0.1307 that every MNIST normalisation uses
  assert abs(X_train.mean() / 255 - 0.1307) < 1e-3
  assert Y_train[:8].tolist() == [5, 0, 4, 1, 9, 2, 1, 3] and Y_test[:8].tolist() == [7, 2, 1, 0, 4, 1, 4, 9]


def test_data_dir_argument_wins_over_env(shared_mnist, monkeypatch, tmp_path, no_network):
  monkeypatch.setenv("TINYCHAD_DATA", str(tmp_path))
  _, _, X_test, Y_test = mnist(SHARED_MNIST)
  assert np.array_equal(Y_test, shared_mnist[3]) and np.array_equal(X_test, shared_mnist[2])


def test_named_folder_without_files_raises_and_never_downloads(monkeypatch, tmp_path, no_network):
  monkeypatch.setenv("TINYCHAD_DATA", str(tmp_path))
  with pytest.raises(DatasetUnavailable, match=str(tmp_path)) as excinfo: mnist()
  assert isinstance(excinfo.value, FileNotFoundError) and "TINYCHAD_DATA" in str(excinfo.value)
  with pytest.raises(DatasetUnavailable, match="data_dir"): mnist(tmp_path / "absent")


def test_cache_dir_follows_tinychad_cache(monkeypatch, tmp_path):
  monkeypatch.setenv("TINYCHAD_CACHE", str(tmp_path))
  assert datasets.cache_dir() == tmp_path / "mnist"
  monkeypatch.delenv("TINYCHAD_CACHE")
  assert datasets.cache_dir() == Path.home() / ".cache" / "tinychad" / "mnist"


def test_download_into_cache_falls_back_to_second_mirror_then_reuses_cache(shared_mnist, monkeypatch, tmp_path):
  monkeypatch.delenv("TINYCHAD_DATA", raising=False)
  monkeypatch.setenv("TINYCHAD_CACHE", str(tmp_path))
  calls = []
  monkeypatch.setattr(datasets.urllib.request, "urlopen", serve_shared_files(calls, broken_mirror=datasets.MNIST_MIRRORS[0]))
  downloaded = mnist()
  for got, expected in zip(downloaded, shared_mnist): assert np.array_equal(got, expected)
  assert sorted(os.listdir(tmp_path / "mnist")) == sorted(datasets.MNIST_FILES)
  assert len(calls) == 8 and all(0 < timeout <= 60 for _, timeout in calls)
  assert {url.rsplit("/", 1)[0] + "/" for url, _ in calls} == set(datasets.MNIST_MIRRORS)
  # the second load reads the cache alone
  monkeypatch.setattr(datasets.urllib.request, "urlopen", serve_shared_files(calls := []))
  assert np.array_equal(mnist()[3], shared_mnist[3]) and calls == []


def test_download_only_fetches_missing_files(monkeypatch, tmp_path):
  monkeypatch.delenv("TINYCHAD_DATA", raising=False)
  monkeypatch.setenv("TINYCHAD_CACHE", str(tmp_path))
  (tmp_path / "mnist").mkdir()
  for name in datasets.MNIST_FILES:
    if name != "t10k-labels-idx1-ubyte.gz": shutil.copy(SHARED_MNIST / name, tmp_path / "mnist" / name)
  calls = []
  monkeypatch.setattr(datasets.urllib.request, "urlopen", serve_shared_files(calls))
  assert mnist()[3].shape == (10000,)
  assert [url for url, _ in calls] == [datasets.MNIST_MIRRORS[0] + "t10k-labels-idx1-ubyte.gz"]


def test_md5_mismatch_is_rejected_and_leaves_no_file(monkeypatch, tmp_path):
  def flip_last_byte(data: bytes) -> bytes: return data[:-1] + bytes([data[-1] ^ 0xFF])
  monkeypatch.setattr(datasets.urllib.request, "urlopen", serve_shared_files(calls := [], mutate=flip_last_byte))
  with pytest.raises(DatasetUnavailable, match="md5") as excinfo: download_file("t10k-labels-idx1-ubyte.gz", tmp_path)
  assert all(mirror in str(excinfo.value) for mirror in datasets.MNIST_MIRRORS) and len(calls) == 2
  assert os.listdir(tmp_path) == []


def test_interrupted_download_leaves_no_partial_file(monkeypatch, tmp_path):
  class DyingResponse(io.BytesIO):
    """Hands out the first chunk of the real file, then the connection drops."""
    def read(self, size=-1):
      if self.tell() > 0: raise ConnectionResetError("connection reset by peer")
      return super().read(1000)
  good = (SHARED_MNIST / "t10k-labels-idx1-ubyte.gz").read_bytes()
  monkeypatch.setattr(datasets.urllib.request, "urlopen", lambda url, timeout=None: DyingResponse(good))
  with pytest.raises(DatasetUnavailable, match="ConnectionResetError"): download_file("t10k-labels-idx1-ubyte.gz", tmp_path)
  assert os.listdir(tmp_path) == []


def test_nothing_found_and_no_network_says_where_it_looked(monkeypatch, tmp_path):
  monkeypatch.delenv("TINYCHAD_DATA", raising=False)
  monkeypatch.setenv("TINYCHAD_CACHE", str(tmp_path))
  def offline(url, timeout=None): raise urllib.error.URLError("no route to host")
  monkeypatch.setattr(datasets.urllib.request, "urlopen", offline)
  with pytest.raises(DatasetUnavailable, match=str(tmp_path / "mnist")) as excinfo: mnist()
  assert "no route to host" in str(excinfo.value)
  assert os.listdir(tmp_path / "mnist") == []


def test_truncated_gzip_is_a_value_error_naming_the_file(tmp_path):
  truncated = tmp_path / "t10k-labels-idx1-ubyte.gz"
  data = (SHARED_MNIST / "t10k-labels-idx1-ubyte.gz").read_bytes()
  truncated.write_bytes(data[:len(data) // 2])
  with pytest.raises(ValueError, match="t10k-labels-idx1-ubyte.gz"): parse_idx(truncated, 0x801, (10000,))


def test_short_payload_wrong_magic_and_wrong_shape_are_value_errors(tmp_path):
  labels = gzip.decompress((SHARED_MNIST / "t10k-labels-idx1-ubyte.gz").read_bytes())
  path = tmp_path / "labels.gz"
  path.write_bytes(gzip.compress(labels[:-1]))
  with pytest.raises(ValueError, match="labels.gz.*9999 data bytes"): parse_idx(path, 0x801, (10000,))
  path.write_bytes(gzip.compress(labels))
  with pytest.raises(ValueError, match="magic"): parse_idx(path, 0x803, (10000, 28, 28))
  with pytest.raises(ValueError, match="shape"): parse_idx(path, 0x801, (60000,))
  path.write_bytes(gzip.compress(labels[:6]))
  with pytest.raises(ValueError, match="header"): parse_idx(path, 0x801, (10000,))
  path.write_bytes(b"not gzip at all")
  with pytest.raises(ValueError, match="labels.gz"): parse_idx(path, 0x801, (10000,))


def test_corrupt_file_in_data_dir_fails_mnist_with_its_name(tmp_path):
  for name in datasets.MNIST_FILES: shutil.copy(SHARED_MNIST / name, tmp_path / name)
  data = (tmp_path / "train-images-idx3-ubyte.gz").read_bytes()
  (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(data[:1000])
  with pytest.raises(ValueError, match="train-images-idx3-ubyte.gz"): mnist(tmp_path)


def test_digits_28x28_looks_like_mnist_and_is_deterministic():
  X_train, Y_train, X_test, Y_test = digits_28x28()
  assert X_train.shape == (1438, 1, 28, 28) and X_test.shape == (359, 1, 28, 28)
  assert X_train.dtype == np.uint8 and Y_train.dtype == np.int64 and Y_test.dtype == np.int64
  assert Y_train.shape == (1438,) and Y_test.shape == (359,)
  assert set(Y_train.tolist()) == set(range(10)) and set(Y_test.tolist()) == set(range(10))
  assert X_train.max() == 255
  # MNIST's 4-pixel empty border around a 20x20 digit box
  assert X_train[:, :, :4].max() == 0 and X_train[:, :, 24:].max() == 0
  assert X_train[:, :, :, :4].max() == 0 and X_train[:, :, :, 24:].max() == 0
  for first, second in zip((X_train, Y_train, X_test, Y_test), digits_28x28()): assert np.array_equal(first, second)
  # the seed picks the split: another seed moves other images into the test set
  assert not np.array_equal(digits_28x28(seed=1)[3], Y_test)


def test_digits_28x28_without_scikit_learn_says_what_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, "sklearn", None)
  monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
  with pytest.raises(ImportError, match="scikit-learn"): digits_28x28()
