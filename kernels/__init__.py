"""eagleviz's own GPU kernels (Triton), each with a launcher, a torch reference and a dispatcher.

This package is part of the eagleviz distribution and is unrelated to the Hugging Face `kernels` hub
library that shares the name; it deliberately exposes no `__version__` and no `get_kernel`, so
transformers' probe for that library reports it as unavailable.
"""
