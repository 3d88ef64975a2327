"""Runtimes: a device is an allocator, a compiler (source -> binary, cached by cache.py) and a program loader
(compiled.py), one file per device: ops_cpu (C), ops_llvm (LLVM IR), ops_numpy (the reference interpreter), ops_opencl (OpenCL through pyopencl: device memory of its own);
nvrtc.py compiles CUDA C to PTX with NVRTC (the CUDA dialect's compile check, no device)."""
