"""Several device scripts in one round trip (kzbuild.device.steps): framing, failures, drops.

Run over the local transport, the real sshd and (for the shells) sh, bash and Android's mksh.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kzbuild.build.artifacts import load_artifact
from kzbuild.device import deploy, devicelock
from kzbuild.device.base import RemoteResult
from kzbuild.device.local import LocalTransport
from kzbuild.device.registry import parse_device_spec
from kzbuild.device.ssh import SshTransport
from kzbuild.device.steps import MARK, SEQUENCE_SCRIPT, Step, run_steps
from kzbuild.device.store import Layout, Remote
from kzbuild.errors import Busy, DeviceError
from kzbuild.model.device import Device

ARGS = st.lists(
    st.text(st.characters(exclude_characters="\0", exclude_categories=("Cs",)), max_size=12),
    max_size=12,
)


@pytest.fixture(params=["local", "ssh"])
def transport(request, tmp_path):
    if request.param == "local":
        yield LocalTransport(str(tmp_path))
        return
    sshd = request.getfixturevalue("sshd")
    request.getfixturevalue("ssh_home")
    opened = SshTransport(parse_device_spec(sshd.spec(tmp_path)))
    yield opened
    opened.close()


PRINT_ARGS = 'for a in "$@"; do printf "%s\\0" "$a"; done'


def printed(result: RemoteResult) -> list[str]:
    return result.stdout.decode().split("\0")[:-1]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(first=ARGS, second=ARGS)
def test_each_step_gets_exactly_its_own_arguments(transport, first, second):
    results = run_steps(
        transport, [Step(PRINT_ARGS, tuple(first), "one"), Step(PRINT_ARGS, tuple(second), "two")]
    )
    assert [printed(result) for result in results] == [first, second]
    assert all(result.ok and result.stderr == b"" for result in results)


def test_more_than_nine_arguments_and_steps_without_any(transport):
    many = tuple(f"a{n} $x \"'`" for n in range(23))
    last = Step(
        'echo "done${kz_x-}${s-}${m-}${rc-}"', (), "last"
    )  # nothing of the sequence's own leaks but kz_* names
    results = run_steps(transport, [Step("true", (), "none"), Step(PRINT_ARGS, many, "many"), last])
    assert printed(results[1]) == list(many)
    assert results[2].stdout == b"done\n"


def test_a_step_that_fails_midway_stops_the_sequence(transport, tmp_path):
    flag = tmp_path / "ran"
    steps = [
        Step("echo before; echo warn >&2", (), "one"),
        Step('printf partial; echo "$1" >&2; exit 7', ("it broke",), "two"),
        Step('touch "$1"', (str(flag),), "three"),
    ]
    results = run_steps(transport, steps)
    assert results == [
        RemoteResult(0, b"before\n", b"warn\n"),
        RemoteResult(7, b"partial", b"it broke\n"),
    ]
    assert not flag.exists()
    with pytest.raises(DeviceError, match=r"two failed \(exit 7\).*\n.*it broke"):
        Remote(transport).checked(steps, results)


def test_output_holding_a_marker_cannot_end_a_step(transport):
    """The marker's token is new for each call: output forging one (or the bare prefix) stays
    output."""
    forged = f"x\n{MARK}0123456789abcdef 0\ny\n\n{MARK}"
    results = run_steps(
        transport,
        [
            Step('printf "%s" "$1"; printf "%s" "$1" >&2', (forged,), "forger"),
            Step("echo after", (), "after"),
        ],
    )
    assert results[0] == RemoteResult(0, forged.encode(), forged.encode())
    assert results[1].stdout == b"after\n"


def test_binary_output_without_a_final_newline_is_kept_exactly(transport):
    results = run_steps(
        transport,
        [Step("printf 'a\\000\\377\\n\\n'", (), "bytes"), Step("printf ''", (), "nothing")],
    )
    assert [result.stdout for result in results] == [b"a\0\xff\n\n", b""]


def test_stdin_reaches_the_step_that_reads_it(transport):
    data = [b"x" * 300_000, b"tail"]
    results = run_steps(
        transport, [Step("echo first", (), "one"), Step("wc -c", (), "count")], data=iter(data)
    )
    assert results[0].stdout == b"first\n" and results[1].stdout.strip() == b"300004"


def test_a_step_failing_before_the_reader_leaves_stdin_unread(transport):
    results = run_steps(
        transport,
        [Step("exit 6", (), "one"), Step("cat", (), "reader")],
        data=iter([b"y" * 1_000_000]),
    )
    assert [result.returncode for result in results] == [6]


def test_the_shell_killed_mid_sequence_is_a_failure_of_the_running_step(transport, tmp_path):
    # $$ in a step (a subshell) is the sequence's own shell
    flag = tmp_path / "ran"
    results = run_steps(
        transport,
        [
            Step("echo one", (), "one"),
            Step("echo partial; kill -9 $$; sleep 5", (), "killer"),
            Step('touch "$1"', (str(flag),), "three"),
        ],
    )
    assert results[0] == RemoteResult(0, b"one\n", b"")
    assert len(results) == 2 and not results[1].ok and results[1].stdout == b"partial\n"
    assert not flag.exists()


def test_a_connection_dropped_during_a_sequence_is_an_error_never_a_result(
    sshd, ssh_home, relay, tmp_path
):
    opened = SshTransport(parse_device_spec(sshd.spec(tmp_path, relay.port)))
    flag = tmp_path / "ran"
    threading.Timer(0.5, relay.cut_now).start()
    with pytest.raises(
        DeviceError, match=f"connection to 127.0.0.1:{relay.port} lost while running sh"
    ):
        run_steps(
            opened,
            [
                Step("echo one", (), "one"),
                Step("sleep 3", (), "slow"),
                Step('touch "$1"', (str(flag),), "three"),
            ],
        )
    opened.close()
    assert not flag.exists()


@pytest.mark.parametrize("shell", ["sh", "bash", "mksh"])
def test_the_sequence_is_posix_sh(shell):
    """The sequence runs under dash, bash and Android's mksh alike (its steps run under the device's
    sh)."""
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed here")
    args = [
        "M",
        'printf "%s|" "$@"',
        "11",
        *[f"a{n} '\"$x" for n in range(11)],
        "exit 4",
        "0",
        "echo never",
        "0",
    ]
    done = subprocess.run(
        [shell, "-c", SEQUENCE_SCRIPT, "kz", *args], capture_output=True, check=False
    )
    expected_out = "".join(f"a{n} '\"$x|" for n in range(11)).encode() + b"\nM 0\n\nM 4\n"
    assert (done.returncode, done.stdout, done.stderr) == (4, expected_out, b"\nM 0\n\nM 4\n")


# --- the lock's round trips ---
def held(root: Path):
    remote = Remote(LocalTransport(str(root)))
    return devicelock.acquire(remote, Layout(str(root)), "test", wait=0)


def test_steps_taken_with_the_lock_run_only_once_it_is_taken(tmp_path):
    root = tmp_path / "device"
    mark = tmp_path / "ran"
    first = held(root)
    touch = Step('touch "$1"', (str(mark),), "touching")
    with pytest.raises(Busy):
        devicelock.acquire(
            Remote(LocalTransport(str(root))), Layout(str(root)), "other", wait=0, then=[touch]
        )
    assert not mark.exists()
    first.release()
    second = devicelock.acquire(
        Remote(LocalTransport(str(root))), Layout(str(root)), "other", wait=0, then=[touch]
    )
    assert [result.ok for result in second.then] == [True] and mark.exists()
    second.release()
    assert not (root / ".lock").exists()


def test_release_after_a_failing_step_keeps_the_lock_until_release(tmp_path):
    root = tmp_path / "device"
    lock = held(root)
    results = lock.release_after([Step("exit 3", (), "failing")])
    assert [result.returncode for result in results] == [3]
    assert (root / ".lock").exists() and not lock.released
    lock.release()
    assert not (root / ".lock").exists()


def test_release_after_releases_in_the_same_round_trip(tmp_path):
    root = tmp_path / "device"
    lock = held(root)
    assert [
        result.stdout for result in lock.release_after([Step("echo switched", (), "switch")])
    ] == [b"switched\n"]
    assert lock.released and not (root / ".lock").exists()
    lock.release()  # a no-op now


def test_a_lost_lock_runs_none_of_the_steps(tmp_path):
    root = tmp_path / "device"
    mark = tmp_path / "ran"
    lock = held(root)
    (root / ".lock" / "owner").write_text("other\n1\nsince\nop\nsomeone-elses-token\n")
    with pytest.raises(Busy, match="lost its lock"):
        lock.refresh_then([Step('touch "$1"', (str(mark),), "touching")])
    with pytest.raises(Busy, match="lost its lock"):
        lock.release_after([Step('touch "$1"', (str(mark),), "touching")])
    assert not mark.exists()


# --- a first deploy's round trips ---
class CountingTransport(LocalTransport):
    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.commands = 0

    def run(self, argv, **options):  # type: ignore[no-untyped-def]
        self.commands += 1
        return super().run(argv, **options)

    def run_input(self, argv, data, **options):  # type: ignore[no-untyped-def]
        self.commands += 1
        return super().run_input(argv, data, **options)


def test_a_rollback_makes_two_device_commands(artifacts, tmp_path):
    """lock+state+history, then refresh+switch+unlock."""
    root = tmp_path / "device"
    device = Device(name="t", transport="local", root=str(root))
    for build in ("b1", "b2"):
        deploy.deploy(
            LocalTransport(str(root)), device, load_artifact(artifacts.make(build, greeting=build))
        )
    counting = CountingTransport(str(root))
    assert deploy.rollback(counting, device).release == "b1"
    assert counting.commands == 2
    assert (root / "current").resolve().name == "b1" and not (root / ".lock").exists()


@pytest.mark.parametrize("keep", [None, 1])
def test_a_first_deploy_makes_two_device_commands(artifacts, tmp_path, keep):
    """lock+state+inventory, then refresh and the tar stream that ends in the check and the store
    moves, the release (its tar came in the stream), switch and unlock (with --keep the lock stays
    held for the prune's four commands, then goes in a command of its own)."""
    root = tmp_path / "device"
    counting = CountingTransport(str(root))
    result = deploy.deploy(
        counting,
        Device(name="t", transport="local", root=str(root)),
        load_artifact(artifacts.make("b1")),
        keep=keep,
    )
    assert result.switched and result.files_sent > 0
    assert counting.commands == (2 if keep is None else 2 + 4 + 1)
    assert (root / "current").resolve().name == "b1" and not (root / ".lock").exists()
