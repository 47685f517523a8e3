"""eagleviz's own kernels: tree attention for GPUs (Triton; a launcher, a torch reference and a dispatcher) and
the fused small operations of a decoder layer for CPUs (C, `cpu_ops`).

This package is part of the eagleviz distribution and is unrelated to the Hugging Face `kernels` hub
library that shares the name; it deliberately exposes no `__version__` and no `get_kernel`, so
transformers' probe for that library reports it as unavailable.
"""
