"""Datasets where tinygrad keeps them: `from tinychad.nn.datasets import mnist`.

in: see tinychad/datasets.py  ->  out: numpy arrays (X_train, Y_train, X_test, Y_test), images uint8 (N, 1, 28, 28).
"""
from tinychad.datasets import DatasetUnavailable, digits_28x28, mnist  # noqa: F401
