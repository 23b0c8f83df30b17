"""Is it right and fast: doctor and its inputs, smoke, the CUDA checks, lossless."""
