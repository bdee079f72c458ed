"""Shared engines: atomic I/O, progress, errors, batched generation, log-prob scoring, perplexity and
calibration capture. Methods import from here; nothing here imports a method."""
