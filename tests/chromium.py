"""Headless Chromium (Debian's package, installed by scripts/setup) driven over its DevTools
pipe, as a user's browser: a fresh browser and profile each time, a page opened by its file URL,
scripts run in it, its console errors collected, a screenshot taken. Used by the report's
browser test and by benchmarks/bench_results.py."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

TIMEOUT_S = 60.0  # for one answer of the browser


class Chromium:
    def __init__(self, width: int = 1400, height: int = 1000) -> None:
        binary = shutil.which("chromium")
        assert binary, "chromium is missing: scripts/setup installs it (Debian package chromium)"
        # The browser reads commands on its fd 3 and writes answers on its fd 4.
        commands_in, self._commands = os.pipe()
        self._answers, answers_out = os.pipe()
        child_in = fcntl.fcntl(commands_in, fcntl.F_DUPFD_CLOEXEC, 10)
        child_out = fcntl.fcntl(answers_out, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(commands_in)
        os.close(answers_out)
        self.profile = Path(tempfile.mkdtemp(prefix="kz-chromium-"))

        def at_fds_3_and_4() -> None:
            os.dup2(child_in, 3)
            os.dup2(child_out, 4)

        self.process = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--remote-debugging-pipe",
                f"--user-data-dir={self.profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            preexec_fn=at_fds_3_and_4,
            close_fds=False,  # every other descriptor of ours is close-on-exec
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(child_in)
        os.close(child_out)
        self._buffer = b""
        self._sent = 0
        self.events: list[dict[str, Any]] = []
        self.session = ""
        try:
            targets = self.send("Target.getTargets")["targetInfos"]
            page = next(t for t in targets if t["type"] == "page")
            self.session = self.send(
                "Target.attachToTarget", {"targetId": page["targetId"], "flatten": True}
            )["sessionId"]
            self.send("Page.enable", session=True)
            self.send("Runtime.enable", session=True)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            assert left > 0 and select.select([self._answers], [], [], left)[0], "chromium hangs"
            chunk = os.read(self._answers, 1 << 20)
            assert chunk, "chromium closed its DevTools pipe"
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        found: dict[str, Any] = json.loads(message)
        return found

    def send(
        self, method: str, params: dict[str, Any] | None = None, *, session: bool = False
    ) -> dict[str, Any]:
        self._sent += 1
        message: dict[str, Any] = {"id": self._sent, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            answer = self._message(deadline)
            if answer.get("id") == self._sent:
                assert "error" not in answer, (method, answer["error"])
                result: dict[str, Any] = answer["result"]
                return result
            self.events.append(answer)

    def wait_for(self, event: str) -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT_S
        for seen in self.events:
            if seen.get("method") == event:
                self.events.remove(seen)
                return seen
        while True:
            message = self._message(deadline)
            if message.get("method") == event:
                return message
            self.events.append(message)

    def open(self, page: Path) -> None:
        """Open ``page`` and wait for its load event."""
        self.send("Page.navigate", {"url": page.as_uri()}, session=True)
        self.wait_for("Page.loadEventFired")

    def run(self, script: str) -> Any:
        """The value of a JavaScript expression in the page; a promise is waited for."""
        done = self.send(
            "Runtime.evaluate",
            {"expression": script, "awaitPromise": True, "returnByValue": True},
            session=True,
        )
        assert "exceptionDetails" not in done, done["exceptionDetails"]
        return done["result"].get("value")

    def errors(self) -> list[str]:
        """Uncaught exceptions and console.error calls of the page so far."""
        found = []
        for event in self.events:
            params = event.get("params", {})
            if event.get("method") == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                found.append(details.get("exception", {}).get("description", details["text"]))
            elif event.get("method") == "Runtime.consoleAPICalled" and params["type"] == "error":
                found.append(
                    " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
                )
        return found

    def screenshot(self, to: Path) -> None:
        shot = self.send("Page.captureScreenshot", {"format": "png"}, session=True)
        to.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        try:
            self.send("Browser.close")
            self.process.wait(timeout=TIMEOUT_S)
        except (AssertionError, OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        finally:
            os.close(self._commands)
            os.close(self._answers)
            shutil.rmtree(self.profile, ignore_errors=True)
