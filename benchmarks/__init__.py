"""Benchmarks of vanilla-transformer against transformers' Marian, CTranslate2 and the machine's matmul peak."""

import os

# OpenMP threads that spin while waiting lose whole time slices when the cores are shared with other processes: on
# this 2-core machine under load, a PyTorch training step with 2 spinning threads took 6x longer than with 1 thread,
# and as long as 1 thread once the threads yield instead (PASSIVE). Set before torch, CTranslate2 or onnxruntime load
# their OpenMP runtime; the same setting for every system. Export OMP_WAIT_POLICY=ACTIVE to measure the default.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
