"""`python -m bench [--quick] [--mnist] [--compilers] [--models]`: every workload, one table (then full MNIST training with --mnist,
the compiler comparison of bench/compilers.py with --compilers, and the models table of bench/models.py with --models). Also the entry point of the worker processes."""
from bench.common import main

WORKLOADS = ["bench.matmul", "bench.elementwise", "bench.reduce_sum", "bench.softmax", "bench.conv",
             "bench.cnn_train", "bench.gpt", "bench.small_ops", "bench.transpose"]

if __name__ == "__main__": main(WORKLOADS)
