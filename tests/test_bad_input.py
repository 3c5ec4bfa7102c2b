"""Generated bad input: damaged config files, device specs and option values never make a traceback.

Each case writes one damaged file into a copy of this repo's recipes/, patches/ and toolchains/
(random bytes, invalid UTF-8, alias loops and bombs, mutations of the real files: keys dropped,
renamed to numbers or retyped), or passes a bad device spec or option value, runs ``main()``
in process and checks that the exit code is one README documents and that the output holds
no traceback and no "internal error". Devices are never contacted: ``connect`` is replaced by
one that fails with a DeviceError, so a spec that parses exits 8 and one that does not exits 2.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kzbuild.cli import main
from kzbuild.errors import DeviceError

REPO = Path(__file__).resolve().parent.parent
DOCUMENTED_FAILURES = set(range(2, 14))  # README: 2..13


def runs(examples: int) -> settings:
    """``examples`` generated cases; fixtures are reset by hand in each (see ``damaged``)."""
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


DEMO_HOST = (REPO / "recipes/demo-host.yaml").read_bytes()
ALIAS_LOOP = "loop: &a [*a]\n"
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 10)}]\n"
    for prev, name in zip("abcdefghi", "bcdefghij", strict=True)
)
INVALID_UTF8 = st.sampled_from(
    [b"\xff", b"\xfe\xff", b"\xc3", b"\xed\xa0\x80", b"\x80abc", b"\xf8\x88\x80\x80\x80"]
)
ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.just(10**30),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(
        ["", "\0", "a\0b", "x" * 300, "../../..", "/", "-x", "%ff", "{root", "{nope}", "\x1b[31m"]
    ),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


@dataclass(frozen=True)
class Damage:
    data: bytes
    surely_bad: bool  # no reading of it can be valid: exit 0 would be a silent success


@dataclass
class Outcome:
    code: int
    output: str


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    for folder in ("recipes", "patches", "toolchains", "kernels", "plans"):
        shutil.copytree(REPO / folder, root / folder)
    return root


@pytest.fixture
def kz(
    project: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[..., Outcome]:
    def no_device(device, **options):  # type: ignore[no-untyped-def]
        raise DeviceError(f"{device.address}: not contacted in this test")

    monkeypatch.setattr(
        "kzbuild.cli.connect.connect", no_device
    )  # every command opens devices there

    def run(*args: str) -> Outcome:
        capsys.readouterr()
        code = main(
            [
                "--project",
                str(project),
                "--cache-dir",
                str(tmp_path / "cache"),
                "--work-dir",
                str(tmp_path / "work"),
                *args,
            ]
        )
        captured = capsys.readouterr()
        return Outcome(code, captured.out + captured.err)

    return run


@pytest.fixture
def damaged(project: Path) -> Callable[[str, bytes], Iterator[None]]:
    """Write ``data`` to a project file for one example, then put the original back."""
    from contextlib import contextmanager

    @contextmanager
    def write(relpath: str, data: bytes) -> Iterator[None]:
        path = project / relpath
        original = path.read_bytes() if path.exists() else None
        path.write_bytes(data)
        try:
            yield
        finally:
            if original is None:
                path.unlink()
            else:
                path.write_bytes(original)

    return write


def unwrapped(output: str) -> str:
    """Terminal output with rich's wrapping undone; it breaks long paths mid-word, so wrapped lines
    join without a space."""
    return "".join(
        line.strip() if line.startswith(" ") else line for line in output.splitlines()
    ).replace("\n", "")


def check(
    outcome: Outcome, damage: Damage | None = None, *, expect: set[int] | None = None
) -> None:
    assert "Traceback" not in outcome.output and "internal error" not in outcome.output, (
        outcome.output
    )
    allowed = expect or (
        DOCUMENTED_FAILURES if damage is None or damage.surely_bad else DOCUMENTED_FAILURES | {0}
    )
    assert outcome.code in allowed, (outcome.code, outcome.output)


# --- strategies: damaged files ---


def _paths(node: object, prefix: tuple[object, ...] = ()) -> Iterator[tuple[object, ...]]:
    yield prefix
    children = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else ()
    )
    for key, child in children:
        yield from _paths(child, (*prefix, key))


@st.composite
def tree_mutations(draw: st.DrawFn, original: bytes) -> Damage:
    """The real YAML file with one key dropped, renamed to a number, or its value retyped."""
    doc = yaml.safe_load(original)
    path = draw(st.sampled_from([p for p in _paths(doc) if p]))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    action = draw(
        st.sampled_from(
            ["drop", "retype", "number-key"] if isinstance(parent, dict) else ["drop", "retype"]
        )
    )
    if action == "drop":
        del parent[last]
    elif action == "retype":
        parent[last] = draw(ODD_VALUES)
    else:
        parent[draw(st.integers())] = parent.pop(last)
    return Damage(
        yaml.safe_dump(doc, sort_keys=False, allow_unicode=True).encode(), surely_bad=False
    )


@st.composite
def text_mutations(draw: st.DrawFn, original: bytes, yaml_file: bool) -> Damage:
    """The real file with bytes inserted, lines dropped or repeated, tabs, a cut, or (YAML) an alias
    loop or bomb."""
    lines = original.split(b"\n")
    index = draw(st.integers(0, len(lines) - 1))
    actions = ["invalid-utf8", "control", "drop-line", "repeat-line", "tab", "cut"] + (
        ["alias-loop", "alias-bomb"] if yaml_file else []
    )
    action = draw(st.sampled_from(actions))
    if action == "invalid-utf8":
        offset = draw(st.integers(0, len(original)))
        return Damage(original[:offset] + draw(INVALID_UTF8) + original[offset:], surely_bad=True)
    if action == "control":
        lines[index] += draw(st.sampled_from([b"\x00", b"\x07", b"\x1b[31m", b"\x7f"]))
    elif action == "drop-line":
        del lines[index]
    elif action == "repeat-line":
        lines.insert(index, lines[index])
    elif action == "tab":
        lines[index] = b"\t" + lines[index]
    elif action == "cut":
        return Damage(original[: draw(st.integers(0, len(original)))], surely_bad=False)
    else:
        return Damage(
            original + (ALIAS_LOOP if action == "alias-loop" else ALIAS_BOMB).encode(),
            surely_bad=True,
        )
    return Damage(b"\n".join(lines), surely_bad=False)


def noise() -> st.SearchStrategy[Damage]:
    """Random bytes, or random text (any characters, surrogates written as they come)."""
    return st.one_of(
        st.binary(max_size=300).map(lambda data: Damage(data, surely_bad=False)),
        st.text(max_size=200).map(
            lambda text: Damage(text.encode("utf-8", "surrogatepass"), surely_bad=False)
        ),
    )


def damage_of(relpath: str, *, yaml_file: bool = True) -> st.SearchStrategy[Damage]:
    original = (REPO / relpath).read_bytes()
    kinds = [text_mutations(original, yaml_file), noise()]
    if yaml_file:
        kinds.append(tree_mutations(original))
    return st.one_of(*kinds)


# --- config files ---


@runs(50)
@given(damage=damage_of("recipes/demo-host.yaml"))
def test_damaged_recipe(kz, damaged, damage):
    with damaged("recipes/demo-host.yaml", damage.data):
        check(kz("recipes"), damage)
        check(kz("status", "demo-host"), damage)


@runs(50)
@given(damage=damage_of("plans/gdn-prefill-pad3.yaml"))
def test_damaged_plan(kz, damaged, project, damage):
    with damaged("plans/gdn-prefill-pad3.yaml", damage.data):
        check(kz("bench", "--plan", str(project / "plans/gdn-prefill-pad3.yaml")), damage)
        check(
            kz(
                "ab",
                "demo-host",
                "--plan",
                str(project / "plans/gdn-prefill-pad3.yaml"),
                "--device",
                "local:/nowhere",
            ),
            damage,
        )


@runs(40)
@given(damage=damage_of("recipes/devices.yaml"))
def test_damaged_devices_file(kz, damaged, damage):
    with damaged("recipes/devices.yaml", damage.data):
        check(kz("deploy", "--artifact", "x", "--device", "pad3"), damage)


@runs(35)
@given(
    name=st.sampled_from(sorted(p.name for p in (REPO / "toolchains").glob("*.yaml"))),
    data=st.data(),
)
def test_damaged_toolchain(kz, damaged, name, data):
    damage = data.draw(damage_of(f"toolchains/{name}"))
    with damaged(f"toolchains/{name}", damage.data):
        check(kz("doctor", "demo-host"), damage)


@runs(35)
@given(
    damage=st.one_of(
        damage_of("patches/series", yaml_file=False),
        st.lists(st.text(min_size=1, max_size=300), min_size=1, max_size=4).map(
            lambda names: Damage(
                "\n".join(names).encode("utf-8", "surrogatepass"), surely_bad=False
            )
        ),
    )
)
def test_damaged_series(kz, damaged, damage):
    with damaged("patches/series", damage.data):
        check(kz("patches", "list"), damage)
        check(kz("status", "demo-host"), damage)


@runs(35)
@given(
    damage=damage_of("patches/common-fit-counts-CPU_REPACK-as-host-memory.patch", yaml_file=False)
)
def test_damaged_patch(kz, damaged, damage):
    with damaged("patches/common-fit-counts-CPU_REPACK-as-host-memory.patch", damage.data):
        check(
            kz("patches", "list"), damage, expect=DOCUMENTED_FAILURES | {0}
        )  # list shows lint status, it does not fail
        check(kz("patches", "lint"), damage)


DROPPED_LOG = (
    b"dropped:\n  - patch: a.patch\n    subject: 'x: y'\n"
    b"    date: '2026-05-01'\n    reason: upstreamed\n"
)


@runs(25)
@given(
    damage=st.one_of(
        text_mutations(DROPPED_LOG, yaml_file=True), tree_mutations(DROPPED_LOG), noise()
    )
)
def test_damaged_dropped_log(kz, damaged, damage):
    patch = "patches/common-fit-counts-CPU_REPACK-as-host-memory.patch"
    # the series and the patch are written as they are, so that a drop that succeeds is undone too
    with (
        damaged("patches/series", (REPO / "patches/series").read_bytes()),
        damaged(patch, (REPO / patch).read_bytes()),
    ):
        with damaged("patches/DROPPED.yaml", damage.data):
            check(
                kz("patches", "lint"), damage
            )  # a damaged log is a lint problem (5); a good one leaves lint clean
            check(
                kz("patches", "drop", Path(patch).name, "--reason", "x"),
                damage,
                expect=DOCUMENTED_FAILURES | {0},
            )


# --- device specs and option values ---

HOSTS = st.one_of(
    st.sampled_from(
        [
            "h",
            "127.0.0.1",
            "[::1]",
            "[::1",
            "[zz]",
            "",
            "h%20x",
            "h%zz",
            "a b",
            "é.example",
            "-h",
            "[1:2:3::]",
        ]
    ),
    st.text(max_size=15),
)
PORTS = st.one_of(
    st.integers(-100_000, 100_000).map(str),
    st.sampled_from(["", "abc", "0x16", "٣", " 22", "22 "]),
    st.text(max_size=5),
)
ROOTS = st.one_of(
    st.sampled_from(["", "/", "/x", "/a%00b", "/%ff%fe", "/a%20b", "/x?y#z"]),
    st.text(max_size=15).map(lambda t: "/" + t),
)


@st.composite
def ssh_specs(draw: st.DrawFn) -> str:
    user = draw(
        st.one_of(st.none(), st.sampled_from(["u", "u:pw", "", "u%ff", "a b"]), st.text(max_size=6))
    )
    port = draw(st.one_of(st.none(), PORTS))
    return (
        "ssh://"
        + (f"{user}@" if user is not None else "")
        + draw(HOSTS)
        + (f":{port}" if port is not None else "")
        + draw(ROOTS)
    )


DEVICE_SPECS = st.one_of(
    ssh_specs(),
    st.text(max_size=20).map(lambda t: "adb:" + t),
    st.text(max_size=20).map(lambda t: "local:" + t),
    st.text(max_size=30).map(lambda t: "ssh://" + t),
)


@runs(80)
@given(spec=DEVICE_SPECS)
def test_device_specs(kz, spec):
    outcome = kz("deploy", "--artifact", "x", "--device", spec)
    check(
        outcome, expect={2, 8}
    )  # 2: refused as written; 8: parsed, then the (stubbed) device failed


@runs(30)
@given(port=st.one_of(st.integers(max_value=0), st.integers(min_value=65536)))
def test_ports_outside_the_range_are_refused(kz, port):
    outcome = kz("deploy", "--artifact", "x", "--device", f"ssh://u@h:{port}/x")
    check(outcome, expect={2})
    assert str(port)[:20] in outcome.output.replace("\n", "")


BENCH_VALUES = st.one_of(
    st.sampled_from(["0", "-1", "", "abc", "1-8+1", "128,512", "1,,2", "nan", "--help", "-"]),
    st.text(max_size=6),
)
SECONDS = st.one_of(st.floats(), st.sampled_from(["nan", "inf", "-inf", "-5", "abc", ""]).map(str))


@runs(40)
@given(
    option=st.sampled_from(
        ["-p", "-n", "-r", "-t", "--ub", "--dev", "-m", "--cooldown", "--timeout"]
    ),
    value=st.one_of(BENCH_VALUES, SECONDS.map(str)),
)
def test_bench_option_values(kz, option, value):
    args = ["-m", "models/x.gguf"] if option != "-m" else []
    attached = (
        f"{option}={value}" if option.startswith("--") else f"{option}{value}"
    )  # a value may start with '-'
    outcome = kz("bench", *args, attached)
    check(
        outcome, expect={2, 8}
    )  # 8: valid, and the (stubbed) device failed; bad values never reach it


@runs(20)
@given(
    threshold=st.one_of(
        st.sampled_from(["nan%", "inf%", "-3%", "abc", "", "%", "1e999%", "-0.1"]),
        st.text(max_size=6),
    )
)
def test_threshold_values(kz, threshold):
    outcome = kz("results", "compare", "a", "b", f"--threshold={threshold}")
    check(outcome, expect={2, 13})  # 13: a valid threshold, and no results named a


# --- the known cases, each with the message it must give ---


@pytest.mark.parametrize(
    ("relpath", "data", "command", "said"),
    [
        (
            "recipes/demo-host.yaml",
            b"description: ok\nupstream: \xff\n",
            ["recipes"],
            "demo-host.yaml:2: not valid UTF-8 (byte 0xff)",
        ),
        (
            "recipes/demo-host.yaml",
            ALIAS_LOOP.encode(),
            ["status", "demo-host"],
            "demo-host.yaml:1: an alias (*name) refers to a value that contains it",
        ),
        (
            "recipes/demo-host.yaml",
            ALIAS_BOMB.encode(),
            ["recipes"],
            "aliases (*name) expand to too much",
        ),
        (
            "recipes/demo-host.yaml",
            b"upstream:\n  commit: " + b"9" * 5000 + b"\n",
            ["recipes"],
            "demo-host.yaml:2: bad value",
        ),
        (
            "recipes/demo-host.yaml",
            b"x: " + b"[" * 3000 + b"]" * 3000 + b"\n",
            ["recipes"],
            "nesting depth",
        ),  # libyaml: "exceeded maximum nesting depth"
        (
            "recipes/demo-host.yaml",
            b"description: a\x00b\n",
            ["recipes"],
            "demo-host.yaml:1: invalid YAML: control character #x00",
        ),
        (
            "recipes/demo-host.yaml",
            b"? [a]\n: b\n",
            ["recipes"],
            "demo-host.yaml:1: keys must be strings, numbers or booleans",
        ),
        (
            "toolchains/ninja.yaml",
            b"label: x\nprovides: [[compiler]]\n",
            ["doctor", "demo-host"],
            "ninja.yaml:2: provides: must be a string",
        ),
        (
            "recipes/devices.yaml",
            b"devices: {t: {transport: ssh, host: h, port: 0}}\n",
            ["deploy", "--artifact", "x", "--device", "t"],
            "devices.yaml:1: port: device t: '0' is not a port number",
        ),
        (
            "recipes/devices.yaml",
            b"devices: {t: {transport: ssh, host: 'a b'}}\n",
            ["deploy", "--artifact", "x", "--device", "t"],
            "host: device t: 'a b' is not a host name",
        ),
        (
            "recipes/devices.yaml",
            b"devices: {t: {transport: adb, serial: 'a b'}}\n",
            ["deploy", "--artifact", "x", "--device", "t"],
            "serial: device t: 'a b' is not an adb serial",
        ),
        (
            "recipes/devices.yaml",
            b"devices: {t: {transport: local, runner: [[a]]}}\n",
            ["deploy", "--artifact", "x", "--device", "t"],
            "runner: must be a string",
        ),
        (
            "recipes/devices.yaml",
            b"devices: {t: {transport: local, env: {A: [x]}}}\n",
            ["deploy", "--artifact", "x", "--device", "t"],
            "A: must be a string",
        ),
        ("patches/series", b"\xfe\n", ["patches", "list"], "series:1: not valid UTF-8 (byte 0xfe)"),
        (
            "recipes/demo-host.yaml",
            DEMO_HOST.replace(b"patches: patches/series", b'patches: "patches/a\\0b"'),
            ["status", "demo-host"],
            "demo-host.yaml:8: patches: a path cannot hold a NUL byte",
        ),
        (
            "recipes/demo-host.yaml",
            DEMO_HOST + b"overlays:\n  - src: " + b"k" * 300 + b"/x.h\n    dest: x.h\n",
            ["recipes"],
            "src: a name in the path is longer than 255 bytes",
        ),
        (
            "toolchains/ndk-r27d.yaml",
            (REPO / "toolchains/ndk-r27d.yaml")
            .read_bytes()
            .replace(b"file: source.properties", b'file: "a\\0b"'),
            ["doctor", "demo-host"],
            "file: a path cannot hold a NUL byte",
        ),
        (
            "patches/series",
            b"a\x00b\n",
            ["status", "demo-host"],
            "series:1: 'a\\x00b' is not a usable file name",
        ),
        ("patches/series", b"x" * 300 + b"\n", ["recipes"], "is not a usable file name"),
    ],
)
def test_config_errors_name_the_file_line_and_problem(kz, damaged, relpath, data, command, said):
    with damaged(relpath, data):
        outcome = kz(*command)
    check(outcome, expect={2})
    assert said in unwrapped(outcome.output), outcome.output


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_a_wait_that_is_not_a_finite_count_of_seconds_is_a_usage_error(kz, value):
    outcome = kz("deploy", "--artifact", "x", "--device", "local", f"--wait={value}")
    check(outcome, expect={2})
    assert "--wait" in unwrapped(outcome.output), outcome.output


def test_a_quoted_port_in_devices_yaml_is_a_number(project):
    from kzbuild.adapters.settings import Settings
    from kzbuild.device.registry import load_devices

    (project / "recipes" / "devices.yaml").write_text(
        'devices: {t: {transport: ssh, host: h, port: "2222"}}\n'
    )
    device = load_devices(
        Settings(project=project, cache=project / "cache", work=project / "work")
    )["t"]
    assert device.port == 2222 and isinstance(
        device.port, int
    )  # known_hosts names [h]:2222 by an int compare


def test_a_patch_that_is_not_utf8_or_has_undecodable_headers_is_a_lint_problem(kz, damaged):
    relpath = "patches/common-fit-counts-CPU_REPACK-as-host-memory.patch"
    original = (REPO / relpath).read_bytes()
    broken = original.replace(b"From: ", b"From: =?x-unknown?q?abc?= ", 1) + b"\xff\n"
    with damaged(relpath, broken):
        outcome = kz("patches", "lint")
    check(outcome, expect={5})
    flat = unwrapped(outcome.output)
    last_line = len(original.splitlines()) + 1
    assert f"{relpath}:{last_line}: not valid UTF-8" in flat
    assert "the 'From:' header cannot be decoded (unknown encoding: x-unknown)" in flat


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["bench", "-m", "x", "--cooldown", "-5"], "--cooldown -5: give zero or more seconds"),
        (["bench", "-m", "x", "--cooldown", "nan"], "--cooldown nan"),
        (["bench", "-m", "x", "--timeout", "inf"], "--timeout inf: give more than zero seconds"),
        (["bench", "-m", "--help"], "--model '--help' is not a model path"),
        (["bench", "-m", "-"], "--model '-' is not a model path"),
        (["bench", "-m", ""], "Invalid value for '--model' / '-m': must not be empty"),
        (["status", ""], "must not be empty"),
        (["deploy", "--device", ""], "must not be empty"),
        (["patches", "check", "--against", ""], "must not be empty"),
        (["patches", "list", "--recipe", ""], "must not be empty"),
        (["run", "", "x"], "must not be empty"),
        (["bench", "-m", "x", "-r", "0"], "-r '0' must be at least 1"),
        (["bench", "-m", "x", "-p", "-1"], "-p '-1' is not a list of counts"),
        (["bench", "-m", "x", "--sweep", "t=4,0"], "--sweep 't=4,0': -t '0' must be at least 1"),
        (["run", "--timeout", "-1", "llama-cli"], "--timeout -1"),
        (
            ["results", "compare", "a", "b", "--threshold", "nan%"],
            "threshold 'nan%' is not a finite percentage",
        ),
        (
            ["results", "compare", "a", "b", "--threshold", "inf%"],
            "threshold 'inf%' is not a finite percentage",
        ),
        (["results", "compare", "a", "b", "--threshold", "-3%"], "threshold '-3%' is negative"),
        (["deploy", "--keep", "0"], "--keep"),
        (
            ["deploy", "--artifact", "x", "--device", "ssh://u@h:99999/x"],
            "'99999' is not a port number",
        ),
        (
            ["deploy", "--artifact", "x", "--device", "ssh://u@h:abc/x"],
            "'abc' is not a port number",
        ),
        (
            ["deploy", "--artifact", "x", "--device", "ssh://[::1/x"],
            "bad ssh device spec 'ssh://[::1/x'",
        ),
        (
            ["deploy", "--artifact", "x", "--device", "ssh://[zz]:22/x"],
            "[zz] is not an IPv6 address",
        ),
        (["deploy", "--artifact", "x", "--device", "ssh://u@:22/x"], "the host is empty"),
        (["deploy", "--artifact", "x", "--device", "ssh://u@h%zz/x"], "'h%zz' is not a host name"),
        (["deploy", "--artifact", "x", "--device", "ssh://u:pw@h/x"], "never passwords"),
        (
            ["deploy", "--artifact", "x", "--device", "ssh://u@h/%ff"],
            "percent-escapes that are not UTF-8",
        ),
        (["deploy", "--artifact", "x", "--device", "adb:"], "bad adb device spec 'adb:'"),
        (["deploy", "--artifact", "x", "--device", "local:"], "bad local device spec 'local:'"),
        (["deploy", "--artifact", "x", "--device", "local:/a\x01b"], "holds control characters"),
    ],
)
def test_bad_values_are_usage_errors_before_any_device_is_contacted(kz, args, said):
    outcome = kz(*args)
    check(outcome, expect={2})
    assert said in unwrapped(outcome.output), outcome.output


def test_an_ipv6_spec_parses_and_names_the_host_in_brackets(kz):
    outcome = kz("deploy", "--artifact", "x", "--device", "ssh://u@[::1]:2222/x")
    check(outcome, expect={8})
    assert "ssh://u@[::1]:2222: not contacted" in outcome.output


def test_folders_that_are_not_folders_are_usage_errors(tmp_path, capsys, project):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for argv, said in (
        (["--project", str(tmp_path / "nope"), "recipes"], "is not a folder"),
        (["--project", str(a_file), "recipes"], "is not a folder"),
        (
            ["--project", str(project), "--work-dir", str(a_file), "deploy", "--artifact", "x"],
            "--work-dir / KZ_WORK_DIR",
        ),
        (
            ["--project", str(project), "--results-dir", str(a_file), "results", "list"],
            "--results-dir / KZ_RESULTS_DIR",
        ),
        (
            ["--project", str(project), "--cache-dir", str(a_file), "recipes"],
            "--cache-dir / KZ_CACHE_DIR",
        ),
        (
            ["--project", str(project), "models", "tiny", "-o", str(tmp_path)],
            "is a folder; name the .gguf file",
        ),
    ):
        capsys.readouterr()
        code = main(argv)
        captured = capsys.readouterr()
        check(Outcome(code, captured.out + captured.err), expect={2})
        assert said in unwrapped(captured.err), (argv, captured.err)
