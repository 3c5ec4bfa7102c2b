"""`kzbuild models push`: content-addressed GGUF models on a device; resume, verify, never
resend."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from kzbuild.device import deploy
from kzbuild.device.local import LocalTransport
from kzbuild.errors import ConfigError, DeviceError
from kzbuild.model.device import Device
from tests.fixtures_deploy import CuttingTransport


def write_gguf(path: Path, values: int = 200_000, seed: int = 0) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"kz-test-{seed}")
    writer.add_tensor(
        "blob", np.random.default_rng(seed).standard_normal(values).astype(np.float32)
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def push(kz, root: Path, model: Path, *extra: str) -> dict:
    result = kz("models", "push", str(model), "--device", f"local:{root}", "--json", *extra)
    assert result.code == 0, result.err
    return json.loads(result.out)


def test_push_stores_by_content_with_a_readable_name_and_never_resends(kz, tmp_path):
    model = write_gguf(tmp_path / "tiny.gguf")
    root = tmp_path / "device"
    first = push(kz, root, model)
    digest = sha256(model)
    assert first["sha256"] == digest and first["already_there"] is False
    assert first["bytes_sent"] == model.stat().st_size
    stored = root / "models" / f"{digest}.gguf"
    assert stored.read_bytes() == model.read_bytes()
    assert os.readlink(root / "models" / "tiny.gguf") == f"{digest}.gguf"
    again = push(kz, root, model)
    assert again["already_there"] is True and again["bytes_sent"] == 0
    renamed = push(kz, root, model, "--name", "qwen-tiny.gguf")
    assert renamed["bytes_sent"] == 0
    assert os.readlink(root / "models" / "qwen-tiny.gguf") == f"{digest}.gguf"


def test_a_name_moves_to_a_new_model(kz, tmp_path):
    root = tmp_path / "device"
    first = push(kz, root, write_gguf(tmp_path / "a.gguf", seed=1), "--name", "m.gguf")
    second = push(kz, root, write_gguf(tmp_path / "b.gguf", seed=2), "--name", "m.gguf")
    assert first["sha256"] != second["sha256"]
    assert os.readlink(root / "models" / "m.gguf") == f"{second['sha256']}.gguf"
    assert (root / "models" / f"{first['sha256']}.gguf").exists()


def test_human_output(kz, tmp_path):
    model = write_gguf(tmp_path / "tiny.gguf")
    out = " ".join(
        kz("models", "push", str(model), "--device", f"local:{tmp_path / 'd'}").out.split()
    )
    assert "pushed tiny.gguf" in out and "verified" in out
    out = " ".join(
        kz("models", "push", str(model), "--device", f"local:{tmp_path / 'd'}").out.split()
    )
    assert "already on" in out and "sent 0 bytes" in out


def test_a_cut_push_resumes(tmp_path):
    model = write_gguf(tmp_path / "tiny.gguf")
    root = tmp_path / "device"
    device = Device(name="t", transport="local", root=str(root))
    with pytest.raises(DeviceError, match="connection lost"):
        deploy.push_model(CuttingTransport(str(root), budget=300_000), device, model)
    assert not (root / "models" / "tiny.gguf").exists()
    result = deploy.push_model(LocalTransport(str(root)), device, model)
    assert (result.bytes_resumed, result.bytes_sent) == (300_000, model.stat().st_size - 300_000)
    assert (root / "models" / "tiny.gguf").read_bytes() == model.read_bytes()


def test_over_ssh(kz, sshd, ssh_home, tmp_path):
    model = write_gguf(tmp_path / "tiny.gguf")
    root = tmp_path / "device"
    result = kz("models", "push", str(model), "--device", sshd.spec(root), "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["bytes_sent"] == model.stat().st_size
    assert (root / "models" / "tiny.gguf").read_bytes() == model.read_bytes()
    again = json.loads(kz("models", "push", str(model), "--device", sshd.spec(root), "--json").out)
    assert again["bytes_sent"] == 0


@pytest.mark.parametrize(
    ("content", "name", "message"),
    [
        (b"not a model", None, "is not a GGUF model"),
        (None, None, "no model file"),
        (b"GGUF....", "sub/dir.gguf", "bad model name 'sub/dir.gguf'"),
        (b"GGUF....", ".hidden", "bad model name '.hidden'"),
        (b"GGUF....", "a" * 64 + ".gguf", "the store's own"),
    ],
)
def test_bad_inputs(kz, tmp_path, content, name, message):
    model = tmp_path / "m.gguf"
    if content is not None:
        model.write_bytes(content)
    args = ["models", "push", str(model), "--device", f"local:{tmp_path / 'd'}"] + (
        ["--name", name] if name else []
    )
    result = kz(*args)
    assert result.code == ConfigError.exit_code
    assert message in " ".join(result.err.split())


def test_in_a_pipe_the_stored_name_and_sha256_stay_on_one_line(kz, tmp_path):
    model = write_gguf(tmp_path / "a-model-with-a-rather-long-file-name-q4_0.gguf")
    root = tmp_path / "device-with-a-long-path" / "data" / "local" / "tmp" / "kz-engine"
    result = kz("models", "push", str(model), "--device", f"local:{root}")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert f"  {root}/models/{model.name} -> {sha256(model)}.gguf" in lines
    assert any(line.startswith("pushed ") and f"as {root}/models/" in line for line in lines)
