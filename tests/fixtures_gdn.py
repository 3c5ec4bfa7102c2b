"""Both sides of the GDN patch
(patches/ggml-hexagon-accept-gated_delta_net-when-its-hvx-kernel-fits.patch),
for its tests: the pin's own tree and the tree kzbuild synced with the stack."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

HEXAGON_CPP = Path("ggml/src/ggml-hexagon/ggml-hexagon.cpp")


@pytest.fixture(scope="module")
def gdn_trees(pin_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{"pin": the upstream pin (refs/kz/base of the synced tree, its ggml/ only), "patched": the
    synced tree}."""
    unpatched = tmp_path_factory.mktemp("pin-unpatched")
    archive = subprocess.run(
        ["git", "-C", str(pin_tree), "archive", "refs/kz/base", "ggml"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(unpatched)], input=archive, check=True)
    assert (unpatched / HEXAGON_CPP).read_bytes() != (pin_tree / HEXAGON_CPP).read_bytes(), (
        "the stack does not change ggml-hexagon.cpp"
    )
    return {"pin": unpatched, "patched": pin_tree}


def function_definition(source: str, name: str) -> str:
    """The definition of the top-level ``static`` function ``name`` in C/C++ ``source``
    (declarations are skipped)."""
    for match in re.finditer(rf"^static [\w ]+\b{re.escape(name)}\(", source, re.M):
        params_end = _matching(source, match.end() - 1, "(", ")")
        if source[params_end + 1 :].lstrip().startswith("{"):
            body = source.index("{", params_end)
            return source[match.start() : _matching(source, body, "{", "}") + 1] + "\n"
    raise AssertionError(f"no definition of {name}")


def _matching(source: str, start: int, opening: str, closing: str) -> int:
    depth = 0
    for index in range(start, len(source)):
        if source[index] == opening:
            depth += 1
        elif source[index] == closing:
            depth -= 1
            if depth == 0:
                return index
    raise AssertionError(f"unbalanced {opening}{closing} from offset {start}")
