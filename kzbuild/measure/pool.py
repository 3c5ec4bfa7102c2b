"""Independent comparisons spread over the devices of a pool, each whole on one device.

``ab`` (a plan run: every variant interleaved) and ``bench --plan`` (a plan run) hand their
comparisons to :func:`spread`. The comparisons are dealt to the devices in turn (the first to the
first device, ...), the same way every time, so a comparison that continues (``ab``'s next batch
of blocks) goes back to the device that began it and a result never mixes devices. Each device
works through its share in order, in a thread of its own; the devices work at once.

:func:`feed` is for a search (``bisect``'s commits between the range's ends): each free device
is handed the most useful comparison given those in flight, and a comparison in flight that
became moot stops after the block it is measuring, so no device waits for another or keeps
measuring a commit the search no longer needs. :class:`Ahead` makes, meanwhile, what the devices
may need next (the search's builds), one at a time in a thread of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from itertools import takewhile
from typing import Generic, TypeVar

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


def feed(
    devices: Sequence[D],
    pick: Callable[[D, Sequence[T]], T | None],
    work: Callable[[D, T, Callable[[], bool]], R | None],
    answer: Callable[[D, T, R | None], None],
    moot: Callable[[T, Sequence[T]], bool],
    stopping: threading.Event | None = None,
) -> None:
    """Keep every device busy until there is nothing left to pick. A free device (in the order
    given) is handed ``pick(device, the items in flight)`` (None: nothing for it now). Its item is
    first worked with ``stopped()`` always true, here: what the record settles is answered with
    nothing measured. Else the device works on it in a thread of its own: ``work(device, item,
    stopped)`` asks ``stopped()`` before each new measurement and gives None when it is told to
    stop, which it is when ``moot(item, the items in flight started before it)``, asked then in
    the device's thread. Each result is handed to ``answer`` here, as it comes. On an error
    (Ctrl-C) ``stopping`` is set at once (what works beside the devices stops), every item is told
    to stop, every device finishes its measurement, and the error is raised."""
    if not devices:
        raise ValueError("no device to spread over")
    busy: dict[Future[R | None], tuple[D, T, threading.Event]] = {}
    guard = threading.Lock()  # the devices' threads read busy while this one changes it

    def before(item: T) -> list[T]:
        with guard:
            return list(
                takewhile(lambda other: other is not item, (i for _, i, _ in busy.values()))
            )

    def stopper(item: T, stop: threading.Event) -> Callable[[], bool]:
        return lambda: stop.is_set() or moot(item, before(item))

    with ThreadPoolExecutor(max_workers=len(devices), thread_name_prefix="kz-pool") as pool:
        try:
            while True:
                for device in devices:
                    while all(device is not held for held, _, _ in busy.values()):
                        item = pick(device, [item for _, item, _ in busy.values()])
                        if item is None:
                            break
                        known = work(device, item, lambda: True)
                        if known is not None:
                            answer(device, item, known)
                            continue
                        stop = threading.Event()
                        with guard:
                            future = pool.submit(work, device, item, stopper(item, stop))
                            busy[future] = (device, item, stop)
                if not busy:
                    return
                done, _ = wait(busy, return_when=FIRST_COMPLETED)
                for future in [f for f in busy if f in done]:  # in the order they were started
                    with guard:
                        device, item, _ = busy.pop(future)
                    answer(device, item, future.result())
        except BaseException:
            if stopping is not None:
                stopping.set()
            for _, _, stop in busy.values():
                stop.set()
            raise


class Ahead(Generic[T]):
    """A worker in a thread of its own that makes, one at a time, the first of ``wanted()`` (what
    the devices may need next, likeliest first; made items drop out of it), and asks again after
    each one and whenever told that the search ``moved``. ``make(item, stopping)`` handles its
    own failures (``stopping`` is set when the worker is told to stop). As a context manager it
    runs while the block runs; leaving, it stops and waits for the item being made, then raises
    what ``wanted`` or ``make`` raised, if anything (and the block raised nothing)."""

    def __init__(
        self,
        wanted: Callable[[], Sequence[T]],
        make: Callable[[T, threading.Event], None],
    ) -> None:
        self._wanted, self._make = wanted, make
        self._changed = threading.Condition()
        self._moves = 0
        self._error: BaseException | None = None
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kz-ahead", daemon=True)

    def __enter__(self) -> Ahead[T]:
        self._thread.start()
        return self

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        self.stopping.set()
        self.moved()
        self._thread.join()
        if self._error is not None and error is None:
            raise self._error

    def moved(self) -> None:
        """What is wanted may have changed: ask again."""
        with self._changed:
            self._moves += 1
            self._changed.notify_all()

    def _run(self) -> None:
        try:
            while not self.stopping.is_set():
                with self._changed:
                    seen = self._moves
                wanted = self._wanted()
                if wanted:
                    self._make(wanted[0], self.stopping)
                    continue
                with self._changed:
                    while not self.stopping.is_set() and self._moves == seen:
                        self._changed.wait()
        except BaseException as exc:  # handed to the search when it leaves
            self._error = exc
