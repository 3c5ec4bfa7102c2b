"""Fixtures for bisect: ab's tiny upstreams, whose llama-bench speed comes from ggml (and whose
llama-perplexity's logits do too)."""

from collections.abc import Sequence

from tests.ab.conftest import bench_tiny, quality_tiny

__all__ = ["bench_tiny", "bisect_args", "quality_tiny"]


def bisect_args(shas: Sequence[str], plan: str, device: str = "box") -> tuple[str, ...]:
    """kzbuild bisect of the tiny recipe over the whole history ``shas``."""
    return (
        "bisect",
        "tiny",
        "--good",
        shas[0],
        "--bad",
        shas[-1],
        "--plan",
        plan,
        "--device",
        device,
    )
