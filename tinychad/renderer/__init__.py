"""Renderers: linear IR (codegen/linearize.py) in, source text out. cstyle.py writes C,
llvmir.py writes LLVM IR, gpu.py writes OpenCL C or CUDA C (GPU programs from codegen/gpu.py)."""
