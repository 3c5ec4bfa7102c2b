"""Hostile cache servers (tests/hostileservers.py, on 127.0.0.1): whatever they answer, the build
finishes locally within the cache's time budget, with one warning, and no credential leaves its
host."""

from __future__ import annotations

import re
import time

import pytest

from kzbuild.build import remotecache
from kzbuild.model.remotecache import RemoteConfig
from tests.hostileservers import HTTP_MODES, REDIS_MODES, FakeHttpStore, FakeRedis
from tests.test_remote_cache import Machine, machines  # noqa: F401  (a fixture)

PASSWORD = "hostile-pw-7"
pytestmark = pytest.mark.usefixtures("machines")


def hostile(kind: str) -> FakeRedis | FakeHttpStore:
    return FakeRedis(PASSWORD) if kind == "redis" else FakeHttpStore("kz", PASSWORD)


CASES = [("redis", mode) for mode in REDIS_MODES] + [("http", mode) for mode in HTTP_MODES]


@pytest.mark.parametrize(("kind", "mode"), CASES)
def test_a_hostile_cache_costs_one_warning_and_at_most_the_timeout(
    machines,  # noqa: F811
    kind,
    mode,
):
    a, b = machines
    server = hostile(kind)
    try:
        url = server.url()
        for machine in (a, b):
            machine.config(f"remote-cache:\n  url: {url}\n  ccache: false\n")
        first = a.build(remote=url)
        assert first.code == 0 and first.data["remote"]["pushed"] is True, first.err
        server.mode = mode
        started = time.monotonic()
        result = b.build(remote=url)
        elapsed = time.monotonic() - started
    finally:
        server.close()
    assert result.code == 0, result.err
    assert server.hostile_answers == 1, result.err
    remote = result.data["remote"]
    assert remote["pulled"] is False and remote["seconds"] <= 3.0, remote
    err = " ".join(result.err.split())
    assert "Traceback" not in result.err and PASSWORD not in result.out + result.err
    if mode == "manifest-1tib":
        assert (
            re.search(r"claims 1099511\d{6} bytes", remote["refused"]) and "building locally" in err
        )
    elif mode == "redirect":
        assert server.elsewhere_headers, "the redirect was not followed"
        assert all("authorization" not in headers for headers in server.elsewhere_headers)
    else:
        assert (
            len(remote["problems"]) == 1 and err.count("building with the local caches only") == 1
        ), err
    assert elapsed < 60


def test_a_redirect_to_the_same_server_keeps_the_credentials():
    server = FakeHttpStore("kz", PASSWORD)
    try:
        server.data["/cache/kz/objects/x"] = b"moved"
        server.mode = "redirect-here"
        store = remotecache.HttpStore(server.url(), 2.0)
        assert store.get("artifacts/x", 10) == b"moved" and server.hostile_answers == 1
    finally:
        server.close()


def test_every_bound_of_the_redis_client_is_a_store_error():
    server = FakeRedis()
    try:
        server.data[b"kz:artifacts/x"] = b"x" * 1000  # 16 s at the drip rate
        config = RemoteConfig(url=server.url(), source="test", timeout=1.0)
        for mode in REDIS_MODES:
            if mode == "manifest-1tib":
                continue  # a well-formed answer: refused by the pull (above)
            server.mode = mode
            store = remotecache.open_store(config)
            started = time.monotonic()
            with pytest.raises(remotecache.StoreError, match=r"\w"):
                store.get("artifacts/x", 1 << 20)
            store.close()
            assert time.monotonic() - started < 1.5, mode  # the 1 s deadline, whatever the answer
    finally:
        server.close()
