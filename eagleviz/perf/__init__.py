"""Measurement, side by side: `bench` (speed against plain decoding and peers), `tune` (the verification cost
curve and the fastest tree on this machine) and `gpu_check` (the CUDA path in one report, its sections and
their time budget in `sections`)."""
