"""Benchmarks that print the figures quoted in docs/: ``python -m minipaged bench {memory,kernels,engine,prefix}``."""
