"""``kzbuild bench``: llama-bench on a device, one stored record per test, with provenance.

Each sweep point is one ``llama-bench -o json`` run of the current release. stdout (the JSON)
and stderr (the logs) are kept apart: the JSON becomes records, both are saved under
``WORK/bench/<run-id>/``. Before each run the device is probed once (fingerprint, thermal
zones, power supply and battery) by a fixed shell script that takes no input.
"""

from __future__ import annotations

import itertools
import logging
import math
import random
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import PurePosixPath
from typing import Any

from kzbuild.adapters.settings import Settings
from kzbuild.device.base import ByteSink, Transport, check_env_name
from kzbuild.device.modelsplit import FIRST_SPLIT_RE
from kzbuild.device.run import (
    check_seconds,
    check_tool,
    current_release,
    env_warnings,
    invocation,
    memory_measured,
    run_logged,
    under_peakrss,
)
from kzbuild.device.store import SHELL_FUNCTIONS
from kzbuild.errors import BadRecord, ConfigError, DeviceError
from kzbuild.measure.memory import check_recipe_formats, memory_of
from kzbuild.measure.resultsdb import ResultsStore
from kzbuild.measure.stats import fresh_seed
from kzbuild.model.bench import (
    BENCH_OPTIONS,
    ENV_AXIS_PREFIX,
    OPTIONS_BY_NAME,
    BenchPart,
    BenchPoint,
    BenchRun,
    BenchSpec,
    DeviceModel,
    DeviceState,
    LlamaBenchTest,
    SweepAxis,
)
from kzbuild.model.device import Device
from kzbuild.model.jsonfields import Fields, check_scalar, show, tool_json
from kzbuild.model.memory import MemoryInfo
from kzbuild.model.provenance import Provenance, toolchain_versions
from kzbuild.model.result import (
    MAX_SAMPLES,
    NOT_CONFIG_FIELDS,
    BenchRecord,
    BuildInfo,
    DeviceInfo,
    ModelInfo,
    SweepInfo,
    VariantInfo,
    bench_test_name,
)
from kzbuild.model.run import Release

log = logging.getLogger(__name__)

LLAMA_BENCH = "llama-bench"
RESERVED_ARGS = ("-o", "--output", "-m", "--model")  # kzbuild sets these itself
MAX_TESTS = 4096  # tests in one llama-bench run (the product of its option lists)
MAX_POINTS = 4096  # points of one sweep (the product of its axes), checked when it is read
MAX_TOKENS = 2**31 - 1  # llama-bench's token counts are C ints
MAX_FIELD_TEXT = 4096  # characters of one text field of a llama-bench test (cpu_info is ~100)
# C ints in llama-bench's JSON, and their least value (n_gpu_layers -1: all layers)
COUNT_FIELDS = {"n_threads": 0, "n_batch": 0, "n_ubatch": 0, "n_gpu_layers": -1}
SHA256SUM_RE = re.compile(r"([0-9a-f]{64})\s")  # "<sha256>  <path>"
STORED_MODEL_RE = re.compile(r"^([0-9a-f]{64})\.gguf$")  # kzbuild models push: models/<sha256>.gguf

# One line per fact, "key<TAB>value". $1 is the sysfs root (tests point it at a tree they build).
PROBE_SCRIPT = r"""
sys=${1:-/sys}
if command -v getprop >/dev/null 2>&1; then
  printf 'android.fingerprint\t%s\n' "$(getprop ro.build.fingerprint)"
  printf 'android.soc_model\t%s\n' "$(getprop ro.soc.model)"
  dumpsys battery 2>/dev/null | while IFS= read -r line; do printf 'battery\t%s\n' "$line"; done
fi
printf 'uname\t%s\n' "$(uname -a)"
# sysfs files are read with the read builtin, not cat: a tablet has ~80 thermal zones, and a
# fork each would make every probe slow. An unreadable file leaves the value empty.
value_of() { value=; { IFS= read -r value < "$1"; } 2>/dev/null; [ -n "$value" ]; }
for zone in "$sys"/class/thermal/thermal_zone*; do
  value_of "$zone/temp" || continue
  temp=$value
  value_of "$zone/type" || value=${zone##*/}
  printf 'thermal.%s\t%s\n' "$value" "$temp"
done
for supply in "$sys"/class/power_supply/*; do
  for item in status capacity online temp; do
    value_of "$supply/$item" && printf 'power.%s.%s\t%s\n' "${supply##*/}" "$item" "$value"
  done
done
"""


def probe(transport: Transport, sysfs: str = "/sys") -> DeviceState:
    result = transport.run(["sh", "-c", PROBE_SCRIPT, "kz-probe", sysfs])
    return parse_probe(result.text())


def parse_probe(text: str) -> DeviceState:
    facts: dict[str, str] = {}
    thermal: dict[str, float] = {}
    power: dict[str, str] = {}
    battery: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition("\t")
        value = value.strip()
        if key == "battery":
            name, sep, reading = value.partition(":")
            if sep and reading.strip():
                battery[name.strip()] = reading.strip()
        elif key.startswith("thermal."):
            celsius = _celsius(value)
            if celsius is not None:
                name = key.removeprefix("thermal.")
                thermal[_unique_key(thermal, name)] = celsius
        elif key.startswith("power."):
            power[key.removeprefix("power.")] = value
        elif key:
            facts[key] = value
    if facts.get("android.fingerprint"):
        fingerprint = {
            k: facts[k] for k in ("android.fingerprint", "android.soc_model") if facts.get(k)
        }
    else:
        fingerprint = {"uname": facts.get("uname", "")}
    conditions: dict[str, Any] = {"thermal_c": thermal}
    if power:
        conditions["power"] = power
    if battery:
        conditions["battery"] = battery
    return DeviceState(fingerprint=fingerprint, conditions=conditions)


def _celsius(text: str) -> float | None:
    """sysfs gives millidegrees on most kernels and degrees on a few."""
    try:
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value):  # float() reads "nan" and "inf", which JSON cannot store
        return None
    return round(value / 1000.0, 1) if abs(value) >= 1000 else value


def _unique_key(existing: Mapping[str, object], name: str) -> str:
    if name not in existing:
        return name
    return next(f"{name}#{n}" for n in itertools.count(2) if f"{name}#{n}" not in existing)


# --- the request ---
def parse_sweep(text: str) -> SweepAxis:
    """``ngl=0,16,99`` or ``env:NAME=a,b``."""
    name, sep, values = text.partition("=")
    axes = ", ".join(o.name for o in BENCH_OPTIONS)
    if not sep or not values:
        raise ConfigError(f"--sweep '{text}' is not AXIS=V1,V2,...", hint=f"axes: {axes}, env:NAME")
    if name.startswith(ENV_AXIS_PREFIX):
        try:
            check_env_name(name.removeprefix(ENV_AXIS_PREFIX))
        except ValueError as exc:
            raise ConfigError(f"--sweep '{text}': {exc}") from None
    elif name not in OPTIONS_BY_NAME:
        raise ConfigError(
            f"--sweep '{text}': unknown axis '{name}'", hint=f"axes: {axes}, env:NAME"
        )
    parsed = tuple(values.split(","))
    if "" in parsed or len(set(parsed)) != len(parsed):
        raise ConfigError(f"--sweep '{text}': values must be non-empty and distinct")
    for value in parsed if name in OPTIONS_BY_NAME else ():
        problem = option_value_problem(name, value)
        if problem:
            raise ConfigError(f"--sweep '{text}': {problem}")
    return SweepAxis(name, parsed)


# llama-bench reads each number option as a list: 128,512 or ranges like 1-8, 1-8+2, 16-512*2
BENCH_NUMBER = re.compile(r"^\d+(?:-\d+(?:[+*]\d+)?)?$")
AT_LEAST_ONE = ("t", "b", "ub", "r")  # threads, batch sizes and repetitions of 0 make no run


def option_value_problem(name: str, value: str) -> str | None:
    """What llama-bench would misread in the value of option ``name`` (p n ngl t b ub dev r), or
    None."""
    if name == "dev":
        return (
            None
            if value.strip() and not value.startswith("-")
            else f"-dev '{value}' is not a device list (e.g. HTP0 or none)"
        )
    for item in value.split(","):
        if not BENCH_NUMBER.match(item):
            return f"-{name} '{value}' is not a list of counts like 128,512 (no negative numbers)"
        if name in AT_LEAST_ONE and int(re.split(r"[-+*]", item)[0]) == 0:
            return f"-{name} '{value}' must be at least 1"
    return None


def check_spec(spec: BenchSpec) -> None:
    """Reject requests llama-bench or the sweep would misread."""
    if not spec.model.strip() or spec.model.startswith("-"):
        raise ConfigError(
            f"--model '{spec.model}' is not a model path", hint="e.g. -m models/tiny.gguf"
        )
    for name, value in spec.options:
        problem = option_value_problem(name, value)
        if problem:
            raise ConfigError(problem)
    check_seconds("--cooldown", spec.cooldown, zero_ok=True)
    check_seconds("--timeout", spec.timeout)
    for arg in spec.extra_args:
        if arg in RESERVED_ARGS:
            raise ConfigError(f"'{arg}' is set by kzbuild bench itself (-o json, -m from --model)")
    sweep_size_check(spec.sweep)
    seen = set()
    for axis in spec.sweep:
        if axis.name in seen:
            raise ConfigError(f"--sweep {axis.name} is given twice")
        seen.add(axis.name)
        fixed = dict(spec.env) if axis.env_name else dict(spec.options)
        if (axis.env_name or axis.name) in fixed:
            raise ConfigError(
                f"{axis.name} is both swept and fixed", hint="drop the fixed value or the sweep"
            )


def sweep_size_check(axes: Sequence[SweepAxis]) -> None:
    """Refuse a sweep of more than MAX_POINTS points before anything expands it."""
    count = math.prod(len(axis.values) for axis in axes)
    if count > MAX_POINTS:
        sizes = " x ".join(f"{len(axis.values)} {axis.name}" for axis in axes)
        raise ConfigError(
            f"the sweep expands to {count} points ({sizes}), more than the {MAX_POINTS} one "
            "bench may run",
            hint="split it into several runs or plans",
        )


def plan(spec: BenchSpec) -> tuple[int, list[BenchPoint]]:
    """The cartesian product of the sweep axes in a random order; returns (seed, points)."""
    seed = fresh_seed(spec.seed)
    combos = list(
        itertools.product(*[[(axis.name, value) for value in axis.values] for axis in spec.sweep])
    )
    random.Random(seed).shuffle(combos)
    return seed, [
        BenchPoint(index=i, total=len(combos), values=tuple(c)) for i, c in enumerate(combos)
    ]


def spec_env_names(spec: BenchSpec) -> dict[str, str]:
    """Every env name a bench sets, fixed or swept (for the GGML_HEXAGON_* name check)."""
    return dict(spec.env) | {axis.env_name: "" for axis in spec.sweep if axis.env_name}


def llama_bench_args(spec: BenchSpec, point: BenchPoint, model: str) -> list[str]:
    """-o json, -v (its log then names the buffers it allocates, at model load and context
    creation; in the timed loop it adds one line per repetition), -m ``model`` (spec.model as the
    tool must be given it), the options, the extras."""
    chosen = point.options(spec)
    args = ["-o", "json", "-v", "-m", model]
    for option in BENCH_OPTIONS:
        if option.name in chosen:
            args += [option.flag, chosen[option.name]]
    return args + list(spec.extra_args)


def parse_llama_bench_json(
    stdout: bytes, *, source: str = "llama-bench output"
) -> list[LlamaBenchTest]:
    """The tests of ``llama-bench -o json`` output, every field checked before anything is stored;
    raises BadRecord naming the test, the key and the value."""
    tests = tool_json(stdout, source=source, tool="llama-bench", item="test")
    if not isinstance(tests, list) or not tests:
        raise BadRecord(f"{source}: expected a non-empty JSON list of tests, got {show(tests)}")
    if len(tests) > MAX_TESTS:
        raise BadRecord(
            f"{source}: {len(tests)} tests in one run; more than {MAX_TESTS} is not llama-bench "
            "output"
        )
    return [
        parse_llama_bench_test(test, where=f"{source}: test {index}")
        for index, test in enumerate(tests)
    ]


def parse_llama_bench_test(data: object, *, where: str) -> LlamaBenchTest:
    fields = Fields(data, where)
    n_prompt, n_gen = (
        fields.count("n_prompt", maximum=MAX_TOKENS),
        fields.count("n_gen", maximum=MAX_TOKENS),
    )
    if not n_prompt and not n_gen:
        raise BadRecord(f"{where}: n_prompt and n_gen are both 0, so it measured nothing")
    samples = fields.numbers("samples_ts", max_items=MAX_SAMPLES)
    if not samples:
        raise fields.error("samples_ts", "a non-empty list of numbers > 0")
    # fields kzbuild does not read itself, kept in raw: checked so the stored record says
    # nothing false
    for key in ("cpu_info", "gpu_info", "backends", "model_filename", "test_time"):
        fields.optional_text(key)
    for key in ("build_number", "model_n_params", "stddev_ns"):
        fields.optional_count(key)
    if fields.optional_count("avg_ns") == 0:
        raise fields.error("avg_ns", "an integer > 0")
    if "samples_ns" in fields.data and len(
        fields.numbers("samples_ns", max_items=MAX_SAMPLES)
    ) != len(samples):
        raise fields.error(
            "samples_ns", f"a list of {len(samples)} numbers > 0, one per samples_ts"
        )
    config = {key: value for key, value in fields.data.items() if key not in NOT_CONFIG_FIELDS}
    for key, value in config.items():
        check_scalar(value, where=f"{where}: {key}")
    for key, least in COUNT_FIELDS.items():  # n_threads: true would be stored as t=True
        if key in fields.data:
            fields.count(key, minimum=least, maximum=MAX_TOKENS)
    for key, value in fields.data.items():
        if isinstance(value, str) and len(value) > MAX_FIELD_TEXT:
            raise fields.error(key, f"a text of at most {MAX_FIELD_TEXT} characters")
    return LlamaBenchTest(
        n_prompt=n_prompt,
        n_gen=n_gen,
        n_depth=fields.count("n_depth", 0, maximum=MAX_TOKENS),
        avg_ts=fields.number("avg_ts"),
        stddev_ts=fields.number("stddev_ts", zero_ok=True),
        samples_ts=samples,
        build_commit=fields.text("build_commit"),
        model_type=fields.text("model_type"),
        model_size=fields.count("model_size", minimum=1),
        config=config,
        raw=dict(fields.data),
    )


# The device root's physical path, then each path the model's symlinks lead through, with its dir
# resolved (the dir may be a link, as models/ can be), up to the file: one round trip tells
# whether the model is one kzbuild models push stored (named by its sha256) and, for a split model,
# which name tools open (its first split's link: llama.cpp finds the other splits by that name).
RESOLVE_SCRIPT = SHELL_FUNCTIONS + (
    'pwd -P || exit 1; f=$1 i=0; while [ "$i" -lt 40 ]; do '
    'case $f in */*) d=${f%/*} ;; *) d=. ;; esac; p=$(cd "$d" && pwd -P) || exit 1; '
    'kz_put "$p/${f##*/}"; [ -L "$f" ] || exit 0; t=$(readlink "$f") || exit 1; '
    "case $t in /*) f=$t ;; *) f=$d/$t ;; esac; i=$((i + 1)); done; exit 1"
)


def device_model(transport: Transport, device: Device, model: str) -> DeviceModel:
    """``model`` (relative to the device root) resolved: a model that resolves into
    ROOT/models/<sha256>.gguf (or, through its first split's link, into a split) is named by the
    sha256 kzbuild models push verified, in one round trip; any other is hashed on the device
    and given to tools as is."""
    resolved = transport.run(["sh", "-c", RESOLVE_SCRIPT, "kz-model", model], cwd=device.root)
    if resolved.ok and (stored := stored_model(resolved.text(), model)) is not None:
        return stored
    result = transport.run(["sha256sum", model], cwd=device.root)
    if not result.ok:
        raise ConfigError(
            f"{device.name}: cannot read model '{model}' (relative paths start at {device.root})",
            hint="push it with kzbuild models push FILE, or give its path on the device",
        )
    digest = SHA256SUM_RE.match(result.text())
    if digest is None:  # an odd sha256sum (or none) must not put junk in the model's identity
        raise DeviceError(
            f"{device.name}: sha256sum {model} printed no sha256: {show(result.text())}",
            hint="check the device's sha256sum (toybox or busybox)",
        )
    return DeviceModel(sha256=digest[1], tool_path=model)


def stored_model(resolved: str, model: str) -> DeviceModel | None:
    """The stored model :data:`RESOLVE_SCRIPT`'s answer (the root, then the model's paths) leads
    to, or None: a split model's first-split link (the last such on the way, as an older kzbuild's
    link is the file itself), else a file models/<sha256>.gguf. A newline in a path makes the
    check fail: the model is then hashed."""
    root, *hops = resolved.rstrip("\n").split("\n")
    paths = [PurePosixPath(hop) for hop in hops]
    in_store = [path for path in paths if str(path.parent) == f"{root}/models"]
    for path in reversed(in_store):
        if FIRST_SPLIT_RE.match(path.name):
            return DeviceModel(sha256=path.name[:64], tool_path=str(path))
    if paths and paths[-1] in in_store and (whole := STORED_MODEL_RE.match(paths[-1].name)):
        return DeviceModel(sha256=whole[1], tool_path=model)
    return None


def new_run_id(now: datetime) -> str:
    return f"{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def bench(
    settings: Settings,
    transport: Transport,
    device: Device,
    spec: BenchSpec,
    store: ResultsStore,
    *,
    on_point: Callable[[BenchPoint], None] | None = None,
    on_stderr: ByteSink | None = None,
    sleep: Callable[[float], None] = time.sleep,
    release: Release | None = None,
    part: BenchPart | None = None,
) -> BenchRun:
    """Run every sweep point and store its records as soon as it finishes.

    ``release``: bench that release instead of the one ``current`` points at. ``part``: the run
    is a turn of an interleaved experiment (kzbuild.measure.interleave), whose run id, log folder,
    record positions, model, kz-peakrss verdict and variant it takes (and warns about env names
    itself)."""
    check_spec(spec)
    release = release or current_release(transport, device)
    check_tool(transport, device, release, LLAMA_BENCH)
    if part is None:  # an experiment warns (and checks the log formats) once for all its turns
        for warning in env_warnings(settings, release, spec_env_names(spec)):
            log.warning("%s", warning)
        recipe = release.manifest.get("recipe")
        check_recipe_formats(settings, recipe if isinstance(recipe, str) else None)
    measured = (
        part.measured if part else memory_measured(transport, device, release, spec.memory_limits)
    )
    model = part.model if part else device_model(transport, device, spec.model)
    seed, points = plan(spec)
    run_id = part.run_id if part else new_run_id(datetime.now(timezone.utc))
    logs = part.logs if part else settings.work / "bench" / run_id
    logs.mkdir(parents=True, exist_ok=True)
    first_seq = part.first_seq if part else 0
    records: list[BenchRecord] = []
    for point in points:
        if point.index and spec.cooldown:
            sleep(spec.cooldown)
        if on_point:
            on_point(point)
        state = probe(transport)
        call = invocation(
            device,
            release,
            LLAMA_BENCH,
            llama_bench_args(spec, point, model.tool_path),
            point.env(spec),
        )
        call = under_peakrss(call, release, device) if measured else call
        host_time = datetime.now(timezone.utc).isoformat(timespec="seconds")
        stem = f"{point.index:03d}"
        stdout = run_logged(transport, call, logs, stem, timeout=spec.timeout, on_stderr=on_stderr)
        stderr_log = logs / f"{stem}.stderr.log"
        log_text = stderr_log.read_text(errors="replace")
        limits = spec.memory_limits
        memory = memory_of(log_text, source=str(stderr_log), measured=measured, limits=limits)
        made = [
            make_record(
                test,
                run_id=run_id,
                host_time=host_time,
                seq=first_seq + len(records) + position,
                release=release,
                device=device,
                state=state,
                spec=spec,
                model_hash=model.sha256,
                argv=call.argv,
                env=call.env,
                cwd=call.cwd,
                point=point,
                seed=seed,
                variant=part.variant if part else None,
                memory=memory,
            )
            for position, test in enumerate(
                parse_llama_bench_json(stdout, source=str(logs / f"{point.index:03d}.json"))
            )
        ]
        store.add(made)
        records += made
    return BenchRun(run_id=run_id, seed=seed, records=tuple(records), logs=logs)


def make_record(
    test: LlamaBenchTest,
    *,
    run_id: str,
    host_time: str,
    seq: int,
    release: Release,
    device: Device,
    state: DeviceState,
    spec: BenchSpec,
    model_hash: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    point: BenchPoint,
    seed: int,
    variant: VariantInfo | None = None,
    memory: MemoryInfo | None = None,
) -> BenchRecord:
    return BenchRecord(
        run_id=run_id,
        kind="bench",
        host_time=host_time,
        test=bench_test_name(test.n_prompt, test.n_gen, test.n_depth),
        seq=seq,
        build=BuildInfo.of_release(release, test.build_commit),
        device=DeviceInfo(
            name=device.name, address=device.address, fingerprint=dict(state.fingerprint)
        ),
        model=ModelInfo(
            path=spec.model, sha256=model_hash, type=test.model_type, size=test.model_size
        ),
        config=dict(test.config),
        avg_ts=test.avg_ts,
        stddev_ts=test.stddev_ts,
        samples_ts=test.samples_ts,
        env=dict(env),
        argv=tuple(argv),
        cwd=cwd,
        conditions=dict(state.conditions),
        sweep=SweepInfo(point=dict(point.values), seed=seed, index=point.index, total=point.total),
        raw=dict(test.raw),
        variant=variant,
        memory=memory,
        provenance=provenance_of(release, model_hash, state),
    )


def provenance_of(release: Release, model_hash: str | None, state: DeviceState) -> Provenance:
    """The identity of a number measured with the release's build on the probed device."""
    lock = release.manifest.get("lock_sha256")
    return Provenance(
        lock_sha256=lock if isinstance(lock, str) else None,
        toolchains=toolchain_versions(release.manifest),
        build_id=release.build_id,
        model_sha256=model_hash,
        device=dict(state.fingerprint),
    )
