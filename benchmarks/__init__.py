"""Benchmarks of vanilla-transformer against transformers' Marian, CTranslate2 and the machine's matmul peak."""

import os

# OpenMP threads that spin while waiting lose whole time slices when other processes share the cores (README.md,
# Method). Set before any library loads its OpenMP runtime; export OMP_WAIT_POLICY=ACTIVE to measure the default.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
