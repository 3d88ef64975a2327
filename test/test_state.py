"""State dicts and safetensors files: names as PyTorch's, round trips both ways with PyTorch, clear errors
for bad files and bad state dicts, and atomic saves."""
from __future__ import annotations
import os
import numpy as np
import pytest
import safetensors.torch
import torch
from tinychad import Tensor, dtypes, nn
from tinychad.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save


class Net(nn.Module):
  """conv -> batchnorm -> linear, plus an LSTM on the side: the layers whose names and layouts matter most."""
  def __init__(self):
    self.conv = nn.Conv2d(2, 3, 3)
    self.bn = nn.BatchNorm2d(3)
    self.fc = nn.Linear(3 * 4 * 4, 5)
    self.lstm = nn.LSTM(5, 4, num_layers=2, batch_first=True)

  def __call__(self, x: Tensor, seq: Tensor) -> tuple[Tensor, Tensor]:
    return self.fc(self.bn(self.conv(x)).relu().flatten(1)), self.lstm(seq)[0]


class TorchNet(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.conv = torch.nn.Conv2d(2, 3, 3)
    self.bn = torch.nn.BatchNorm2d(3)
    self.fc = torch.nn.Linear(3 * 4 * 4, 5)
    self.lstm = torch.nn.LSTM(5, 4, num_layers=2, batch_first=True)

  def forward(self, x, seq):
    return self.fc(self.bn(self.conv(x)).relu().flatten(1)), self.lstm(seq)[0]


X = np.random.default_rng(0).standard_normal((2, 2, 6, 6)).astype(np.float32)
SEQ = np.random.default_rng(1).standard_normal((2, 3, 5)).astype(np.float32)


def outputs_ours(model: Net) -> list[np.ndarray]:
  return [t.numpy() for t in model(Tensor(X), Tensor(SEQ))]


def outputs_torch(model: TorchNet) -> list[np.ndarray]:
  model.eval()
  with torch.no_grad(): return [t.numpy() for t in model(torch.tensor(X), torch.tensor(SEQ))]


def torch_with_running_stats() -> TorchNet:
  """A PyTorch model whose batchnorm running stats are not the defaults, so loading them is tested too."""
  model = TorchNet()
  model.train()
  model(torch.tensor(X), torch.tensor(SEQ))
  return model


def test_names_match_pytorch():
  assert list(get_state_dict(Net())) == list(TorchNet().state_dict())


def test_names_of_lists_dicts_and_private_attributes():
  class Model:
    def __init__(self):
      self.layers = [nn.Linear(2, 2), nn.Linear(2, 2, bias=False)]
      self.heads = {"a": nn.Linear(2, 1)}
      self.shared = self.layers[0].weight   # tied: a second name for the same tensor
      self._cache = Tensor.zeros(3)         # private: not state
  model = Model()
  assert list(get_state_dict(model)) == ["layers.0.weight", "layers.0.bias", "layers.1.weight", "heads.a.weight", "heads.a.bias", "shared"]
  assert len(get_parameters(model)) == 5  # the tied weight counted once


def test_roundtrip_tinychad_file_tinychad(tmp_path):
  a = Net()
  nn.train()
  try: a(Tensor(X), Tensor(SEQ))  # move the running stats and the int64 counter off their defaults
  finally: nn.eval()
  safe_save(get_state_dict(a), tmp_path / "net.safetensors")
  b = Net()
  load_state_dict(b, safe_load(tmp_path / "net.safetensors"))
  for (name, ta), tb in zip(get_state_dict(a).items(), get_state_dict(b).values()):
    assert ta.dtype == tb.dtype and ta.shape == tb.shape, name
    np.testing.assert_array_equal(ta.numpy(), tb.numpy(), err_msg=name)
  assert b.bn.num_batches_tracked.dtype == dtypes.int64 and b.bn.num_batches_tracked.item() == 1
  for oa, ob in zip(outputs_ours(a), outputs_ours(b)): np.testing.assert_array_equal(oa, ob)


def test_pytorch_to_safetensors_to_tinychad(tmp_path):
  theirs = torch_with_running_stats()
  safetensors.torch.save_file(theirs.state_dict(), tmp_path / "torch.safetensors")
  ours = Net()
  load_state_dict(ours, safe_load(tmp_path / "torch.safetensors"))
  for o, t in zip(outputs_ours(ours), outputs_torch(theirs)): np.testing.assert_allclose(o, t, atol=1e-5, rtol=1e-5)


def test_tinychad_to_safetensors_to_pytorch(tmp_path):
  ours = Net()
  load_state_dict(ours.bn, {"running_mean": np.full(3, 0.5, np.float32), "running_var": np.full(3, 2.0, np.float32),
                            "weight": np.array([1, 2, 3], np.float32), "bias": np.array([0, -1, 1], np.float32),
                            "num_batches_tracked": np.array(7)})
  safe_save(get_state_dict(ours), tmp_path / "ours.safetensors")
  theirs = TorchNet()
  theirs.load_state_dict(safetensors.torch.load_file(tmp_path / "ours.safetensors"), strict=True)
  for o, t in zip(outputs_ours(ours), outputs_torch(theirs)): np.testing.assert_allclose(o, t, atol=1e-5, rtol=1e-5)


def test_load_state_dict_errors_list_every_problem():
  sd = {k: v.numpy() for k, v in get_state_dict(Net()).items()}
  del sd["fc.bias"]
  sd["fc.weight"] = np.zeros((5, 7), np.float32)
  sd["extra.weight"] = np.zeros(2, np.float32)
  with pytest.raises(RuntimeError) as e: load_state_dict(Net(), sd)
  message = str(e.value)
  assert "fc.weight: the file has shape (5, 7), the model (5, 48)" in message
  assert "missing keys" in message and "fc.bias" in message
  assert "unexpected keys" in message and "extra.weight" in message


def test_load_state_dict_not_strict_reports_and_keeps_identity():
  model = Net()
  weight = model.fc.weight
  result = load_state_dict(model, {"fc.weight": np.ones((5, 48), np.float32), "other": np.zeros(1)}, strict=False)
  assert "fc.bias" in result.missing_keys and result.unexpected_keys == ["other"]
  assert model.fc.weight is weight and (weight.numpy() == 1).all()  # in place: an optimizer holding it still works
  with pytest.raises(RuntimeError, match="shape"): load_state_dict(model, {"fc.weight": np.ones((1, 48), np.float32)}, strict=False)


def test_bad_files_give_clear_errors(tmp_path):
  good = tmp_path / "good.safetensors"
  safe_save(get_state_dict(nn.Linear(3, 2)), good)
  data = good.read_bytes()
  truncated = tmp_path / "truncated.safetensors"
  truncated.write_bytes(data[:len(data) - 5])
  with pytest.raises(ValueError, match="truncated.safetensors: not a valid safetensors file"): safe_load(truncated)
  garbage = tmp_path / "garbage.safetensors"
  garbage.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
  with pytest.raises(ValueError, match="not a valid safetensors file"): safe_load(garbage)
  empty = tmp_path / "empty.safetensors"
  empty.write_bytes(b"")
  with pytest.raises(ValueError, match="not a valid safetensors file"): safe_load(empty)


def test_pickles_are_refused_not_loaded(tmp_path):
  path = tmp_path / "model.pt"
  torch.save(TorchNet().state_dict(), path)
  with pytest.raises(ValueError, match="never unpickles"): safe_load(path)


def test_unsupported_dtype_is_named(tmp_path):
  path = tmp_path / "bf16.safetensors"
  safetensors.torch.save_file({"w": torch.zeros(2, dtype=torch.bfloat16)}, path)
  with pytest.raises(ValueError, match="bf16.safetensors"): safe_load(path)


def test_missing_keys_in_a_file(tmp_path):
  path = tmp_path / "partial.safetensors"
  safe_save({"weight": Tensor.zeros(2, 3)}, path)
  with pytest.raises(RuntimeError, match=r"missing keys .*\['bias'\]"): load_state_dict(nn.Linear(3, 2), safe_load(path))


def test_atomic_save_survives_a_crash_mid_save(tmp_path, monkeypatch):
  path = tmp_path / "weights.safetensors"
  safe_save({"w": Tensor.ones(4)}, path)
  before = path.read_bytes()

  def crash(fd):
    raise OSError("disk full (simulated crash mid-save)")
  monkeypatch.setattr(os, "fsync", crash)
  with pytest.raises(OSError, match="simulated"): safe_save({"w": Tensor.zeros(4), "v": Tensor.zeros(1000)}, path)
  assert path.read_bytes() == before
  assert sorted(p.name for p in tmp_path.iterdir()) == ["weights.safetensors"]  # no temporary file left behind
  np.testing.assert_array_equal(safe_load(path)["w"].numpy(), np.ones(4))


def test_safe_save_refuses_non_tensors(tmp_path):
  with pytest.raises(TypeError, match="not a Tensor"): safe_save({"w": np.zeros(2)}, tmp_path / "x.safetensors")
