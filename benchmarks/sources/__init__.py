"""Benchmarks: sources."""
