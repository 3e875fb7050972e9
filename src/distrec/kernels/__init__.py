"""numba-compiled kernels of the CPU hot path: bag pooling and grouping, row updates, the dot interaction."""
