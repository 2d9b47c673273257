"""Benchmarks: training."""
