"""A model file written for PyTorch runs on tinychad by changing only its imports (issue 23), and matches PyTorch's
outputs, gradients and optimizer steps: a forward method, nn.ReLU, ModuleList/ModuleDict, nn.Parameter,
register_buffer (persistent or not), dim= keywords, per-module eval, parameter groups."""
from __future__ import annotations
import numpy as np
import pytest
import torch as real_torch

MODEL_FILE = '''
class Block(nn.Module):
  def __init__(self, dim, hidden, p):
    super().__init__()
    self.fc1 = nn.Linear(dim, hidden)
    self.act = nn.ReLU()
    self.fc2 = nn.Linear(hidden, dim)
    self.drop = nn.Dropout(p)
    self.norm = nn.LayerNorm(dim)

  def forward(self, x):
    return self.norm(x + self.drop(self.fc2(self.act(self.fc1(x)))))


class TinyTransformer(nn.Module):
  def __init__(self, vocab=11, dim=16, blocks=2, seq=6, classes=3):
    super().__init__()
    self.embed = nn.Embedding(vocab, dim)
    self.pos = nn.Parameter(torch.zeros(seq, dim))
    # no bias: the key projection's bias has a zero gradient (softmax ignores a shift), which Adam would turn from
    # rounding noise into full steps of either sign
    self.attn = nn.MultiheadAttention(dim, 2, batch_first=True, bias=False)
    self.blocks = nn.ModuleList([Block(dim, 32, 0.5) for _ in range(blocks)])
    self.heads = nn.ModuleDict({"cls": nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, classes))})
    self.register_buffer("causal", torch.ones(seq, seq).triu(1).bool())
    self.register_buffer("scale", torch.ones(1) * 0.5, persistent=False)

  def forward(self, idx):
    x = self.embed(idx) + self.pos
    attended, _ = self.attn(x, x, x, attn_mask=self.causal, need_weights=False)
    x = x + attended
    for block in self.blocks:
      x = block(x)
    x = F.silu(x) * self.scale
    pooled = x.max(dim=1).values + x.mean(dim=1, keepdim=False)
    return F.log_softmax(self.heads["cls"](pooled), dim=-1)


def make_optimizer(model):
  decay = [p for name, p in model.named_parameters() if p.dim() >= 2]
  no_decay = [p for name, p in model.named_parameters() if p.dim() < 2]
  return optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0, "lr": 3e-3}], lr=1e-2)


def train_step(model, opt, idx, target):
  opt.zero_grad()
  loss = F.nll_loss(model(idx), target)
  loss.backward()
  opt.step()
  return loss
'''

TORCH_IMPORTS = "import torch\nfrom torch import nn\nimport torch.nn.functional as F\nimport torch.optim as optim\n"
TINYCHAD_IMPORTS = "from tinychad import Tensor as torch\nfrom tinychad import nn\nimport tinychad.nn.functional as F\nimport tinychad.nn.optim as optim\n"

IDX = np.random.default_rng(0).integers(0, 11, (4, 6))
TARGET = np.array([0, 2, 1, 2])


def load(imports: str) -> dict:
  namespace: dict = {}
  exec(compile(imports + MODEL_FILE, "model.py", "exec"), namespace)
  return namespace


@pytest.mark.usefixtures("each_device")
def test_pytorch_model_file_ports_by_its_imports():
  from tinychad import Tensor
  theirs_ns, ours_ns = load(TORCH_IMPORTS), load(TINYCHAD_IMPORTS)
  real_torch.manual_seed(0)
  theirs, ours = theirs_ns["TinyTransformer"](), ours_ns["TinyTransformer"]()
  assert list(ours.state_dict()) == list(theirs.state_dict())   # "scale" is not persistent in either
  ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
  for model in (theirs, ours):
    model.train()
    model.blocks.eval()   # per module: the blocks' dropout is off while the rest trains
  assert ours.training and not ours.blocks[0].drop.training

  idx_t, target_t = real_torch.tensor(IDX), real_torch.tensor(TARGET)
  idx_o, target_o = Tensor(IDX), Tensor(TARGET)
  np.testing.assert_allclose(ours(idx_o).numpy(), theirs(idx_t).detach().numpy(), atol=1e-5, rtol=1e-5)

  opt_t, opt_o = theirs_ns["make_optimizer"](theirs), ours_ns["make_optimizer"](ours)
  assert [len(g["params"]) for g in opt_o.param_groups] == [len(g["params"]) for g in opt_t.param_groups]
  for step in range(3):
    loss_t = theirs_ns["train_step"](theirs, opt_t, idx_t, target_t)
    loss_o = ours_ns["train_step"](ours, opt_o, idx_o, target_o)
    np.testing.assert_allclose(loss_o.item(), loss_t.item(), atol=1e-5, rtol=1e-5, err_msg=f"loss at step {step}")
    if step == 0:   # the gradients of the first step, before any update
      ours_params = dict(ours.named_parameters())
      for name, p in theirs.named_parameters():
        np.testing.assert_allclose(ours_params[name].grad.numpy(), p.grad.numpy(), atol=1e-5, rtol=1e-4, err_msg=f"grad {name}")
  ours_params = dict(ours.named_parameters())
  for name, p in theirs.named_parameters():
    np.testing.assert_allclose(ours_params[name].numpy(), p.detach().numpy(), atol=1e-5, rtol=1e-4, err_msg=f"{name} after 3 steps")
  np.testing.assert_array_equal(ours.causal.numpy(), theirs.causal.numpy())   # buffers untouched by the optimizer
