"""Benchmarks: gpu."""
