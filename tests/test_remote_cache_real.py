"""Slow tier: the real llama.cpp host artifact through the remote cache, on redis and on nginx's
WebDAV."""

from __future__ import annotations

import dataclasses
import re

import pytest

from kzbuild.build import remotecache
from kzbuild.model.remotecache import RemoteConfig
from tests.fixtures_build import run_from_artifact

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("kind", ["redis", "webdav"])
def test_the_real_artifact_round_trips_through_the_store_and_runs(
    real_host_build, kind, request, tmp_path
):
    server = request.getfixturevalue("redis_cache" if kind == "redis" else "dav_cache")
    url = server.url()
    config = RemoteConfig(url=url, source="test")
    artifact = real_host_build.artifact

    pusher = remotecache.RemoteCache.open(config)
    pusher.push(artifact)
    pusher.close()
    assert pusher.pushed and pusher.uploaded >= artifact.total_size

    plan = dataclasses.replace(
        real_host_build.plan, artifact_dir=tmp_path / "machine-b" / "artifacts" / artifact.build_id
    )
    plan.artifact_dir.parent.mkdir(parents=True)
    puller = remotecache.RemoteCache.open(config)
    pulled = puller.pull(plan)
    puller.close()
    assert pulled is not None and puller.refused is None and not puller.problems
    assert pulled.files_digest == artifact.files_digest  # every path, sha256 and mode
    result = run_from_artifact(
        pulled, "test-backend-ops", "test", "-b", "CPU", "-o", "GATED_DELTA_NET"
    )
    assert result.returncode == 0 and re.search(r"(\d+)/\1 tests passed", result.stdout), (
        result.stdout[-2000:]
    )
