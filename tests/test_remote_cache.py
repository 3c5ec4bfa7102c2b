"""The remote build cache on real engines: redis-server and nginx's WebDAV, started on 127.0.0.1.

"Two machines" are two clones of one project (the tiny llama.cpp-shaped upstream), each with its
own kzbuild cache dir (so its own ccache) and work dir (so its own artifacts), sharing one store.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kzbuild.adapters import proc
from kzbuild.build import remotecache
from kzbuild.cli import main
from kzbuild.errors import ConfigError
from tests.conftest import Project, have
from tests.fixtures_build import Tiny
from tests.fixtures_cache import DAV_PASSWORD, DAV_USER

pytestmark = pytest.mark.skipif(
    not (have("cmake") and have("ninja") and have("ccache") and have("gcc")),
    reason="needs cmake, ninja, ccache, gcc",
)


@dataclass
class Run:
    code: int
    out: str
    err: str

    @property
    def data(self) -> dict[str, object]:
        return json.loads(self.out)  # type: ignore[no-any-return]


@dataclass
class Machine:
    project: Project
    capsys: pytest.CaptureFixture[str]
    monkeypatch: pytest.MonkeyPatch

    def kz(self, *args: str, remote: str | None = None) -> Run:
        """kzbuild in-process on this machine; ``remote`` is KZ_REMOTE_CACHE (None: unset)."""
        if remote is None:
            self.monkeypatch.delenv(remotecache.ENV, raising=False)
        else:
            self.monkeypatch.setenv(remotecache.ENV, remote)
        self.capsys.readouterr()
        code = main(
            [
                "--project",
                str(self.project.root),
                "--cache-dir",
                str(self.project.cache),
                "--work-dir",
                str(self.project.work),
                *args,
            ]
        )
        captured = self.capsys.readouterr()
        return Run(code, captured.out, captured.err)

    def build(self, *extra: str, remote: str | None = None) -> Run:
        return self.kz("build", "tiny", "--json", *extra, remote=remote)

    def config(self, text: str) -> Path:
        return self.project.write(".kz/config.yaml", text)


@pytest.fixture
def machines(
    tiny: Tiny, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[Machine, Machine]:
    """Machine A is the tiny project; machine B a clone of it with its own cache and work dirs."""
    root_b = tmp_path / "machine-b" / "project"
    shutil.copytree(tiny.project.root, root_b)
    b = Project(
        root=root_b, cache=tmp_path / "machine-b" / "cache", work=tmp_path / "machine-b" / "work"
    )
    return Machine(tiny.project, capsys, monkeypatch), Machine(b, capsys, monkeypatch)


@pytest.fixture(params=["redis", "webdav"])
def store(request: pytest.FixtureRequest) -> str:
    """The URL of an empty store, redis or nginx WebDAV."""
    if request.param == "redis":
        return str(request.getfixturevalue("redis_cache").url())
    return str(request.getfixturevalue("dav_cache").url())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- two machines ----------------------------------------------------------------------


def test_machine_b_pulls_the_artifact_of_a_and_compiles_nothing(machines, store):
    a, b = machines
    built = a.build(remote=store)
    assert built.code == 0, built.err
    a_data = built.data
    assert (
        a_data["reused"] is False
        and a_data["remote"]["pushed"] is True
        and a_data["remote"]["uploaded_bytes"] > 0
    )

    pulled = b.build(remote=store)
    assert pulled.code == 0, pulled.err
    data = pulled.data
    assert data["build_id"] == a_data["build_id"]
    assert data["remote"]["pulled"] is True and data["remote"]["refused"] is None
    assert data["ccache"] is None  # nothing compiled ...
    assert not Path(
        str(data["log"])
    ).exists()  # ... no build ran: no build log, no build dir, no ccache
    assert not (b.project.work / "build").exists() and not (b.project.cache / "ccache").exists()
    artifact = Path(str(data["artifact"]))
    for rel in ("bin/llama-bench", "lib/libggml.so"):
        assert sha256(artifact / rel) == sha256(Path(str(a_data["artifact"])) / rel)
    assert os.access(artifact / "bin" / "llama-bench", os.X_OK)
    out = subprocess.run(
        [artifact / "bin" / "llama-bench"], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip().endswith("answer=42")

    text = b.kz("build", "tiny", remote=store)  # the artifact is now local: no store involved
    assert text.code == 0 and "up to date" in text.out


def test_machine_b_gets_remote_ccache_hits_with_the_artifact_store_off(machines, store):
    """Every object A compiled, B gets from the store. (The tiny upstream compiles one tools/main.c
    three times the same way: after the first, those are hits in B's own local ccache.)"""
    a, b = machines
    a.config(f"remote-cache:\n  url: {store}\n")
    a_result = a.build()
    assert a_result.code == 0
    a_misses = a_result.data["ccache"]["misses"]
    assert a_misses >= 2
    b.config(f"remote-cache:\n  url: {store}\n  artifacts: false\n")
    result = b.build()
    assert result.code == 0, result.err
    data = result.data
    assert (
        data["reused"] is False
        and data["remote"]["pulled"] is False
        and data["remote"]["pushed"] is False
    )
    ccache = data["ccache"]
    assert ccache["misses"] == 0 and ccache["hits"] >= 4  # B compiled nothing
    # B's ccache starts empty, so each distinct object's first hit came from the store. A's misses
    # can count one object twice (two identical compiles racing under ninja -j2), so they are an
    # upper bound on the distinct objects, and 2 (main.c and the library) the lower one.
    assert ccache["remote_hits"] >= 2, ccache
    assert ccache["remote_hits"] + ccache["local_hits"] == ccache["hits"]
    text = b.kz("cache", "stats", "--json")
    stats = json.loads(text.out)
    assert (
        stats["local"]["ccache"]["remote_hits"] == ccache["remote_hits"]
        and stats["artifact_lookups"]["built"] == 1
    )


def test_ci_on_machine_b_pulls_what_a_built(machines, redis_cache):
    a, b = machines
    assert a.build(remote=redis_cache.url()).code == 0
    result = b.kz("ci", "tiny", "--target", "host", remote=redis_cache.url())
    assert result.code == 0, result.err
    step = next(s for s in json.loads(result.out)["steps"] if s["step"] == "build:host")
    assert "(pulled from the remote cache)" in step["detail"] and step["remote"]["pulled"] is True
    assert (
        b.kz("ci", "tiny", "--target", "host", "--no-remote-cache", remote=redis_cache.url()).code
        == 0
    )


def test_cache_stats_shows_local_and_remote_sizes_and_hit_rates(machines, redis_cache):
    a, b = machines
    url = redis_cache.url()
    assert a.build(remote=url).code == 0
    assert b.build(remote=url).code == 0
    assert b.build(remote=url).code == 0  # local this time
    stats = json.loads(b.kz("cache", "stats", "--json", remote=url).out)
    assert stats["artifact_lookups"] == {
        "local": 1,
        "pulled": 1,
        "built": 0,
        "local_hit_rate": 0.5,
        "remote_hit_rate": 0.5,
    }
    assert (
        stats["local"]["artifacts"]["count"] == 1 and stats["local"]["artifacts"]["size_bytes"] > 0
    )
    remote = stats["remote"]
    assert (
        remote["url"] == f"redis://:****@127.0.0.1:{redis_cache.port}"
        and remote["size_bytes"] > 0
        and remote["entries"] >= 5
    )
    assert 0 < remote["server_hit_rate"] <= 1
    text = b.kz("cache", "stats", remote=url)
    assert (
        "1 pulled (50%)" in text.out
        and "server hit rate" in text.out
        and redis_cache.password not in text.out
    )
    assert "none configured" in b.kz("cache", "stats", "--no-remote-cache", remote=url).out


# --- a cache that is down or hangs -------------------------------------------------------


@pytest.mark.parametrize("kind", ["redis", "http"])
@pytest.mark.parametrize("failure", ["down", "silent"])
def test_a_cache_that_is_down_or_silent_warns_and_the_build_is_local_and_correct(
    machines, kind, failure, closed_port, silent_server
):
    a, _ = machines
    port = closed_port if failure == "down" else silent_server.port
    url = (
        f"redis://:secret-x@127.0.0.1:{port}"
        if kind == "redis"
        else f"http://me:secret-x@127.0.0.1:{port}/cache"
    )
    started = time.monotonic()
    result = a.build(remote=url)
    elapsed = time.monotonic() - started
    assert result.code == 0, result.err
    data = result.data
    assert (
        data["remote"]["available"] is False and data["remote"]["seconds"] <= 2.5
    )  # given up within the 2 s timeout
    assert (
        data["ccache"]["misses"] >= 2 and data["ccache"]["remote_hits"] == 0
    )  # compiled here, with no remote storage for ccache
    err = " ".join(result.err.split())
    assert "remote cache" in err and "building with the local caches only" in err
    assert (
        ("no answer within the timeout" in err)
        if failure == "silent"
        else ("cannot connect" in err or "Connection refused" in err)
    )
    assert "secret-x" not in result.err + result.out
    out = subprocess.run(
        [Path(str(data["artifact"])) / "bin" / "llama-bench"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip().endswith("answer=42")
    assert elapsed < 60


def test_failed_remote_compiles_are_counted_and_warned_about(machines, redis_cache):
    """A redis user that may only touch kzbuild's keys: the probe and the artifacts work, ccache's
    own lookups fail."""
    a, _ = machines
    redis_cache.call("ACL", "SETUSER", "kzonly", "on", ">kz-only-pw", "~kz:*", "+@all")
    result = a.build(remote=f"redis://kzonly:kz-only-pw@127.0.0.1:{redis_cache.port}")
    assert result.code == 0, result.err
    data = result.data
    assert data["remote"]["pushed"] is True  # the artifact layer works ...
    assert (
        data["ccache"]["remote_errors"] >= 2 and data["ccache"]["misses"] >= 2
    )  # ... ccache's lookups failed and it compiled
    err = " ".join(result.err.split())
    assert (
        f"ccache's remote storage failed for {data['ccache']['remote_errors']} of" in err
        and "kz-only-pw" not in err
    )


def test_turning_the_cache_on_or_off_does_not_rerun_cmake(machines, redis_cache):
    a, _ = machines
    first = a.build(remote=redis_cache.url()).data
    assert first["times"]["configure_s"] > 0
    shutil.rmtree(Path(str(first["artifact"])))
    again = a.build("--no-remote-cache").data
    assert (
        again["reused"] is False and again["times"]["configure_s"] == 0 and again["remote"] is None
    )
    manifest = json.loads((Path(str(again["artifact"])) / "manifest.json").read_text())
    assert "CCACHE_REMOTE_STORAGE" not in manifest["env"]


# --- never trust the store ---------------------------------------------------------------


def test_a_tampered_artifact_in_redis_is_refused_then_repaired(machines, redis_cache):
    a, b = machines
    url = redis_cache.url()
    a_data = a.build(remote=url).data
    lib = Path(str(a_data["artifact"])) / "lib" / "libggml.so"
    good = sha256(lib)
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte changed, same size
    redis_cache.call("SET", f"kz:objects/{good}", bytes(data))

    result = b.build(remote=url)
    assert result.code == 0, result.err  # the build does not fail because of the cache ...
    data = result.data
    refused = data["remote"]["refused"]
    assert (
        refused is not None
        and "lib/libggml.so: sha256" in refused
        and f"the manifest says {good}" in refused
    )
    err = " ".join(result.err.split())
    assert "refusing the artifact" in err and "building locally" in err
    assert (
        data["reused"] is False and data["ccache"]["misses"] + data["ccache"]["hits"] >= 4
    )  # ... it compiled instead
    assert sha256(Path(str(data["artifact"])) / "lib" / "libggml.so") == good
    assert not list(
        (b.project.work / "artifacts").glob(".tmp-*")
    )  # nothing of the refused artifact stays
    assert data["remote"]["pushed"] is True
    stored = redis_cache.call("GET", f"kz:objects/{good}")
    assert (
        isinstance(stored, bytes) and hashlib.sha256(stored).hexdigest() == good
    )  # the push replaced the damaged content


def test_a_tampered_file_on_webdav_is_refused(machines, dav_cache):
    a, b = machines
    a_data = a.build(remote=dav_cache.url()).data
    bench = Path(str(a_data["artifact"])) / "bin" / "llama-bench"
    stored = dav_cache.data / "cache" / "kz" / "objects" / sha256(bench)
    stored.write_bytes(b"#!/bin/sh\necho owned\n")
    result = b.build(remote=dav_cache.url())
    assert result.code == 0, result.err
    assert "bin/llama-bench: sha256" in result.data["remote"]["refused"]
    out = subprocess.run(
        [Path(str(result.data["artifact"])) / "bin" / "llama-bench"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "owned" not in out and out.strip().endswith("answer=42")


def test_a_manifest_of_other_inputs_is_refused(machines, redis_cache):
    a, b = machines
    url = redis_cache.url()
    a_data = a.build(remote=url).data
    key = f"kz:artifacts/{a_data['build_id']}.json"
    doc = json.loads(redis_cache.call("GET", key))
    doc["inputs"]["patches"] = [["evil.patch", "0" * 64]]
    redis_cache.call("SET", key, json.dumps(doc))
    result = b.build(remote=url)
    assert (
        result.code == 0
        and "inputs are not the ones this build id is the hash of"
        in result.data["remote"]["refused"]
    )


def test_a_password_in_the_url_never_reaches_logs_errors_or_files(machines, redis_cache):
    a, b = machines
    password = redis_cache.password
    url = redis_cache.url()
    outputs = [
        a.kz("-v", "build", "tiny", remote=url),
        b.kz("-v", "build", "tiny", "--json", remote=url),
    ]
    outputs.append(b.kz("-v", "build", "tiny", "--dry-run", remote=url))
    outputs.append(a.kz("-v", "build", "tiny", "--dry-run", "--json", remote=url))
    outputs.append(a.kz("-v", "cache", "stats", remote=url))
    wrong = f"redis://:{password}-wrong@127.0.0.1:{redis_cache.port}"
    outputs.append(a.kz("-v", "build", "tiny", "--json", "--no-remote-cache", remote=wrong))
    shutil.rmtree(a.project.work / "artifacts")
    refused = a.kz(
        "-v", "build", "tiny", remote=wrong
    )  # the server refuses the password: a warning that names the URL
    outputs.append(refused)
    outputs.append(
        a.kz("-v", "build", "tiny", remote=f"ftp://:{password}@127.0.0.1/")
    )  # a bad URL: the error quotes it
    assert outputs[-1].code == 2 and "redis://, http:// or https://" in " ".join(
        outputs[-1].err.split()
    )
    assert "WRONGPASS" in refused.err or "invalid username-password" in refused.err
    for run in outputs:
        assert run.code in (0, 2), run.err
        assert password not in run.out + run.err
    # -v shows the compile's CCACHE_REMOTE_STORAGE (ccache's form of the URL), redacted
    assert (
        f"CCACHE_REMOTE_STORAGE='redis://****@127.0.0.1:{redis_cache.port}|connect-timeout=2000"
        in "".join(outputs[0].err.split())
    )
    assert f"remote redis://:****@127.0.0.1:{redis_cache.port} (artifacts and ccache" in " ".join(
        outputs[2].out.split()
    )  # the dry-run plan
    files = [p for m in (a, b) for p in (m.project.work / "artifacts").rglob("*") if p.is_file()]
    files += [p for m in (a, b) for p in (m.project.work / "build").rglob("*.log") if p.is_file()]
    assert any(p.suffix == ".log" for p in files) and any(p.name == "manifest.json" for p in files)
    for path in files:
        assert password.encode() not in path.read_bytes(), path


def test_webdav_behind_basic_auth(machines, dav_cache):
    a, b = machines
    url = dav_cache.url(f"{DAV_USER}:{DAV_PASSWORD}")
    assert a.build(remote=url).code == 0
    assert any(p.startswith("private/cache/kz/artifacts/") for p in dav_cache.stored())
    assert any(
        p.startswith("private/cache/ccache/") for p in dav_cache.stored()
    )  # ccache sent the same credentials
    pulled = b.build(remote=url)
    assert pulled.code == 0 and pulled.data["remote"]["pulled"] is True
    shutil.rmtree(b.project.work / "artifacts")
    wrong = b.kz(
        "-v", "build", "tiny", "--json", remote=dav_cache.url(f"{DAV_USER}:wrong-{DAV_PASSWORD}")
    )
    assert wrong.code == 0 and wrong.data["remote"]["available"] is False
    assert "HTTP 401" in " ".join(wrong.err.split()) and DAV_PASSWORD not in wrong.err + wrong.out
    assert f"http://{DAV_USER}:****@127.0.0.1:{dav_cache.port}/private/cache" in wrong.out


# --- configuration -----------------------------------------------------------------------


def test_config_file_env_and_opt_out(project):
    assert remotecache.load_config(project.settings, {}) is None
    path = project.write(
        ".kz/config.yaml",
        "remote-cache:\n  url: http://u:pw@cache.lan:8080/kz\n  ccache: false\n  timeout: 0.5\n",
    )
    config = remotecache.load_config(project.settings, {})
    assert config is not None and (
        config.kind,
        config.artifacts,
        config.ccache,
        config.timeout,
    ) == ("http", True, False, 0.5)
    assert config.shown == "http://u:****@cache.lan:8080/kz" and config.source == f"{path}:2"
    from_env = remotecache.load_config(
        project.settings, {remotecache.ENV: "redis://cache.lan:6379/2"}
    )
    assert (
        from_env is not None
        and from_env.url == "redis://cache.lan:6379/2"
        and from_env.source == remotecache.ENV
        and not from_env.ccache
    )
    assert (
        remotecache.load_config(
            project.settings, {remotecache.ENV: "redis://cache.lan"}, disabled=True
        )
        is None
    )


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (
            "remote-cache:\n  url: ftp://x\n",
            2,
            "url: 'ftp://x': the scheme must be redis://, http:// or https://",
        ),
        ("remote-cache:\n  url: redis://h/x\n", 2, "the database number"),
        ("remote-cache:\n  url: http://h:99999/\n", 2, "is not a URL"),
        ("remote-cache:\n  url: http://h/|layout=flat\n", 2, "ccache attributes"),
        (
            "remote-cache:\n  url: http://h/\n  timeout: fast\n",
            3,
            "timeout: must be a number of seconds",
        ),
        (
            "remote-cache:\n  url: http://h/\n  artifacts: yes please\n",
            3,
            "artifacts: must be true or false",
        ),
        ("remote-cache:\n  url: http://h/\n  ccahce: false\n", 3, "did you mean 'ccache'"),
        ("remote-cache:\n  artifacts: false\n", 2, "missing required key 'url'"),
        ("remote_cache:\n  url: http://h/\n", 1, "unknown key"),
    ],
)
def test_config_errors_name_the_file_line_and_key(project, text, line, message):
    path = project.write(".kz/config.yaml", text)
    with pytest.raises(ConfigError) as info:
        remotecache.load_config(project.settings, {})
    assert info.value.message.startswith(
        f"{path}:{line}: "
    ) and message in info.value.message + str(info.value.hint)


def test_a_bad_url_in_the_environment_names_the_variable(kz, monkeypatch):
    monkeypatch.setenv(remotecache.ENV, "redis://:pw-bad@")
    result = kz("cache", "stats")
    assert (
        result.code == 2
        and "KZ_REMOTE_CACHE: 'redis://:****@' names no host" in result.err
        and "pw-bad" not in result.err
    )


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    text=st.one_of(
        st.text(max_size=80),
        st.builds(
            lambda url, extra: f"remote-cache:\n  url: {url}\n{extra}",
            st.text(max_size=40),
            st.sampled_from(
                [
                    "",
                    "  timeout: 1e999\n",
                    "  ccache: 1\n",
                    "  artifacts: [1]\n",
                    "  timeout: -1\n",
                    "  url: x\n",
                ]
            ),
        ),
    )
)
def test_any_config_text_loads_or_is_a_config_error(project, text):
    project.write(".kz/config.yaml", text)
    try:
        config = remotecache.load_config(project.settings, {})
    except ConfigError as exc:
        assert str(project.root / ".kz" / "config.yaml") in exc.message
        return
    assert config is not None and config.url.split("://")[0] in ("redis", "http", "https")
    assert proc.redact(config.url) == config.shown


def test_redact_hides_every_url_password():
    text = (
        "CCACHE_REMOTE_STORAGE='redis://:pw1@h:1|x=1' http://user:pw2@h/x https://tok3@h "
        "redis://h:6379 user@host"
    )
    shown = proc.redact(text)
    assert "pw1" not in shown and "pw2" not in shown and "tok3" not in shown
    assert (
        "redis://:****@h:1" in shown
        and "http://user:****@h/x" in shown
        and "https://****@h" in shown
    )
    assert "redis://h:6379" in shown and "user@host" in shown  # no credentials: unchanged
    assert (
        proc.redact("device ssh://root@127.0.0.1:22/x, git+ssh://git@h/r")
        == "device ssh://root@127.0.0.1:22/x, git+ssh://git@h/r"
    )
    assert (
        proc.redact("https://u:p@ss@h.example/s and more") == "https://u:****@h.example/s and more"
    )  # an unencoded '@' in the password


def test_ccache_gets_the_store_with_kzbuild_timeouts():
    def url(text: str) -> str:
        config = remotecache.RemoteConfig(url=text, source="test", timeout=1.5)
        return remotecache.ccache_url(config)

    assert (
        url("redis://:pw@h:6379/1")
        == "redis://pw@h:6379/1|connect-timeout=1500|operation-timeout=1500"
    )
    assert url("redis://u:pw@h") == "redis://u:pw@h|connect-timeout=1500|operation-timeout=1500"
    assert (
        url("http://u:pw@h:8080/c/")
        == "http://u:pw@h:8080/c/ccache|connect-timeout=1500|operation-timeout=1500"
    )


def test_an_https_store_keeps_ccache_local_with_a_warning(caplog):
    url = "https://u:pw@cache.example:8443/c"
    config = remotecache.RemoteConfig(url=url, source="test")
    cache = remotecache.RemoteCache(
        config, remotecache.HttpStore(url, 1.0), []
    )  # constructed, never contacted
    assert cache.ccache_env() == {}
    assert "ccache's HTTP storage speaks no https" in caplog.text and "pw@" not in caplog.text
    http = remotecache.RemoteCache(
        remotecache.RemoteConfig(url="http://h/c", source="test"),
        remotecache.HttpStore("http://h/c", 1.0),
        [],
    )
    assert http.ccache_env() == {
        "CCACHE_REMOTE_STORAGE": "http://h/c/ccache|connect-timeout=2000|operation-timeout=2000"
    }


def test_a_redis_get_is_one_command_and_a_value_over_its_limit_is_refused(redis_cache):
    redis_cache.call("SET", "kz:objects/x", b"0123456789")
    store = remotecache.RedisStore(redis_cache.url(), 5.0)
    try:
        redis_cache.call("CONFIG", "RESETSTAT")
        assert (
            store.get("objects/x", 10) == b"0123456789" and store.get("objects/missing", 10) is None
        )
        stats = redis_cache.call("INFO", "commandstats")
        assert isinstance(stats, bytes)
        commands = {
            line.split(":")[0]
            for line in stats.decode().splitlines()
            if line.startswith("cmdstat_")
        }
        assert "cmdstat_get" in commands and "cmdstat_strlen" not in commands
        with pytest.raises(
            remotecache.StoreError, match=r"objects/x is 10 bytes, more than the 9 expected"
        ):
            store.get("objects/x", 9)
    finally:
        store.close()
