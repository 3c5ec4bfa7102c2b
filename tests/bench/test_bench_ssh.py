"""run and bench over ssh: paramiko exec against a real sshd on 127.0.0.1, whose shell is a real
sh."""

from __future__ import annotations

import json

from tests.bench.benchkit import (
    REPLAY_LLAMA_BENCH,
    SHOW_ARGS,
    TRICKY,
    env_options,
    make_device_root,
)


def test_run_over_ssh_delivers_every_argument_and_env_value_unchanged(kz, sshd, ssh_home, tmp_path):
    device = make_device_root(
        tmp_path / "device", manifest={"build_id": "b-ssh", "recipe": "demo-host"}
    )
    device.add_tool("show-args", SHOW_ARGS)
    result = kz(
        "run", "--device", sshd.spec(device.root), *env_options(TRICKY), "--", "show-args", *TRICKY
    )
    assert result.code == 0, result.err
    seen = json.loads(result.out)
    assert seen["argv"] == TRICKY
    assert [seen["env"][f"KZ_T_{n}"] for n in range(len(TRICKY))] == TRICKY
    assert seen["cwd"] == str(device.root)
    assert not list(tmp_path.rglob("pwned"))


def test_bench_over_ssh_stores_records(kz, sshd, ssh_home, tmp_path):
    device = make_device_root(
        tmp_path / "device", manifest={"build_id": "b-ssh", "recipe": "demo-host"}
    )
    device.add_tool("llama-bench", REPLAY_LLAMA_BENCH)
    device.add_file("models/q.gguf", b"model bytes")
    result = kz(
        "bench",
        "--device",
        sshd.spec(device.root),
        "-m",
        "models/q.gguf",
        "--env",
        "GGML_HEXAGON_OPFILTER=ADD|SUB",
        "--json",
    )
    assert result.code == 0, result.err
    records = json.loads(result.out)["records"]
    assert [r["test"] for r in records] == ["pp32", "tg8"]
    assert records[0]["device"]["fingerprint"]["uname"]
    assert records[0]["build"]["build_id"] == "b-ssh"
    received = json.loads((device.root / "received.jsonl").read_text())
    assert received["env"] == {"GGML_HEXAGON_OPFILTER": "ADD|SUB"}
