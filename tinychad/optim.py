"""The seed's import path for optimizers: `from tinychad.optim import SGD`; everything lives in tinychad/nn/optim.py."""
from tinychad.nn.optim import SGD, Adam, AdamW, RMSprop, Optimizer, clip_grad_norm_  # noqa: F401
