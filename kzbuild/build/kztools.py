"""kzbuild's own tools, built with an artifact after llama.cpp, against the libraries it just built.

A recipe (``build: tools:``) or ``kzbuild build --tool`` names them like llama.cpp's tools. Each is
a small CMake project under ``kernels/`` configured with the same definitions as the llama.cpp
build (compiler, toolchain file, flags, rpath, launcher), plus where the tree and the build are;
its binary lands in the build's ``bin/``, where the artifact collects tools from. The digest of
its sources enters the build id's inputs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from kzbuild.adapters.files import folder_digest
from kzbuild.errors import ConfigError
from kzbuild.model.build import BuildStep

# tool name -> its project folder under kernels/
KZ_TOOLS: dict[str, str] = {"kz-profile": "profile", "kz-peakrss": "peakrss"}


def split_tools(tools: Sequence[str]) -> tuple[list[str], list[str]]:
    """(llama.cpp's ninja targets, kzbuild's own tools)."""
    return [t for t in tools if t not in KZ_TOOLS], [t for t in tools if t in KZ_TOOLS]


def source_dir(kernels: Path, tool: str) -> Path:
    return kernels / KZ_TOOLS[tool]


def inputs(kernels: Path, tools: Sequence[str]) -> dict[str, str]:
    """For the build id: each of kzbuild's tools with the digest of its sources (empty when none is
    built)."""
    for tool in tools:
        if not (source_dir(kernels, tool) / "CMakeLists.txt").is_file():
            raise ConfigError(
                f"tool {tool}: {source_dir(kernels, tool)}/CMakeLists.txt is missing",
                hint="kzbuild's own tools build from the project's kernels/",
            )
    return {tool: folder_digest(source_dir(kernels, tool)) for tool in tools}


def steps(
    kernels: Path,
    tools: Sequence[str],
    *,
    cmake: str,
    ninja: str,
    cmake_defs: Mapping[str, str],
    source: Path,
    build_dir: Path,
    env: Sequence[tuple[str, str]],
) -> list[BuildStep]:
    """Configure and build each tool against ``build_dir``'s libraries, with the llama.cpp build's
    definitions."""
    out = []
    for tool in tools:
        # one build dir per source folder: cmake refuses a build dir configured from another source
        # (two projects, or two clones, share the work dir's llama.cpp build dir)
        where = hashlib.sha256(str(source_dir(kernels, tool)).encode()).hexdigest()[:12]
        tool_dir = build_dir / "kz-tools" / f"{tool}-{where}"
        defs = {**cmake_defs, "KZ_LLAMA_SOURCE": str(source), "KZ_LLAMA_BUILD": str(build_dir)}
        configure = [
            cmake,
            "-S",
            str(source_dir(kernels, tool)),
            "-B",
            str(tool_dir),
            "-G",
            "Ninja",
            *(f"-D{k}={v}" for k, v in defs.items()),
        ]
        out.append(BuildStep(f"{tool}-configure", tuple(configure), tuple(env)))
        out.append(BuildStep(f"{tool}-build", (ninja, "-C", str(tool_dir)), tuple(env)))
    return out
