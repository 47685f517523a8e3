"""Draft-head training and evaluation: data, target features, objectives, training loop, metrics."""
