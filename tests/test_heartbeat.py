"""The slow tier is never silent for a minute: tests/heartbeat.py names a long test while it
runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.conftest import REPO_ROOT


def test_a_long_test_is_named_on_stderr_every_interval_while_it_runs(tmp_path):
    (tmp_path / "test_long.py").write_text(
        "import time\n\ndef test_quick():\n    pass\n\ndef test_long():\n    time.sleep(1.3)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "KZ_TEST_HEARTBEAT": "0.5"}
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.heartbeat", "test_long.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    beats = re.findall(r"\[\d\d:\d\d:\d\dZ\] still running (\S+) \(0 min 0[01] s\)", ran.stderr)
    assert beats == ["test_long.py::test_long"] * 2, ran.stderr  # at 0.5 s and 1 s, not after it
