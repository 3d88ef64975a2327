"""tinychad's benchmark suite: each workload side by side with PyTorch, numpy and tinygrad on the CPU.

Run one workload with `python bench/matmul.py`, all of them with `python -m bench` (add --quick for
small sizes). bench/README.md has the latest table and how to read it.
"""
