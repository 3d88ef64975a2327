"""ViT, the Vision Transformer (Dosovitskiy et al. 2020), with timm's names so its checkpoints load as they are.

in: images (N, in_chans, H, W) float32  ->  out: logits (N, num_classes).
The image is cut into patch_size x patch_size patches, each projected to embed_dim (a strided conv), a learned
class token is put in front, learned positions are added, then `depth` pre-LN transformer blocks
(x + attn(norm1(x)), x + mlp(norm2(x))), a final LayerNorm, and the head reads the class token.
Names follow timm's VisionTransformer: patch_embed.proj, cls_token, pos_embed, blocks.N.norm1, blocks.N.attn.qkv,
blocks.N.attn.proj, blocks.N.norm2, blocks.N.mlp.fc1, blocks.N.mlp.fc2, norm, head (LayerNorm eps 1e-6, qkv with
a bias, exact GELU, as timm's vit_*_patch16_224), so `ViT(ViTConfig.base(), weights="vit.safetensors")` loads a
timm state dict saved with safetensors.torch.

ViTConfig.tiny() and .small() are timm's ViT-Ti/16 and ViT-S/16; ViTConfig.mnist() is a 4-block, 64-wide model
on 7x7 patches of a 28x28 digit (16 tokens + the class token) that trains on 2 CPU cores in minutes.
"""
from __future__ import annotations
import os
from dataclasses import dataclass
from tinychad import nn
from tinychad.nn import functional as F
from tinychad.nn.state import load_weights
from tinychad.tensor import Tensor


@dataclass
class ViTConfig:
  img_size: int = 224
  patch_size: int = 16
  in_chans: int = 3
  num_classes: int = 1000
  embed_dim: int = 768
  depth: int = 12
  num_heads: int = 12
  mlp_ratio: float = 4.0
  dropout: float = 0.0       # after the positions, the attention projection and the MLP (timm's proj_drop)
  attn_dropout: float = 0.0  # on the attention weights

  @staticmethod
  def base(**kw) -> ViTConfig: return ViTConfig(**kw)

  @staticmethod
  def small(**kw) -> ViTConfig: return ViTConfig(**{"embed_dim": 384, "depth": 12, "num_heads": 6, **kw})

  @staticmethod
  def tiny(**kw) -> ViTConfig: return ViTConfig(**{"embed_dim": 192, "depth": 12, "num_heads": 3, **kw})

  @staticmethod
  def mnist(**kw) -> ViTConfig:
    return ViTConfig(**{"img_size": 28, "patch_size": 7, "in_chans": 1, "num_classes": 10, "embed_dim": 64,
                        "depth": 4, "num_heads": 4, "mlp_ratio": 2.0, **kw})


class PatchEmbed(nn.Module):
  """(N, C, H, W) -> (N, patches, embed_dim): a conv whose kernel and stride are the patch size."""
  def __init__(self, config: ViTConfig):
    if config.img_size % config.patch_size:
      raise ValueError(f"ViT: img_size {config.img_size} must divide by patch_size {config.patch_size}")
    self.num_patches = (config.img_size // config.patch_size) ** 2
    self.proj = nn.Conv2d(config.in_chans, config.embed_dim, config.patch_size, stride=config.patch_size)

  def forward(self, x: Tensor) -> Tensor:
    return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
  """Multi-head self-attention: one Linear makes q, k and v for every head, another mixes the heads' outputs."""
  def __init__(self, config: ViTConfig):
    if config.embed_dim % config.num_heads:
      raise ValueError(f"ViT: embed_dim {config.embed_dim} must divide by num_heads {config.num_heads}")
    self.num_heads, self.attn_dropout = config.num_heads, config.attn_dropout
    self.qkv = nn.Linear(config.embed_dim, 3 * config.embed_dim)
    self.proj = nn.Linear(config.embed_dim, config.embed_dim)
    self.proj_drop = nn.Dropout(config.dropout)

  def forward(self, x: Tensor) -> Tensor:
    B, T, C = x.shape
    # (B, T, 3C) -> 3 x (B, heads, T, head_dim), timm's layout of the qkv weight: q rows, then k, then v
    qkv = self.qkv(x).reshape(B, T, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_dropout if self.training else 0.0)
    return self.proj_drop(self.proj(y.transpose(1, 2).reshape(B, T, C)))


class Mlp(nn.Module):
  def __init__(self, config: ViTConfig):
    hidden = int(config.embed_dim * config.mlp_ratio)
    self.fc1 = nn.Linear(config.embed_dim, hidden)
    self.fc2 = nn.Linear(hidden, config.embed_dim)
    self.drop = nn.Dropout(config.dropout)

  def forward(self, x: Tensor) -> Tensor: return self.drop(self.fc2(self.drop(self.fc1(x).gelu())))


class Block(nn.Module):
  """Pre-LN transformer block: x + attn(norm1(x)), then x + mlp(norm2(x))."""
  def __init__(self, config: ViTConfig):
    self.norm1 = nn.LayerNorm(config.embed_dim, eps=1e-6)
    self.attn = Attention(config)
    self.norm2 = nn.LayerNorm(config.embed_dim, eps=1e-6)
    self.mlp = Mlp(config)

  def forward(self, x: Tensor) -> Tensor:
    x = x + self.attn(self.norm1(x))
    return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
  """patch embedding + class token + positions -> blocks -> LayerNorm -> head on the class token."""
  def __init__(self, config: ViTConfig | None = None, weights: str | os.PathLike | dict | None = None):
    self.config = config = config or ViTConfig()
    self.patch_embed = PatchEmbed(config)
    # timm's init: small normals for the tokens and positions (ViT's own is trunc_normal(.02) for positions),
    # normal(.02) for the Linears' weights with zero biases; LayerNorms start at the identity
    self.cls_token = nn.Parameter(Tensor.normal(1, 1, config.embed_dim, std=1e-6))
    self.pos_embed = nn.Parameter(Tensor.normal(1, self.patch_embed.num_patches + 1, config.embed_dim, std=0.02))
    self.pos_drop = nn.Dropout(config.dropout)
    self.blocks = nn.ModuleList([Block(config) for _ in range(config.depth)])
    self.norm = nn.LayerNorm(config.embed_dim, eps=1e-6)
    self.head = nn.Linear(config.embed_dim, config.num_classes)
    for module in self.modules():
      if isinstance(module, nn.Linear):
        module.weight.assign(Tensor.normal(*module.weight.shape, std=0.02)).realize()
        module.bias.assign(Tensor.zeros(*module.bias.shape)).realize()
    if weights is not None: load_weights(self, weights)

  def forward_features(self, x: Tensor) -> Tensor:
    """(N, C, H, W) images -> (N, 1 + patches, embed_dim) tokens after the final norm."""
    c = self.config
    if x.ndim != 4 or x.shape[1:] != (c.in_chans, c.img_size, c.img_size):
      raise ValueError(f"ViT: expected images (N, {c.in_chans}, {c.img_size}, {c.img_size}), got shape {tuple(x.shape)}")
    x = self.patch_embed(x)
    x = self.cls_token.expand(x.shape[0], 1, c.embed_dim).cat(x, dim=1) + self.pos_embed
    x = self.pos_drop(x)
    for block in self.blocks: x = block(x)
    return self.norm(x)

  def forward(self, x: Tensor) -> Tensor:
    return self.head(self.forward_features(x)[:, 0])
