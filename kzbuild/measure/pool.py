"""Independent comparisons spread over the devices of a pool, each whole on one device.

``bisect`` (a commit between the range's ends), ``ab`` (a plan run: every variant interleaved)
and ``bench --plan`` (a plan run) hand their comparisons to :func:`spread`. The comparisons are
dealt to the devices in turn (the first to the first device, ...), the same way every time, so a
comparison that continues (``ab``'s next batch of blocks, a resumed bisect) goes back to the
device that began it and a result never mixes devices. Each device works through its share in
order, in a thread of its own; the devices work at once.

:func:`race` is for comparisons of which only some may matter (``bisect``'s commits between the
range's ends, one per device): the first answer that makes another comparison moot stops that one
at its next round, so no device keeps measuring a commit the search no longer needs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

D = TypeVar("D")
T = TypeVar("T")
R = TypeVar("R")


def deal(devices: Sequence[D], items: Sequence[T]) -> list[tuple[D, list[T]]]:
    """Each device with its share of the items, dealt in turn; devices with none are left out."""
    if not devices:
        raise ValueError("no device to spread over")
    shares = [(device, list(items[n :: len(devices)])) for n, device in enumerate(devices)]
    return [(device, share) for device, share in shares if share]


def spread(
    devices: Sequence[D],
    items: Sequence[T],
    work: Callable[[D, Sequence[T]], Sequence[R]],
) -> list[R]:
    """``work(device, its items)`` for each device's share (a thread per device when more than
    one has a share); the results in the order of ``items``. Every device finishes its share
    before the first error, if any, is raised."""
    shares = deal(devices, items)
    if len(shares) == 1:
        ((device, share),) = shares
        done = [list(work(device, share))]
    else:
        with ThreadPoolExecutor(max_workers=len(shares), thread_name_prefix="kz-pool") as pool:
            futures = [pool.submit(work, device, share) for device, share in shares]
            done = [list(future.result()) for future in futures]
    # device n's k-th result is item n + k * len(devices)
    ordered: list[R] = []
    for k in range(max(len(results) for results in done)):
        ordered += [results[k] for results in done if k < len(results)]
    return ordered


def race(
    devices: Sequence[D],
    items: Sequence[T],
    work: Callable[[D, T, Callable[[], bool]], R | None],
    moot: Callable[[T, R, T], bool],
) -> list[R | None]:
    """One item per device (the first item on the first device, ...), all at once, a thread each.
    ``work(device, item, stopped)`` asks ``stopped()`` before each new measurement and gives None
    when it is told to stop. When an item's result makes another item moot (``moot(item, result,
    other)``), the other is told to stop. First, one after the other, each item's work is asked
    for what it can give with nothing new measured (``stopped()`` always true: a resumed search
    replays its record), so the items moot by the record alone are never started. The results in
    the order of ``items`` (None: stopped). Every device finishes before the first error, if any,
    is raised."""
    if len(items) > len(devices):
        raise ValueError(f"{len(items)} comparisons for {len(devices)} devices")
    stops = [threading.Event() for _ in items]

    def answered(n: int, result: R | None) -> R | None:
        if result is not None:
            for m, other in enumerate(items):
                if m != n and moot(items[n], result, other):
                    stops[m].set()
        return result

    known = [answered(n, work(devices[n], item, lambda: True)) for n, item in enumerate(items)]
    live = [n for n, result in enumerate(known) if result is None and not stops[n].is_set()]

    def run(n: int) -> R | None:
        return answered(n, work(devices[n], items[n], stops[n].is_set))

    if len(live) == 1:
        known[live[0]] = run(live[0])
    elif live:
        with ThreadPoolExecutor(max_workers=len(live), thread_name_prefix="kz-pool") as pool:
            futures = {n: pool.submit(run, n) for n in live}
            for n, future in futures.items():
                known[n] = future.result()
    return known
