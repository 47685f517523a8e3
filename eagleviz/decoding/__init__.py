"""The speculative loop: `engine` (a generator of CycleTrace), the draft tree, verification, the race against
plain decoding, and `load`, the one place an Engine is built. Imports models and kernels, never app or perf."""
