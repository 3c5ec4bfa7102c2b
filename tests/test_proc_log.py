"""The runner's log line: a command a user can paste, without the user's whole environment."""

from __future__ import annotations

import logging
import os

import pytest

from kzbuild.adapters import proc


def test_a_replaced_environment_logs_only_what_it_changes(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KZ_SECRET_TOKEN", "hunter2")
    monkeypatch.setenv("KZ_DROPPED", "x")
    env = {key: value for key, value in os.environ.items() if key != "KZ_DROPPED"}
    env["KZ_ADDED"] = "a b"
    with caplog.at_level(logging.INFO, logger="kzbuild"):
        result = proc.run(
            ["sh", "-c", 'printf %s "$KZ_ADDED${KZ_DROPPED-unset}"'], env=env, replace_env=True
        )
    assert result.stdout == "a bunset"
    line = caplog.records[-1].getMessage()
    assert line.startswith("$ KZ_ADDED='a b' env -u KZ_DROPPED sh -c")
    assert "hunter2" not in line and "PATH=" not in line
