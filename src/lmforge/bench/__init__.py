"""Benchmarks over models x compressions: ACBench (``lmforge bench acbench``)."""
