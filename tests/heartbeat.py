"""A line on the terminal at least once a minute while one test runs long.

pytest holds a test's output until the test ends, so the slow tier's host build (tens of minutes
from cold, in the setup of the first test that needs it) would be silent; kzbuild's own progress
lines are captured with the rest. While a test's setup, call and teardown run longer than
``KZ_TEST_HEARTBEAT`` seconds (default 60), this plugin writes to the real stderr, every such
interval, which test is running and for how long.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import pytest

INTERVAL_ENV = "KZ_TEST_HEARTBEAT"


def pytest_configure(config: pytest.Config) -> None:
    capture = config.pluginmanager.getplugin("capturemanager")  # None with -p no:capture
    with capture.global_and_fixture_disabled() if capture else nullcontext():
        stderr = os.dup(2)  # the terminal (or CI's log), not pytest's capture
    config.stash[HEARTBEAT] = Heartbeat(stderr, float(os.environ.get(INTERVAL_ENV, "60")))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    with item.config.stash[HEARTBEAT].watching(item.nodeid):
        return (yield)


@dataclass(frozen=True)
class Heartbeat:
    fd: int  # a copy of the real stderr, made while pytest's capture was off
    interval: float

    @contextmanager
    def watching(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.interval):
                elapsed = int(time.monotonic() - started)
                stamp = time.strftime("%H:%M:%SZ", time.gmtime())
                line = (
                    f"\n[{stamp}] still running {name} ({elapsed // 60} min {elapsed % 60:02d} s)\n"
                )
                os.write(self.fd, line.encode())

        thread = threading.Thread(target=beat, name=f"heartbeat {name}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


HEARTBEAT = pytest.StashKey[Heartbeat]()
