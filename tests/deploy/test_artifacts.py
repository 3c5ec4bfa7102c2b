"""Loading an artifact's manifest for deploy: every bad manifest gets a message naming the
problem."""

from __future__ import annotations

import json

import pytest

from kzbuild.build.artifacts import load_artifact
from kzbuild.errors import ConfigError
from kzbuild.model.artifact import ArtifactFile, files_digest, parse_mode

SHA = "ab" * 32


def manifest_of(build):
    return json.loads((build / "manifest.json").read_text())


def rewrite(build, change):
    doc = manifest_of(build)
    change(doc)
    (build / "manifest.json").write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: d.pop("build_id"),
            "build_id: must be 1-128 letters, digits and '._+-', starting with a letter or digit, "
            "not None",
        ),
        (
            lambda d: d.update(build_id="a/b"),
            "build_id: must be 1-128 letters, digits and '._+-', starting with a letter or digit, "
            "not 'a/b'",
        ),
        (lambda d: d.update(build_id=".hidden"), "build_id: must be 1-128 letters"),
        (lambda d: d.update(files={}), "'files' must be a non-empty mapping"),
        (
            lambda d: d.update(files={"../x": {"sha256": SHA, "size": 1, "mode": 420}}),
            "'../x' is not a plain relative path",
        ),
        (
            lambda d: d.update(files={"/etc/x": {"sha256": SHA, "size": 1, "mode": 420}}),
            "'/etc/x' is not a plain relative path",
        ),
        (
            lambda d: d.update(files={"bin/./x": {"sha256": SHA, "size": 1, "mode": 420}}),
            "'bin/./x' is not a plain relative path",
        ),
        (
            lambda d: d.update(files={"a\nb": {"sha256": SHA, "size": 1, "mode": 420}}),
            "'a\\nb' holds a control character",
        ),
        (
            lambda d: d.update(files={"manifest.json/x": {"sha256": SHA, "size": 1, "mode": 420}}),
            "'manifest.json' is the release's own manifest",
        ),
        (lambda d: d.update(files={"x": "nope"}), "'x' must map to {sha256, size, mode}"),
        (
            lambda d: d.update(files={"x": {"sha256": "ABC", "size": 1}}),
            "'x': sha256 must be 64 lowercase hex digits",
        ),
        (
            lambda d: d.update(files={"x": {"sha256": SHA, "size": -1}}),
            "'x': size must be a non-negative integer",
        ),
        (
            lambda d: d.update(files={"x": {"sha256": SHA, "size": 1, "mode": "rwx"}}),
            "'x': mode must be an integer or an octal string",
        ),
        (
            lambda d: d.update(files={"x": {"sha256": SHA, "size": 1, "mode": 0o70000}}),
            "'x': mode 70000 is out of range",
        ),
        (
            lambda d: d["files"].update({"lib/gone.so": {"sha256": SHA, "size": 1, "mode": 420}}),
            "'lib/gone.so' is listed but missing",
        ),
        (lambda d: d["files"]["lib/libgreet.so"].update(size=1), "'lib/libgreet.so' is "),
    ],
)
def test_bad_manifests_are_explained(artifacts, change, message):
    build = artifacts.make("b1")
    rewrite(build, change)
    with pytest.raises(ConfigError) as caught:
        load_artifact(build)
    assert message in caught.value.message
    assert str(build / "manifest.json") in caught.value.message


def test_size_mismatch_hints_at_a_rebuild(artifacts):
    build = artifacts.make("b1")
    rewrite(build, lambda d: d["files"]["lib/libgreet.so"].update(size=1))
    with pytest.raises(ConfigError) as caught:
        load_artifact(build)
    assert "bytes on disk but 1 in the manifest" in caught.value.message
    assert caught.value.hint == "the artifact changed after it was built; rebuild it"


def test_invalid_json_and_missing_manifest(artifacts, tmp_path):
    build = artifacts.make("b1")
    (build / "manifest.json").write_text("{not json")
    with pytest.raises(ConfigError, match="the manifest is not valid JSON"):
        load_artifact(build)
    (build / "manifest.json").write_text("[1]")
    with pytest.raises(ConfigError, match="the manifest must be a JSON object"):
        load_artifact(build)
    with pytest.raises(ConfigError, match="cannot read the manifest"):
        load_artifact(tmp_path)


def test_unknown_artifact_reference(kz, tmp_path):
    result = kz("deploy", "--device", f"local:{tmp_path / 'd'}", "--artifact", "no-such-build")
    assert result.code == ConfigError.exit_code
    text = " ".join(result.err.split())
    assert "no artifact 'no-such-build'" in text and "kzbuild build" in text


def test_octal_string_modes_and_the_files_digest():
    assert parse_mode("x", "0755") == parse_mode("x", "755") == parse_mode("x", 0o755) == 0o755
    one = (ArtifactFile("bin/a", SHA, 1, 0o755), ArtifactFile("lib/b", "cd" * 32, 2, 0o644))
    assert files_digest(one) == files_digest(tuple(reversed(one)))  # order does not matter
    assert files_digest(one) != files_digest(
        (ArtifactFile("bin/a", SHA, 1, 0o644), one[1])
    )  # modes do
