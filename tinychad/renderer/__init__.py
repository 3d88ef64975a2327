"""Renderers: linear IR (codegen/linearize.py) in, source text out. cstyle.py writes C,
llvmir.py writes LLVM IR."""
