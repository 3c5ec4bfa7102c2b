"""Where the tests (and the benchmarks that reuse their builds) keep what they fetch and build
between runs."""

from __future__ import annotations

import os
from pathlib import Path


def persistent_cache_root() -> Path:
    """``$KZ_TEST_CACHE``, else ``$XDG_CACHE_HOME/kzbuild-test``, else ``~/.cache/kzbuild-test``:
    the place scripts/test-all exports, so what scripts/setup builds there the tests find."""
    explicit = os.environ.get("KZ_TEST_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kzbuild-test"
