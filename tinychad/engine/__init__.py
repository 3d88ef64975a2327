"""The engine: the lazy graph -> kernels (schedule.py, schedule_cache.py) -> run on a device (realize.py), with
TinyJit replaying a captured step (jit.py) and BEAM search timing kernel variants (search.py)."""
