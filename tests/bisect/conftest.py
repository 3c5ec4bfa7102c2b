"""Fixtures for bisect: ab's tiny upstream, whose llama-bench speed comes from ggml."""

from tests.ab.conftest import bench_tiny

__all__ = ["bench_tiny"]
