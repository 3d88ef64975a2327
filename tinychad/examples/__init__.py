"""Runnable examples: `python -m tinychad.examples.micrograd` (the scalar autograd engine tinychad grows
from, docs/from-micrograd.md), `python -m tinychad.examples.mnist` (train a CNN on MNIST) and
`python -m tinychad.examples.transfer` (pretrain on digits 0-4, fine-tune a new head on 5-9)."""
