"""eagleviz: an interactive visual explainer of EAGLE speculative decoding that runs real decoding."""

__version__ = "0.1.0"
