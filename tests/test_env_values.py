"""Any value of every KZ_* variable kzbuild reads is taken or refused with a clear error: never a
traceback. Path variables drive the CLI (under a temp dir); KZ_REMOTE_CACHE goes through its
parser only (a generated host name must not reach a resolver); the lock variables take and
release a real lock on a local device root."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kzbuild.adapters.settings import Settings
from kzbuild.build import remotecache
from kzbuild.cli import main
from kzbuild.cli.ui import PROGRESS_INTERVAL_ENV, progress_interval
from kzbuild.device import devicelock
from kzbuild.device.local import LocalTransport
from kzbuild.errors import ConfigError

INTERNAL_ERROR = 70
PATH_VARIABLES = ("KZ_PROJECT", "KZ_CACHE_DIR", "KZ_WORK_DIR", "KZ_RESULTS_DIR")
# an environment value: any text but NUL (which no environment can hold)
VALUE = st.one_of(
    st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=40),
    st.sampled_from(["", " ", "nan", "inf", "-inf", "-1", "0", "1e400", "1" * 5000, "\n", "x\ny"]),
)
GENERATED = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def env_value(text: str) -> str:
    """os.environ takes what the process's encoding can hold (surrogates escape odd bytes)."""
    return os.fsdecode(os.fsencode(text))


@GENERATED
@given(variable=st.sampled_from(PATH_VARIABLES), raw=VALUE)
@example(variable="KZ_RESULTS_DIR", raw="1" * 5000)
@example(variable="KZ_CACHE_DIR", raw="1" * 5000)
@example(variable="KZ_WORK_DIR", raw="1" * 5000)
@example(variable="KZ_RESULTS_DIR", raw="a/" * 3000)
def test_any_path_variable_is_taken_or_refused(
    project, capsys, monkeypatch, tmp_path, variable, raw
):
    monkeypatch.chdir(tmp_path)  # relative values land here
    part = raw.replace("..", "__").lstrip("/")  # never outside the temp dir
    value = env_value(str(tmp_path / "env" / part) if part else "")
    for name in PATH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, value)
    capsys.readouterr()
    args = [] if variable == "KZ_PROJECT" else ["--project", str(project.root)]
    code = main([*args, "results", "list", "--json"])
    err = capsys.readouterr().err
    assert code != INTERNAL_ERROR and "Traceback" not in err, err
    assert code in (0, 2, 13, 14), err


@GENERATED
@given(raw=VALUE)
@example(raw="redis://:pw@h:notaport")
@example(raw="http://[::1")
def test_any_remote_cache_value_is_a_config_or_a_config_error(project, raw):
    try:
        config = remotecache.load_config(project.settings, {remotecache.ENV: env_value(raw)})
    except ConfigError as exc:
        assert remotecache.ENV in exc.message
        return
    assert config is None or config.url.split("://")[0] in ("redis", "http", "https")


@GENERATED
@given(variable=st.sampled_from([devicelock.LEASE_ENV, devicelock.HOST_ENV]), raw=VALUE)
def test_any_lock_setting_takes_and_releases_the_lock_or_is_refused_untouched(
    monkeypatch, tmp_path, variable, raw
):
    monkeypatch.delenv(devicelock.LEASE_ENV, raising=False)
    monkeypatch.delenv(devicelock.HOST_ENV, raising=False)
    monkeypatch.setenv(variable, env_value(raw))
    root = tmp_path / "device"
    try:
        with devicelock.device_lock(LocalTransport(str(root)), str(root), "test"):
            assert (root / ".lock").is_dir()
    except ConfigError as exc:
        assert variable in exc.message
    assert not (root / ".lock").exists()


@GENERATED
@given(raw=VALUE)
def test_any_progress_interval_is_a_positive_finite_number(monkeypatch, raw):
    monkeypatch.setenv(PROGRESS_INTERVAL_ENV, env_value(raw))
    assert 0 < progress_interval() < float("inf")


def test_every_kz_variable_kzbuild_reads_is_generated_here():
    source = "\n".join(p.read_text() for p in Path("kzbuild").rglob("*.py"))
    read = {
        name
        for name in (
            "KZ_PROJECT",
            "KZ_CACHE_DIR",
            "KZ_WORK_DIR",
            "KZ_RESULTS_DIR",
            remotecache.ENV,
            devicelock.LEASE_ENV,
            devicelock.HOST_ENV,
            PROGRESS_INTERVAL_ENV,
        )
        if name in source
    }
    env_reads = {
        line.split('"')[1]
        for line in source.splitlines()
        if ('environ.get("KZ_' in line or '_env_path(environ, "KZ_' in line or '= "KZ_' in line)
        and line.count('"') >= 2
    }
    assert env_reads - {"KZ_LLAMA_SOURCE", "KZ_LLAMA_BUILD"} <= read, env_reads - read
    assert isinstance(Settings, type)
