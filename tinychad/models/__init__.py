"""Whole models, one readable file per family, with the module names of the checkpoints people have.

in: a config (or a builder's arguments) and optionally a weights file  ->  out: an nn.Module (`model(x)`).
  resnet.py  ResNet-18/34/50, torchvision's names (conv1, bn1, layer1.0.conv1, ..., downsample.0/1, fc):
             resnet18(num_classes=10, in_channels=1, small_input=True, width=16) for small images on a CPU
  vit.py     ViT with timm's names (patch_embed.proj, cls_token, pos_embed, blocks.N.attn.qkv, ..., head):
             ViT(ViTConfig.mnist()), ViTConfig.tiny() / small() / base()
  bert.py    BERT encoder with Hugging Face's names (embeddings.word_embeddings,
             encoder.layer.N.attention.self.query, ...), attention mask, mean pooling for sentence embeddings:
             BertModel(BertConfig.mini_lm()).encode(ids, mask)
  gpt.py     GPT with nanoGPT's names (transformer.wte, h.N.attn.c_attn, ..., lm_head tied to wte), learned or
             rotary positions, a KV cache that replays under TinyJit, generate() (sampling, top-k, top-p, greedy,
             speculative decoding with a draft model); GPT.from_pretrained reads nanoGPT and Hugging Face GPT-2 files
  lstm.py    a character/word LSTM language model on nn.LSTM, with generate()
Loading weights: every vision/BERT model takes `weights=` a .safetensors file (PyTorch's safetensors.torch.save_file
of the original model's state_dict, or tinychad's nn.state.safe_save) or an in-memory state dict ({name: Tensor or
numpy array}), loaded strictly by name through nn.state.load_weights: one RuntimeError lists every missing,
unexpected and mis-shaped name. PyTorch's .pt / .pth pickles are refused with a ValueError (loading a pickle can
run code, and reading one needs torch): convert once with `safetensors.torch.save_file(torch.load(path), "model.safetensors")`.
"""
from tinychad.models.resnet import ResNet, resnet18, resnet34, resnet50
from tinychad.models.vit import ViT, ViTConfig
from tinychad.models.bert import BertConfig, BertModel, mean_pool
from tinychad.models.gpt import GPT, GPTConfig, speculative_generate
from tinychad.models.lstm import LSTMLanguageModel

__all__ = ["ResNet", "resnet18", "resnet34", "resnet50", "ViT", "ViTConfig", "BertConfig", "BertModel", "mean_pool",
           "GPT", "GPTConfig", "speculative_generate", "LSTMLanguageModel"]
