"""Whole models, one readable file per family, with the module names of the checkpoints people have.

in: a config (or a weights file)  ->  out: an nn.Module (`model(x)`).
  gpt.py   GPT with nanoGPT's names (transformer.wte, h.N.attn.c_attn, ..., lm_head tied to wte), learned or
           rotary positions, a KV cache that replays under TinyJit, generate() (sampling, top-k, top-p, greedy,
           speculative decoding with a draft model); GPT.from_pretrained reads nanoGPT and Hugging Face GPT-2 files
  lstm.py  a character/word LSTM language model on nn.LSTM, with generate()
"""
from tinychad.models.gpt import GPT, GPTConfig, speculative_generate
from tinychad.models.lstm import LSTMLanguageModel

__all__ = ["GPT", "GPTConfig", "speculative_generate", "LSTMLanguageModel"]
