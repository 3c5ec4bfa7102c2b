#!/usr/bin/env python3
"""Remote build cache figures for issue 17: a second machine through the shared cache, as ratios of
a cold build.

    python benchmarks/bench_cache.py [--jobs 2] [--store redis|webdav]

Starts a real redis-server (or nginx with its dav module) on 127.0.0.1, then builds the
built-in recipe (demo-host: the pinned upstream from the PyPI sdist, with the team's stack) for
the host through the kzbuild CLI as a subprocess, on three "machines": each a fresh copy of the
project with its own kzbuild cache dir (empty ccache) and work dir, sharing only the store (and
the downloaded sdists). Each machine syncs first, untimed: the figures are `kzbuild build` after
the sync, the same command on every machine.

1. machine A: cold build (empty ccache, empty store), which pushes its artifact and fills the
   store's ccache entries;
2. machine B, artifacts off (`.kz/config.yaml` with `artifacts: false`): compiles, with
   ccache's remote storage (goal: at most 20 % of the cold build);
3. machine C (a second "machine B"), everything on: pulls A's artifact, compiles nothing
   (goal: at most 2 % of the cold build).

Runs a full cold llama.cpp build: about 5 minutes on 2 idle cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fixtures_build import real_project  # noqa: E402


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_listening(process: subprocess.Popen[bytes], port: int, what: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"{what} exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{what} did not start listening")


def start_store(kind: str, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A real store on 127.0.0.1 and its URL (redis with a password, as a team would run it)."""
    port = free_port()
    workdir.mkdir(parents=True)
    if kind == "redis":
        argv = [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--requirepass",
            "bench-pw",
            "--dir",
            str(workdir),
            "--logfile",
            str(workdir / "redis.log"),
        ]
        url = f"redis://:bench-pw@127.0.0.1:{port}"
    else:
        for sub in ("tmp", "data"):
            (workdir / sub).mkdir()
        temp = "\n".join(
            f"    {name}_temp_path {workdir}/tmp/{name};"
            for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        user = "user root root;" if os.geteuid() == 0 else ""
        (workdir / "nginx.conf").write_text(
            f"daemon off;\nworker_processes 1;\n{user}\npid {workdir}/nginx.pid;\nerror_log "
            f"{workdir}/error.log warn;\n"
            f"events {{ worker_connections 64; }}\nhttp {{\n    access_log off;\n{temp}\n    "
            "client_max_body_size 0;\n"
            f"    server {{\n        listen 127.0.0.1:{port};\n        root {workdir}/data;\n"
            "        location / { dav_methods PUT DELETE MKCOL; create_full_put_path on; }\n    "
            "}\n}\n"
        )
        argv = [
            "nginx",
            "-p",
            str(workdir),
            "-c",
            str(workdir / "nginx.conf"),
            "-e",
            str(workdir / "error.log"),
        ]
        url = f"http://127.0.0.1:{port}/cache"
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(process, port, argv[0])
    return process, url


class Machine:
    def __init__(self, tmp: Path, name: str, jobs: int, url: str, config: str = "") -> None:
        project = real_project(
            tmp / name, fresh_cache=True
        )  # only the downloaded sdists are shared
        self.project, self.cache, self.work = project.root, project.cache, project.work
        self.jobs = jobs
        self.url = url
        if config:
            (self.project / ".kz").mkdir()
            (self.project / ".kz" / "config.yaml").write_text(config)

    def kzbuild(
        self, *args: str, env: dict[str, str]
    ) -> tuple[float, subprocess.CompletedProcess[str]]:
        argv = [
            sys.executable,
            "-m",
            "kzbuild",
            "--project",
            str(self.project),
            "--cache-dir",
            str(self.cache),
            "--work-dir",
            str(self.work),
            *args,
        ]
        start = time.perf_counter()
        result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=env)
        seconds = time.perf_counter() - start
        if result.returncode != 0:
            sys.exit(
                f"kzbuild {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-3000:]}"
            )
        return seconds, result

    def build(self) -> tuple[float, dict[str, object]]:
        env = {k: v for k, v in os.environ.items() if k != "KZ_REMOTE_CACHE"}
        self.kzbuild("sync", "demo-host", env=env)  # untimed: every machine needs the tree
        if not (self.project / ".kz" / "config.yaml").exists():
            env["KZ_REMOTE_CACHE"] = self.url
        seconds, result = self.kzbuild(
            "build", "demo-host", "--target", "host", "-j", str(self.jobs), "--json", env=env
        )
        data: dict[str, object] = json.loads(result.stdout)
        return seconds, data


def describe(label: str, seconds: float, data: dict[str, object], cold: float | None) -> str:
    parts = [f"{label:34} {seconds:8.1f} s"]
    if cold is not None:
        parts.append(f"{100 * seconds / cold:6.1f} % of cold")
    ccache = data.get("ccache")
    if isinstance(ccache, dict) and ccache.get("hits", 0) + ccache.get("misses", 0):
        compiles = ccache["hits"] + ccache["misses"]
        parts.append(
            f"ccache: {compiles} compiles, {ccache['misses']} compiled, {ccache['local_hits']} "
            "local hits, "
            f"{ccache['remote_hits']} remote hits ({100 * ccache['remote_hits'] / compiles:.0f} %)"
        )
    remote = data.get("remote")
    if isinstance(remote, dict):
        if remote.get("pulled"):
            parts.append(
                f"pulled {remote['downloaded_bytes'] / 1e6:.1f} MB in {remote['seconds']:.2f} s, "
                "nothing compiled"
            )
        if remote.get("pushed"):
            parts.append(
                f"pushed {remote['uploaded_bytes'] / 1e6:.1f} MB in {remote['seconds']:.2f} s"
            )
    return "  ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--store", choices=("redis", "webdav"), default="redis")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kz-bench-cache-"))
    server, url = start_store(args.store, tmp / "store")
    try:
        print(
            f"store: {args.store} on 127.0.0.1; jobs {args.jobs}; each figure is `kzbuild build` "
            "after an untimed sync"
        )
        cold, data = Machine(tmp, "a", args.jobs, url).build()
        print(describe("machine A: cold build, then push", cold, data, None))
        b_cc, data = Machine(
            tmp, "b", args.jobs, url, f"remote-cache:\n  url: {url}\n  artifacts: false\n"
        ).build()
        print(describe("machine B via remote ccache", b_cc, data, cold) + "   (goal <= 20 %)")
        b_pull, data = Machine(tmp, "c", args.jobs, url).build()
        print(describe("machine B via artifact pull", b_pull, data, cold) + "   (goal <= 2 %)")
    finally:
        if server.poll() is None:
            os.kill(server.pid, signal.SIGTERM)
            server.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
