"""measure/pool.py: comparisons dealt to devices in turn, each device's share on its own thread,
results in the items' order; a device's error waits for the others' shares; a race
stops the comparisons an answer made moot."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kzbuild.measure.pool import deal, race, spread


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


def test_a_race_stops_the_comparisons_an_answer_made_moot_and_skips_those_the_record_settles():
    rounds: dict[str, int] = {}
    recorded = {"a": None, "b": None, "c": None}

    def work(device: str, item: int, stopped) -> int | None:
        if recorded[device] is not None:
            return recorded[device]
        for n in range(200):  # rounds: "a" answers after 2, the others would take 200
            if stopped():
                return None
            rounds[device] = n + 1
            if device == "a" and n == 1:
                return item
            time.sleep(0.01)
        return item

    done = race(["a", "b", "c"], [1, 2, 3], work, lambda item, result, other: other > item + 1)
    assert done[:2] == [1, 2] and done[2] is None  # only 3 was moot after a's answer
    assert rounds["a"] == 2 and rounds["c"] < 200 and rounds["b"] == 200
    rounds.clear()
    recorded["a"] = 1  # a resumed race: a's answer is in the record, so c never starts
    done = race(["a", "b", "c"], [1, 2, 3], work, lambda item, result, other: other > item + 1)
    assert done == [1, 2, None] and "c" not in rounds and "a" not in rounds
    with pytest.raises(ValueError, match="3 comparisons for 2 devices"):
        race(["a", "b"], [1, 2, 3], work, lambda item, result, other: False)
