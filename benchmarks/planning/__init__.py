"""Benchmarks: planning."""
