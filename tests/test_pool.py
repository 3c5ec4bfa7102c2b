"""measure/pool.py: comparisons dealt to devices in turn, each device's share on its own thread,
results in the items' order; a device's error waits for the others' shares; a feed keeps every
device busy and stops the comparisons an answer made moot."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kzbuild.measure.pool import deal, feed, spread


@settings(deadline=None)  # threads start on a busy machine
@given(devices=st.integers(1, 6), items=st.integers(1, 40))
def test_items_are_dealt_in_turn_and_come_back_in_their_order(devices, items):
    names = [f"d{n}" for n in range(devices)]
    shares = deal(names, range(items))
    assert [name for name, _ in shares] == names[: min(devices, items)]
    for n, (_, share) in enumerate(shares):
        assert share == list(range(n, items, devices))
    seen: dict[str, list[int]] = {}

    def work(device: str, mine: Sequence[int]) -> list[tuple[str, int]]:
        seen[device] = list(mine)
        return [(device, item) for item in mine]

    done = spread(names, list(range(items)), work)
    assert [item for _, item in done] == list(range(items))
    assert all(device == names[item % devices] for device, item in done)
    assert seen == dict(shares)


def test_each_device_works_on_its_own_thread_at_once():
    started = threading.Barrier(3, timeout=10)  # every share must be running before any ends

    def work(device: str, mine: Sequence[int]) -> list[str]:
        started.wait()
        return [threading.current_thread().name for _ in mine]

    threads = spread(["a", "b", "c"], [1, 2, 3, 4, 5, 6], work)
    assert len(set(threads)) == 3 and threading.current_thread().name not in threads
    alone = spread(["a"], [1, 2], lambda device, mine: [threading.current_thread().name] * 2)
    assert alone == [threading.current_thread().name] * 2  # one device: no thread


def test_a_failing_device_lets_the_others_finish_before_its_error_is_raised():
    finished: list[str] = []

    def work(device: str, mine: Sequence[int]) -> list[int]:
        if device == "lost":
            raise OSError("device lost")
        time.sleep(0.2)
        finished.append(device)
        return list(mine)

    with pytest.raises(OSError, match="device lost"):
        spread(["lost", "slow"], [1, 2, 3, 4], work)
    assert finished == ["slow"]
    with pytest.raises(ValueError, match="no device"):
        spread([], [1], work)


def test_a_feed_keeps_devices_busy_stops_moot_items_and_starts_none_the_record_settles():
    rounds: dict[int, int] = {}
    queue = [1, 2, 3, 4, 5]
    answers: list[tuple[str, int, str | None]] = []

    def work(device: str, item: int, stopped) -> str | None:
        if item == 1:
            return "from the record"
        for n in range(50):  # rounds: 2 answers after 2, the others would take 50
            if stopped():
                return None
            rounds[item] = n + 1
            if item == 2 and n == 1:
                return "quick"
            time.sleep(0.01)
        return "slow"

    def moot(item: int, earlier) -> bool:  # 2's answer makes 4 moot
        return item == 4 and ("a", 2, "quick") in answers

    feed(
        ["a", "b", "c"],
        lambda device, busy: queue.pop(0) if queue else None,
        work,
        lambda device, item, result: answers.append((device, item, result)),
        moot,
    )
    # a's first item is settled by the record, so a takes the next at once; freed by 2's quick
    # answer, a takes 5 while b still measures 3; c's 4 is stopped once 2 made it moot
    assert answers[:2] == [("a", 1, "from the record"), ("a", 2, "quick")]
    assert set(answers[2:]) == {("c", 4, None), ("b", 3, "slow"), ("a", 5, "slow")}
    assert 1 not in rounds and rounds[3] == rounds[5] == 50 and rounds[4] < 50


def test_a_feeds_error_stops_the_other_devices_and_waits_for_them():
    finished: list[str] = []

    def work(device: str, item: int, stopped) -> int | None:
        if stopped() and item > 0:  # the record: nothing
            return None
        if device == "lost":
            time.sleep(0.05)
            raise OSError("device lost")
        while not stopped():
            time.sleep(0.01)
        finished.append(device)
        return None

    def never_moot(item: int, earlier) -> bool:  # only the error stops the slow device
        return False

    items = iter([1, 2])
    with pytest.raises(OSError, match="device lost"):
        feed(["lost", "slow"], lambda device, busy: next(items, None), work, print, never_moot)
    assert finished == ["slow"]
    with pytest.raises(ValueError, match="no device"):
        feed([], lambda device, busy: None, work, print, never_moot)
