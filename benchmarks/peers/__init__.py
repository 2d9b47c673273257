"""Benchmarks: peers."""
