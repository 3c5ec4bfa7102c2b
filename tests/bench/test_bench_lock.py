"""kzbuild run and bench hold the device root's lock while they use the device: two processes.

A real ``python -m kzbuild`` holds the device (its tool waits for a go file); the other commands
run in this process against the same local device root.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from kzbuild.device.devicelock import host_name
from tests.bench.benchkit import CAPTURED_JSON, DeviceRoot, flat
from tests.conftest import Project
from tests.fixtures_deploy import write_manifest

# A tool that says it started, then waits (at most a minute) until the test lets it go.
HOLD = f"""#!{sys.executable} -S
import os, sys, time
open("started", "w").close()
deadline = time.monotonic() + 60
while not os.path.exists("go") and time.monotonic() < deadline:
    time.sleep(0.05)
{{finish}}
"""
HOLD_RUN = HOLD.format(finish='sys.stdout.write("done\\n")')
HOLD_BENCH = HOLD.format(finish=f"sys.stdout.write(open({str(CAPTURED_JSON)!r}).read())")


@dataclass
class Held:
    process: subprocess.Popen[str]
    out: str = ""
    err: str = ""


@contextmanager
def holding(project: Project, device: DeviceRoot, *args: str) -> Iterator[Held]:
    """``kzbuild ARGS`` in its own process, from its tool's start until the test lets it finish."""
    argv = [
        sys.executable,
        "-m",
        "kzbuild",
        "--project",
        str(project.root),
        "--cache-dir",
        str(project.cache),
        "--work-dir",
        str(project.work),
        *args,
    ]
    held = Held(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        deadline = time.monotonic() + 60
        while not (device.root / "started").exists():
            assert held.process.poll() is None, held.process.communicate()
            assert time.monotonic() < deadline, "the tool never started"
            time.sleep(0.05)
        yield held
    finally:
        (device.root / "go").touch()
        held.out, held.err = held.process.communicate(timeout=60)


def artifact(tmp_path: Path, build_id: str) -> Path:
    folder = tmp_path / "artifacts" / build_id
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "tool").write_text("#!/bin/sh\necho new\n")
    (folder / "bin" / "tool").chmod(0o755)
    write_manifest(folder, build_id)
    return folder


def test_a_running_tool_holds_the_device_against_deploy_and_bench(
    kz, project, device_root, tmp_path
):
    device_root.add_tool("hold", HOLD_RUN)
    device_root.add_file("models/tiny.gguf", b"GGUF stand-in")
    new = artifact(tmp_path, "b0000000000000002")
    with holding(project, device_root, "run", "--device", device_root.spec, "hold") as held:
        holder = f"is busy: run by {host_name()} pid {held.process.pid} since"
        deployed = kz("deploy", "--artifact", str(new), "--device", device_root.spec)
        assert deployed.code == 10 and holder in flat(deployed.err), deployed.err
        benched = kz("bench", "--device", device_root.spec, "-m", "models/tiny.gguf")
        assert benched.code == 10 and holder in flat(benched.err), benched.err
        assert os.readlink(device_root.root / "current") == f"releases/{device_root.build_id}"
    assert held.process.returncode == 0 and held.out == "done\n", held.err
    assert not (device_root.root / ".lock").exists()  # released
    assert kz("deploy", "--artifact", str(new), "--device", device_root.spec).code == 0


def test_a_running_bench_holds_the_device_and_its_records_name_the_build_it_ran(
    kz, project, device_root, tmp_path
):
    device_root.add_tool("llama-bench", HOLD_BENCH)
    device_root.add_file("models/tiny.gguf", b"GGUF stand-in")
    new = artifact(tmp_path, "b0000000000000002")
    with holding(
        project,
        device_root,
        "bench",
        "--device",
        device_root.spec,
        "-m",
        "models/tiny.gguf",
        "--json",
    ) as held:
        holder = f"is busy: bench by {host_name()} pid {held.process.pid} since"
        deployed = kz("deploy", "--artifact", str(new), "--device", device_root.spec)
        assert deployed.code == 10 and holder in flat(deployed.err), deployed.err
        ran = kz("run", "--device", device_root.spec, "llama-bench")
        assert ran.code == 10 and holder in flat(ran.err), ran.err
    assert held.process.returncode == 0, held.err
    run = json.loads(held.out)
    assert run["records"] and {record["build"]["build_id"] for record in run["records"]} == {
        device_root.build_id
    }
    assert kz("deploy", "--artifact", str(new), "--device", device_root.spec).code == 0


@pytest.mark.parametrize("command", ["bench", "run"])
def test_ctrl_c_while_the_device_is_held_releases_its_lock(project, device_root, command):
    """SIGINT to kzbuild alone (not its tool's process group): the tool stops, the lock goes."""
    device_root.add_tool("llama-bench", HOLD_BENCH)
    device_root.add_file("models/tiny.gguf", b"GGUF stand-in")
    args = ["-m", "models/tiny.gguf"] if command == "bench" else ["llama-bench"]
    with holding(project, device_root, command, "--device", device_root.spec, *args) as held:
        assert (device_root.root / ".lock").is_dir()
        started = time.monotonic()
        held.process.send_signal(signal.SIGINT)
        held.process.wait(timeout=30)
        assert time.monotonic() - started < 10
    assert held.process.returncode == 130, held.err
    assert "Traceback" not in held.err
    assert not (device_root.root / ".lock").exists()
