"""tinychad.models.vit against a PyTorch twin written here in plain torch.nn with timm's VisionTransformer
structure and names (timm isn't installed): a checkpoint the twin saves with safetensors.torch loads by name,
then logits, loss, every parameter's gradient and three AdamW steps' losses agree.
"""
from __future__ import annotations
import numpy as np
import pytest
import torch
import torch.nn as tnn
import torch.nn.functional as tF
from tinychad import Tensor
from tinychad.models import ViT, ViTConfig
from tinychad.nn.optim import AdamW
from model_reference import assert_close, assert_same_grads, assert_same_training, load_twin, to_torch


# ---- the twin: timm.models.vision_transformer.VisionTransformer (class-token pooling, no dropout) ----
class TAttention(tnn.Module):
  def __init__(self, dim, heads):
    super().__init__()
    self.heads = heads
    self.qkv, self.proj = tnn.Linear(dim, dim * 3), tnn.Linear(dim, dim)

  def forward(self, x):
    B, N, C = x.shape
    q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
    return self.proj(tF.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, C))


class TMlp(tnn.Module):
  def __init__(self, dim, hidden):
    super().__init__()
    self.fc1, self.fc2 = tnn.Linear(dim, hidden), tnn.Linear(hidden, dim)

  def forward(self, x): return self.fc2(tF.gelu(self.fc1(x)))


class TBlock(tnn.Module):
  def __init__(self, dim, heads, mlp_ratio):
    super().__init__()
    self.norm1, self.attn = tnn.LayerNorm(dim, eps=1e-6), TAttention(dim, heads)
    self.norm2, self.mlp = tnn.LayerNorm(dim, eps=1e-6), TMlp(dim, int(dim * mlp_ratio))

  def forward(self, x):
    x = x + self.attn(self.norm1(x))
    return x + self.mlp(self.norm2(x))


class TPatchEmbed(tnn.Module):
  def __init__(self, patch, in_chans, dim):
    super().__init__()
    self.proj = tnn.Conv2d(in_chans, dim, patch, patch)

  def forward(self, x): return self.proj(x).flatten(2).transpose(1, 2)


class TViT(tnn.Module):
  def __init__(self, c: ViTConfig):
    super().__init__()
    self.patch_embed = TPatchEmbed(c.patch_size, c.in_chans, c.embed_dim)
    self.cls_token = tnn.Parameter(torch.randn(1, 1, c.embed_dim) * 0.02)
    self.pos_embed = tnn.Parameter(torch.randn(1, (c.img_size // c.patch_size) ** 2 + 1, c.embed_dim) * 0.02)
    self.blocks = tnn.Sequential(*[TBlock(c.embed_dim, c.num_heads, c.mlp_ratio) for _ in range(c.depth)])
    self.norm = tnn.LayerNorm(c.embed_dim, eps=1e-6)
    self.head = tnn.Linear(c.embed_dim, c.num_classes)

  def forward(self, x):
    x = self.patch_embed(x)
    x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
    return self.head(self.norm(self.blocks(x))[:, 0])


CONFIG = ViTConfig(img_size=16, patch_size=4, in_chans=3, num_classes=5, embed_dim=32, depth=2, num_heads=4)


def twin_pair(tmp_path, config: ViTConfig = CONFIG) -> tuple[ViT, TViT]:
  torch.manual_seed(0)
  twin = TViT(config)
  with torch.no_grad():   # LayerNorms off the identity, so loading them is checked too
    for m in twin.modules():
      if isinstance(m, tnn.LayerNorm): m.weight.uniform_(0.5, 1.5), m.bias.uniform_(-0.2, 0.2)
  model = ViT(config)
  load_twin(model, twin, tmp_path / "vit.safetensors")
  return model, twin


def test_timm_names_and_shapes():
  model = ViT(ViTConfig.base())
  ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
  # timm's vit_base_patch16_224: 152 tensors, 86,567,656 parameters
  assert len(ours) == 152 and sum(int(np.prod(s)) for s in ours.values()) == 86_567_656
  assert ours["patch_embed.proj.weight"] == (768, 3, 16, 16) and ours["cls_token"] == (1, 1, 768)
  assert ours["pos_embed"] == (1, 197, 768) and ours["blocks.11.attn.qkv.weight"] == (2304, 768)
  assert {"blocks.0.norm1.weight", "blocks.0.attn.proj.bias", "blocks.0.norm2.bias", "blocks.0.mlp.fc1.weight",
          "blocks.0.mlp.fc2.bias", "norm.weight", "head.weight"} <= set(ours)
  assert {k: tuple(v.shape) for k, v in TViT(CONFIG).state_dict().items()} == \
         {k: tuple(v.shape) for k, v in ViT(CONFIG).state_dict().items()}


def test_matches_pytorch_twin(tmp_path):
  model, twin = twin_pair(tmp_path)
  rng = np.random.default_rng(0)
  x = rng.standard_normal((3, 3, 16, 16)).astype(np.float32)
  y = rng.integers(0, 5, 3)
  out, torch_out = model(Tensor(x)), twin(to_torch(x))
  assert_close(out.numpy(), torch_out.detach().numpy(), "logits", rtol=1e-4, atol_scale=1e-5)
  loss, torch_loss = out.cross_entropy(Tensor(y)), tF.cross_entropy(torch_out, torch.from_numpy(y))
  np.testing.assert_allclose(loss.item(), torch_loss.item(), rtol=1e-5)
  loss.backward(), torch_loss.backward()
  assert assert_same_grads(model, twin) == 4 + 12 * CONFIG.depth + 4


def test_adamw_steps_match_pytorch(tmp_path):
  model, twin = twin_pair(tmp_path)
  rng = np.random.default_rng(1)
  x = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
  y = rng.integers(0, 5, 4)
  losses = assert_same_training(model, twin, lambda m: m(Tensor(x)).cross_entropy(Tensor(y)),
                                lambda t: tF.cross_entropy(t(to_torch(x)), torch.from_numpy(y)),
                                lambda m: AdamW(m.parameters(), lr=3e-3, weight_decay=0.05),
                                lambda t: torch.optim.AdamW(t.parameters(), lr=3e-3, weight_decay=0.05))
  assert losses[-1] < losses[0]


def test_mnist_config_and_bad_input():
  model = ViT(ViTConfig.mnist())
  assert model(Tensor.zeros(2, 1, 28, 28)).shape == (2, 10)
  with pytest.raises(ValueError, match=r"ViT: expected images \(N, 1, 28, 28\), got shape \(2, 1, 32, 32\)"):
    model(Tensor.zeros(2, 1, 32, 32))
  with pytest.raises(ValueError, match="img_size 30 must divide by patch_size 7"): ViT(ViTConfig.mnist(img_size=30))
  with pytest.raises(ValueError, match="embed_dim 64 must divide by num_heads 5"): ViT(ViTConfig.mnist(num_heads=5))
