"""The caches that keep a no-op command's start-up near Python's: toolchain version outputs and
parsed YAML. Each may only ever save work, never answer for something that changed."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kzbuild.adapters import yamlconf
from kzbuild.build.toolchains import VersionOutputs, detect, parse_toolchain
from kzbuild.errors import ConfigError

TOOL_SPEC = """\
description: a test tool
label: tool
release: ">= 1.0"
provides: [cmake]
programs:
  tool:
    name: kz-tool
    version: {regex: 'kz-tool version (\\d+(?:\\.\\d+)+)', minimum: "1.0"}
"""


def compile_tool(folder: Path, version: str, name: str = "kz-tool") -> Path:
    """A real binary (not a script) that prints ``kz-tool version VERSION``."""
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / f"{name}-{version}.c"
    source.write_text(
        f'#include <stdio.h>\nint main(void) {{ puts("kz-tool version {version}"); return 0; }}\n'
    )
    built = folder / f"{name}.new"
    subprocess.run(["cc", "-o", str(built), str(source)], check=True)
    os.replace(built, folder / name)  # a new inode, as a package upgrade makes
    return folder / name


def tool_spec(tmp_path: Path):
    path = tmp_path / "tool.yaml"
    path.write_text(TOOL_SPEC)
    return parse_toolchain(yamlconf.load(path), name="tool")


def probes_run(caplog: pytest.LogCaptureFixture) -> int:
    return sum(
        "--version" in record.getMessage()
        for record in caplog.records
        if record.name == "kzbuild.adapters.proc"
    )


@pytest.fixture
def proc_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="kzbuild.adapters.proc")
    return caplog


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_a_version_is_probed_once_per_binary_and_again_when_the_binary_changes(tmp_path, proc_log):
    bin_dir = tmp_path / "bin"
    compile_tool(bin_dir, "1.2.3")
    env = {"PATH": str(bin_dir)}
    spec = tool_spec(tmp_path)
    outputs = tmp_path / "cache" / "toolchain-versions.json"

    first = detect(spec, env, needed_by="a test", known_outputs=VersionOutputs(outputs))
    assert first.ok and first.version == "1.2.3" and probes_run(proc_log) == 1
    second = detect(
        spec, env, needed_by="a test", known_outputs=VersionOutputs(outputs)
    )  # a new process
    assert second == first and probes_run(proc_log) == 1, "the same binary is not probed again"

    compile_tool(bin_dir, "1.2.4")  # an upgrade: the same path, another file
    upgraded = detect(spec, env, needed_by="a test", known_outputs=VersionOutputs(outputs))
    assert upgraded.version == "1.2.4" and probes_run(proc_log) == 2


def test_scripts_and_compiler_cache_wrappers_are_probed_every_time(tmp_path, proc_log):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    version_file = tmp_path / "version"
    script = bin_dir / "kz-tool"
    script.write_text(f"#!/bin/sh\necho kz-tool version $(cat {version_file})\n")
    script.chmod(0o755)
    spec = tool_spec(tmp_path)
    outputs = VersionOutputs(tmp_path / "cache" / "versions.json")
    for version in ("1.0", "1.1"):
        version_file.write_text(version)  # what a script runs can change while the script does not
        assert (
            detect(
                spec,
                {"PATH": f"{bin_dir}:/usr/bin:/bin"},
                needed_by="a test",
                known_outputs=outputs,
            ).version
            == version
        )
    assert probes_run(proc_log) == 2

    # /usr/lib/ccache/g++ style: a link named like the tool to a wrapper that runs whatever
    # PATH finds
    wrapper = shutil.which("ccache") or shutil.which("true")
    assert wrapper is not None
    shutil.copy(wrapper, bin_dir / "ccache")
    masquerade = bin_dir / "kz-tool"
    masquerade.unlink()
    masquerade.symlink_to(bin_dir / "ccache")
    assert outputs.key([str(masquerade), "--version"], {"PATH": str(bin_dir)}) is None
    assert (
        outputs.key([str(bin_dir / "ccache"), "--version"], {"PATH": str(bin_dir)}) is not None
    ), "ccache itself is a binary"


def test_the_locale_and_path_are_part_of_the_key(tmp_path):
    true = shutil.which("true")
    assert true is not None
    outputs = VersionOutputs(tmp_path / "versions.json")
    keys = {
        outputs.key([true, "--version"], env)
        for env in (
            {"PATH": "/bin"},
            {"PATH": "/usr/bin"},
            {"PATH": "/bin", "LANG": "de_DE.UTF-8"},
            {"PATH": "/bin", "LC_ALL": "C"},
        )
    }
    assert len(keys) == 4 and None not in keys


@given(damage=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_a_damaged_version_cache_means_probing_again(tmp_path, damage):
    cmake = shutil.which("cmake")
    assert cmake is not None
    path = tmp_path / "versions.json"
    path.write_bytes(damage)
    outputs = VersionOutputs(path)
    key = outputs.key([cmake, "--version"], {"PATH": os.path.dirname(cmake)})
    assert key is not None
    stored = outputs.get(key)
    assert stored is None or isinstance(stored, str)
    outputs.put(key, "cmake version 3.25.1\n")
    assert VersionOutputs(path).get(key) == "cmake version 3.25.1\n"


# --- parsed YAML ------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False),
    st.text(max_size=20),
)
documents = st.dictionaries(
    st.text(min_size=1, max_size=10),
    st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(st.text(min_size=1, max_size=8), inner, max_size=4)
        ),
        max_leaves=12,
    ),
    min_size=1,
    max_size=6,
)


def shape(value: object) -> object:
    """A parsed value with every line number it carries, for comparing two loads."""
    if isinstance(value, yamlconf.Mapping):
        return (
            "m",
            value.line,
            [(key, value.key_lines[key], shape(item)) for key, item in value.items()],
        )
    if isinstance(value, yamlconf.Sequence):
        return ("s", value.line, list(value.item_lines), [shape(item) for item in value])
    return ("v", type(value).__name__, value)


@pytest.fixture
def remembered(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("parsed") / "parsed-yaml.json"
    yamlconf.remember_parsed_in(path)
    yield path
    yamlconf.remember_parsed_in(None)


@given(doc=documents, style=st.sampled_from([False, True]))
@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_a_remembered_document_is_the_parsed_one_with_every_line(tmp_path, remembered, doc, style):
    path = tmp_path / "doc.yaml"
    path.write_text(yaml.safe_dump(doc, default_flow_style=style, allow_unicode=True))
    yamlconf.remember_parsed_in(None)
    parsed = yamlconf.load(path)
    yamlconf.remember_parsed_in(remembered)
    cold = yamlconf.load(path)  # parses, and remembers
    yamlconf.remember_parsed_in(remembered)  # a new process: reads the file
    warm = yamlconf.load(path)
    assert shape(cold) == shape(warm) == shape(parsed)
    assert warm.path == path


def test_a_remembered_document_is_used_only_for_the_same_bytes(tmp_path, remembered):
    path = tmp_path / "recipe.yaml"
    path.write_text("a: 1\nb: [x, y]\n")
    assert yamlconf.load(path) == {"a": 1, "b": ["x", "y"]}
    path.write_text("a: 2\n\nb: [x]\n")
    edited = yamlconf.load(path)
    assert edited == {"a": 2, "b": ["x"]} and edited.line_of("b") == 3
    path.write_text("a: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        yamlconf.load(path)  # errors are never remembered


def test_values_json_cannot_hold_are_parsed_every_time(tmp_path, remembered):
    path = tmp_path / "dated.yaml"
    path.write_text("when: 2026-12-03\n")
    assert str(yamlconf.load(path)["when"]) == "2026-12-03"
    assert not remembered.exists() or "when" not in remembered.read_text()


json_values = st.recursive(
    st.none() | st.integers() | st.text(max_size=5) | st.booleans(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=15,
)


@given(
    damage=st.binary(max_size=400) | json_values.map(lambda value: json.dumps(value).encode()),
    entry=json_values,
)
@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_a_damaged_parsed_cache_means_parsing_again(tmp_path, remembered, damage, entry):
    path = tmp_path / "doc.yaml"
    path.write_text("name: x\nlist:\n  - 1\n  - two\n")
    yamlconf.load(path)
    stored = json.loads(remembered.read_bytes())
    digest = next(iter(stored["entries"]))
    digest_of_text, text = stored["entries"][digest]
    flipped = text.replace('"two"', '"twp"')  # a changed byte, its checksum as it was
    for broken in (
        damage,
        json.dumps({"format": 1, "entries": {digest: entry}}).encode(),
        json.dumps({"format": 1, "entries": {digest: [digest_of_text, flipped]}}).encode(),
    ):
        remembered.write_bytes(broken)
        yamlconf.remember_parsed_in(remembered)
        doc = yamlconf.load(path)
        assert doc == {"name": "x", "list": [1, "two"]}
        assert doc.get_list("list").item_lines == [3, 4]
