"""Benchmarks behind ``m4moe-bench`` (one module per sub-benchmark)."""
