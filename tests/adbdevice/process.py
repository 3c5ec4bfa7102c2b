"""An adb test device served by a Python process of its own, for benchmarks: its work then does not
wait on the measuring process's GIL, as a real device's would not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# the device in its own process: prints its port, serves until stdin closes
DEVICE_MAIN = (
    "import sys; from pathlib import Path; from tests.adbdevice import AdbTestDevice; "
    "d = AdbTestDevice(Path(sys.argv[1])); print(d.port, flush=True); sys.stdin.read(); d.stop()"
)


class DeviceProcess:
    """``AdbTestDevice(base)`` in a child process started from ``repo`` (where ``tests`` is)."""

    def __init__(self, base: Path, repo: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", DEVICE_MAIN, str(base)],
            cwd=repo,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        port = self.process.stdout.readline().strip()
        if not port:  # it failed to start (no Android toybox built, say): its error is above
            raise RuntimeError(f"the adb test device's process exited ({self.process.wait()})")
        self.serial = f"127.0.0.1:{port}"

    def stop(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        self.process.wait(timeout=30)
