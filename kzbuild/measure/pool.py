"""Independent comparisons spread over the devices of a pool, each whole on one device.

``bisect`` (a commit between the range's ends), ``ab`` (a plan run: every variant interleaved)
and ``bench --plan`` (a plan run) hand their comparisons to :func:`spread`. The comparisons are
dealt to the devices in turn (the first to the first device, ...), the same way every time, so a
comparison that continues (``ab``'s next batch of blocks, a resumed bisect) goes back to the
device that began it and a result never mixes devices. Each device works through its share in
order, in a thread of its own; the devices work at once.
"""

from __future__ import annotations

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
