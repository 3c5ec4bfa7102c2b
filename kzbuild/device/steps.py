"""Several device scripts in one round trip.

Every device command costs a round trip (a new ssh channel, or an ``adb shell``, and a shell on
the device), so deploy runs the scripts that follow each other without a decision in between
as one command: :data:`SEQUENCE_SCRIPT` runs each step's script in a subshell with the step's
arguments as ``"$@"`` (a fork, no new shell to start), one after the other, ends each step's stdout
and stderr with a marker line that carries its exit code, and stops
after the first step that fails. The scripts stay constant strings and every argument stays a
positional argument quoted by :func:`~kzbuild.device.base.remote_command`: the sequence only
``eval``s references like ``"${3}"``, never data.

The marker holds a random token made for each call, so a step's output cannot pass for one. A
sequence cut short (the device's shell killed, the connection lost) is an error, never a short
success: the transport reports a lost connection, and a sequence that ended without the marker
of a step that should have run raises DeviceError.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from kzbuild.device.base import ByteSource, RemoteResult, Transport
from kzbuild.errors import DeviceError

MARK = "--kz-step-"
# $1 = the marker; then per step: its script, the count of its arguments, the arguments. Each step
# runs in a subshell with its own arguments as "$@" (and only the kz_* variables of the sequence
# itself set). After each step, "\n<marker> <exit code>" goes to stdout and to stderr; the first
# step that fails ends it all. echo, not printf: printf is no mksh builtin (a process per call on
# the adb test device), and the marker and code hold no backslash and no leading "-n".
SEQUENCE_SCRIPT = (
    'kz_m=$1; shift; while [ "$#" -gt 0 ]; do kz_s=$1 kz_n=$2; shift 2; kz_a=; kz_i=1; '
    'while [ "$kz_i" -le "$kz_n" ]; do kz_a="$kz_a \\"\\${$kz_i}\\""; kz_i=$((kz_i + 1)); done; '
    'eval "(set -- $kz_a; eval \\"\\$kz_s\\")"; kz_rc=$?; shift "$kz_n"; '
    'echo; echo "$kz_m $kz_rc"; { echo; echo "$kz_m $kz_rc"; } >&2; '
    '[ "$kz_rc" = 0 ] || exit "$kz_rc"; done'
)


@dataclass(frozen=True)
class Step:
    """One constant sh script and its positional arguments; ``what`` names it in errors."""

    script: str
    args: tuple[str, ...]
    what: str

    @property
    def argv(self) -> list[str]:
        return ["sh", "-c", self.script, "kz", *self.args]


def run_steps(
    transport: Transport,
    steps: Sequence[Step],
    *,
    data: ByteSource | None = None,
    timeout: float | None = None,
) -> list[RemoteResult]:
    """Run ``steps`` in order as one device command, ``data`` (if any) as the stdin they share.

    Returns one result per step that ran: all of them, or up to the first that failed (the last
    one).
    """
    if not steps:
        raise ValueError("no steps")
    if len(steps) == 1:
        argv = steps[0].argv
        return [
            transport.run(argv, timeout=timeout)
            if data is None
            else transport.run_input(argv, data, timeout=timeout)
        ]
    marker = MARK + secrets.token_hex(8)
    argv = ["sh", "-c", SEQUENCE_SCRIPT, "kz", marker]
    for step in steps:
        argv += [step.script, str(len(step.args)), *step.args]
    result = (
        transport.run(argv, timeout=timeout)
        if data is None
        else transport.run_input(argv, data, timeout=timeout)
    )
    mark = f"\n{marker} ".encode()
    outs, codes = _frames(result.stdout, mark)
    errs, _ = _frames(result.stderr, mark)
    results: list[RemoteResult] = []
    for index, code in enumerate(codes[: len(steps)]):
        results.append(
            RemoteResult(int(code) if code.isdigit() else 1, outs[index], _at(errs, index))
        )
        if not results[-1].ok:
            return results
    if len(results) == len(steps):
        return results
    cut = len(results)  # the step that was running when the sequence ended
    if result.returncode != 0:
        return [*results, RemoteResult(result.returncode, outs[cut], _at(errs, cut))]
    raise DeviceError(
        f"{transport.address}: the device's shell ended, exit 0, before {steps[cut].what} finished"
    )


def _frames(data: bytes, mark: bytes) -> tuple[list[bytes], list[str]]:
    """Each step's output, then what came after the last marker; and the exit code each marker
    gave."""
    pieces = data.split(mark)
    bodies, codes = [pieces[0]], []
    for piece in pieces[1:]:
        code, _, body = piece.partition(b"\n")
        codes.append(code.decode(errors="replace"))
        bodies.append(body)
    return bodies, codes


def _at(items: list[bytes], index: int) -> bytes:
    return items[index] if index < len(items) else b""
