"""Experiment plans (``plans/*.yaml``): validated like recipes, every error names the file, line and
key.

A plan declares the model (a device path or a pushed model's name, with its sha256), the device,
repetitions, a seed, env for every run, and a list of llama-bench runs, each with its fixed
options, env and sweep; ``ab:`` holds what ``kzbuild ab`` adds (variants, blocks, cooling).
``kzbuild bench --plan`` and ``kzbuild ab --plan`` run it. See plans/README.md.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from pathlib import Path

from kzbuild.adapters import yamlconf
from kzbuild.device.base import Transport, check_env_name
from kzbuild.device.run import check_seconds
from kzbuild.errors import ConfigError
from kzbuild.measure.bench import (
    check_spec,
    device_model,
    option_value_problem,
    parse_sweep,
    sweep_size_check,
)
from kzbuild.measure.interleave import MAX_BLOCKS, parse_temperature
from kzbuild.measure.quality import check_quality_spec, corpus_path
from kzbuild.model.bench import ENV_AXIS_PREFIX, OPTIONS_BY_NAME, BenchSpec
from kzbuild.model.device import Device
from kzbuild.model.effect import MIN_EFFECT_PCT
from kzbuild.model.memory import SIZE_EXAMPLE, SIZE_HINT, MemoryLimits, parse_size
from kzbuild.model.plan import Plan, PlanAb, PlanModel, PlanRun, PlanTurn
from kzbuild.model.quality import (
    DEFAULT_CHUNKS,
    DEFAULT_CONTEXT,
    DEFAULT_CORPUS,
    OPTION_FLAGS,
    QualityLimits,
    QualitySpec,
)

log = logging.getLogger(__name__)

PLAN_KEYS = (
    "description",
    "model",
    "device",
    "repetitions",
    "seed",
    "cooldown",
    "timeout",
    "env",
    "runs",
    "ab",
    "memory_budget",
    "htp_session_limit",
    "turn",
    "quality",
)
TURN_KEYS = ("prompt", "generate", "prefill", "decode")
MODEL_KEYS = ("path", "name", "sha256")
RUN_KEYS = ("name", "options", "env", "sweep", "args")
AB_KEYS = (
    "variants",
    "blocks",
    "cool_to",
    "cool_wait",
    "cool_zones",
    "min_effect_pct",
    "max_width_pct",
    "max_seconds",
)
QUALITY_KEYS = (
    "max_kld",
    "min_top1",
    "corpus",
    "context",
    "chunks",
    "options",
    "env",
    "reference",
    "reference_options",
    "timeout",
)
MAX_CONTEXT = 1 << 20
SHA256 = re.compile(r"^[0-9a-f]{64}$")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
MAX_SEED = 2**32 - 1


def load_plan(path: Path) -> Plan:
    if not path.is_file():
        raise ConfigError("plan file not found", path=path, hint="plans live in plans/NAME.yaml")
    doc = yamlconf.load(path)
    doc.check_keys(PLAN_KEYS, required=("model", "runs"), context="plan")
    repetitions = _count(doc, "repetitions", minimum=1)
    seed = _count(doc, "seed", minimum=0, maximum=MAX_SEED)
    cooldown = _seconds(doc, "cooldown", zero_ok=True) or 0.0
    timeout = _seconds(doc, "timeout")
    common_env = _env(doc, "env")
    model = _model(doc)
    budget, session = _size(doc, "memory_budget"), _size(doc, "htp_session_limit")
    memory = MemoryLimits(budget_bytes=budget, htp_session_bytes=session)
    runs_list = doc.get_list("runs")
    if not runs_list:
        raise doc.error("runs", "a plan needs at least one run")
    runs: list[PlanRun] = []
    for index, item in enumerate(runs_list):
        if not isinstance(item, yamlconf.Mapping):
            raise runs_list.error(
                index, "a run is a mapping (name, options, env, sweep, args)", key="runs"
            )
        run = _run(item, index, model.path, common_env, repetitions, seed, cooldown, timeout)
        if any(run.name == other.name for other in runs):
            raise item.error("name", f"run name '{run.name}' is used twice")
        runs.append(replace(run, spec=replace(run.spec, memory_limits=memory)))
    return Plan(
        path=path,
        name=path.stem,
        description=doc.get_str("description", "") or "",
        model=model,
        device=_device(doc),
        runs=tuple(runs),
        ab=_ab(doc),
        seed=seed,
        memory=memory,
        turn=_turn(doc, runs),
        quality=_quality(doc),
    )


def _size(doc: yamlconf.Mapping, key: str) -> int | None:
    value = doc.get(key)
    if value is None:
        return None
    size = parse_size(value) if isinstance(value, str) else None
    if size is None:
        raise doc.error(
            key,
            f"{value!r} is not {SIZE_EXAMPLE}",
            hint=SIZE_HINT,
        )
    return size


def _turn(doc: yamlconf.Mapping, runs: list[PlanRun]) -> PlanTurn | None:
    if doc.get("turn") is None:
        return None
    section = doc.get_mapping("turn")
    section.check_keys(TURN_KEYS, required=TURN_KEYS, context="turn")
    prompt, generate = _count(section, "prompt", minimum=1), _count(section, "generate", minimum=1)
    if prompt is None or generate is None:
        missing = "prompt" if prompt is None else "generate"
        raise section.error(missing, "must be a whole number of tokens")
    by_name = {run.name: run for run in runs}
    names = {}
    for key, option, tokens in (("prefill", "p", prompt), ("decode", "n", generate)):
        name = _name(section, key)
        if name not in by_name:
            raise section.error(key, f"names no run of the plan (runs: {', '.join(by_name)})")
        if str(tokens) not in run_values(by_name[name].spec, option):
            what = "prompt" if key == "prefill" else "generate"
            raise section.error(
                key,
                f"run '{name}' does not measure -{option} {tokens} "
                f"(the turn's {what}); add it to its {option}",
            )
        names[key] = name
    return PlanTurn(prompt, generate, prefill=names["prefill"], decode=names["decode"])


def run_values(spec: BenchSpec, option: str) -> set[str]:
    """The values a run gives llama-bench's ``option``: its fixed list or its sweep (ranges are
    not expanded)."""
    given = dict(spec.options).get(option)
    swept = next((axis.values for axis in spec.sweep if axis.name == option), ())
    return {item for value in ([given] if given else []) + list(swept) for item in value.split(",")}


def _model(doc: yamlconf.Mapping) -> PlanModel:
    section = doc.get("model")
    if not isinstance(section, yamlconf.Mapping):
        raise doc.error("model", "must be a mapping: path or name, and sha256")
    section.check_keys(MODEL_KEYS, required=("sha256",), context="model")
    path, name = section.get_path("path"), section.get_path("name")
    if (path is None) == (name is None):
        raise doc.error(
            "model",
            "give the model's path on the device or the name it was pushed under (kzbuild models "
            "push), one of them",
        )
    if name is not None and "/" in name:
        raise section.error(
            "name",
            f"'{name}' is a path: a name is a file name under models/ (use path: for other places)",
        )
    location = path if path is not None else f"models/{name}"
    if location.startswith("-") or not location.strip():
        raise section.error(
            "path" if path is not None else "name", f"'{location}' is not a model path"
        )
    sha = section.get("sha256")
    if sha is not None and not (isinstance(sha, str) and SHA256.match(sha)):
        raise section.error(
            "sha256",
            "must be 64 lowercase hex digits (sha256sum of the model file), or null while it is "
            "not pinned yet",
        )
    return PlanModel(path=location, sha256=sha, line=section.line_of("sha256"))


def _run(
    item: yamlconf.Mapping,
    index: int,
    model: str,
    common_env: dict[str, str],
    repetitions: int | None,
    seed: int | None,
    cooldown: float,
    timeout: float | None,
) -> PlanRun:
    item.check_keys(RUN_KEYS, required=("name",), context="run")
    name = _name(item, "name") or f"run-{index + 1}"
    options_section = item.get_mapping("options")
    options: dict[str, str] = {}
    for option, value in options_section.items():
        if option not in OPTIONS_BY_NAME:
            raise options_section.error(
                option,
                f"unknown llama-bench option '{option}'",
                hint=f"options: {', '.join(OPTIONS_BY_NAME)}",
            )
        if not yamlconf.is_scalar_text(value):
            raise options_section.error(option, "must be a number or a string such as 128,512")
        problem = option_value_problem(option, str(value))
        if problem:
            raise options_section.error(option, problem)
        options[option] = str(value)
    if repetitions is not None:
        options.setdefault("r", str(repetitions))
    env = common_env | _env(item, "env")
    sweep_section = item.get_mapping("sweep")
    axes = []
    for axis, values in sweep_section.items():
        if (
            not isinstance(values, yamlconf.Sequence)
            or not values
            or not all(yamlconf.is_scalar_text(v) for v in values)
        ):
            raise sweep_section.error(
                axis, "must be a non-empty list of values, e.g. [128, 256, 512]"
            )
        try:
            axes.append(parse_sweep(f"{axis}={','.join(str(v) for v in values)}"))
        except ConfigError as exc:
            raise sweep_section.error(
                axis, exc.message.replace("--sweep ", "sweep "), hint=exc.hint
            ) from None
    try:
        sweep_size_check(axes)
    except ConfigError as exc:
        raise item.error("sweep", exc.message, hint=exc.hint) from None
    args = item.get_str_list("args")
    spec = BenchSpec(
        model=model,
        options=tuple(options.items()),
        env=tuple(env.items()),
        extra_args=args,
        sweep=tuple(axes),
        seed=seed,
        cooldown=cooldown,
        timeout=timeout,
    )
    try:
        check_spec(spec)
    except ConfigError as exc:
        key = next(
            (a.name for a in axes if a.name in exc.message or (a.env_name or "") in exc.message),
            None,
        )
        raise (sweep_section if key else item).error(
            key or "args", exc.message, hint=exc.hint
        ) from None
    return PlanRun(name=name, spec=spec)


def _quality(doc: yamlconf.Mapping) -> QualitySpec | None:
    """``quality:``: the limits, the corpus, context and chunks, how the variants and the reference
    run (docs/quality.md)."""
    if doc.get("quality") is None:
        return None
    section = doc.get_mapping("quality")
    section.check_keys(QUALITY_KEYS, context="quality")
    limits = QualityLimits(
        max_kld=_limit(section, "max_kld", float("inf")), min_top1=_limit(section, "min_top1", 100)
    )
    if limits.max_kld is None and limits.min_top1 is None:
        raise section.error(
            "max_kld",
            "a quality check needs a limit: max_kld (mean KL divergence), min_top1 (percent), or "
            "both",
        )
    corpus = section.get_str("corpus") or DEFAULT_CORPUS
    try:
        corpus_path(corpus)
    except ConfigError as exc:
        raise section.error("corpus", exc.message, hint=exc.hint) from None
    spec = QualitySpec(
        limits=limits,
        corpus=corpus,
        context=_count(section, "context", minimum=8, maximum=MAX_CONTEXT) or DEFAULT_CONTEXT,
        chunks=_count(section, "chunks", minimum=1, maximum=10_000) or DEFAULT_CHUNKS,
        options=_quality_options(section, "options"),
        env=tuple(_env(section, "env").items()),
        reference=_name(section, "reference") or "upstream",
        reference_options=_quality_options(section, "reference_options")
        if section.get("reference_options") is not None
        else QualitySpec().reference_options,
        timeout=_seconds(section, "timeout"),
    )
    try:
        check_quality_spec(spec)
    except ConfigError as exc:
        raise section.error("chunks", exc.message, hint=exc.hint) from None
    return spec


def _limit(section: yamlconf.Mapping, key: str, high: float) -> float | None:
    value = section.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= high:
        raise section.error(key, f"must be a number from 0 to {high:g}")
    return float(value)


def _quality_options(section: yamlconf.Mapping, key: str) -> tuple[tuple[str, str], ...]:
    """llama-perplexity options by the names the runs use: dev, ngl, t, ub, fa."""
    options = section.get_mapping(key)
    found = []
    for name, value in options.items():
        if name not in OPTION_FLAGS:
            raise options.error(
                name,
                f"unknown llama-perplexity option '{name}'",
                hint=f"options: {', '.join(OPTION_FLAGS)}",
            )
        text = str(value)
        if (
            not yamlconf.is_scalar_text(value)
            or not text.strip()
            or text.startswith("-")
            or any(c.isspace() for c in text)
        ):
            raise options.error(name, "must be one value such as HTP0, none or 8")
        if (
            name != "dev"
            and not text.isdigit()
            and not (name == "fa" and text in ("on", "off", "auto"))
        ):
            raise options.error(name, "must be a whole number")
        found.append((name, text))
    return tuple(found)


def _env(section: yamlconf.Mapping, key: str) -> dict[str, str]:
    env = section.get_mapping(key)
    found = {}
    for name, value in env.items():
        if name.startswith(ENV_AXIS_PREFIX):
            raise env.error(name, f"'{name}' belongs under sweep:, not env:")
        try:
            check_env_name(name)
        except ValueError as exc:
            raise env.error(name, str(exc)) from None
        if not yamlconf.is_scalar_text(value):
            raise env.error(name, "must be a string or a number")
        found[name] = str(value)
    return found


def _ab(doc: yamlconf.Mapping) -> PlanAb:
    section = doc.get_mapping("ab")
    section.check_keys(AB_KEYS, context="ab")
    cool_to = None
    if section.get("cool_to") is not None:
        text = section.get_str("cool_to") or ""
        try:
            cool_to = parse_temperature(text)
        except ConfigError as exc:
            raise section.error(
                "cool_to", exc.message.replace("--cool-to", "cool_to"), hint=exc.hint
            ) from None
    return PlanAb(
        variants=section.get_str_list("variants"),
        blocks=_count(section, "blocks", minimum=1, maximum=MAX_BLOCKS),
        cool_to=cool_to,
        cool_wait=_seconds(section, "cool_wait", zero_ok=True),
        cool_zones=section.get_str_list("cool_zones"),
        min_effect_pct=_percent(section, "min_effect_pct") or MIN_EFFECT_PCT,
        max_width_pct=_percent(section, "max_width_pct"),
        max_seconds=_seconds(section, "max_seconds"),
    )


def _percent(section: yamlconf.Mapping, key: str) -> float | None:
    value = section.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1000:
        raise section.error(key, "must be a percentage above 0 and at most 1000 (e.g. 2 for 2%)")
    return float(value)


def _count(
    section: yamlconf.Mapping, key: str, *, minimum: int, maximum: int = 2**31 - 1
) -> int | None:
    value = section.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise section.error(key, f"must be a whole number from {minimum} to {maximum}")
    return value


def _seconds(section: yamlconf.Mapping, key: str, *, zero_ok: bool = False) -> float | None:
    value = section.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise section.error(key, "must be a number of seconds")
    try:
        check_seconds(key, float(value), zero_ok=zero_ok)
    except ConfigError as exc:
        raise section.error(key, exc.message) from None
    return float(value)


def _device(doc: yamlconf.Mapping) -> str | None:
    value = doc.get_str("device")
    if value is not None and (not value.strip() or value.startswith("-")):
        raise doc.error(
            "device",
            "must be a device name from recipes/devices.yaml or a device spec (adb:SERIAL, "
            "ssh://..., local:/path)",
        )
    return value


def _name(section: yamlconf.Mapping, key: str) -> str | None:
    value = section.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not NAME.match(value):
        raise section.error(key, "must be a name of letters, digits, '.', '_' and '-'")
    return value


def check_model(plan: Plan, transport: Transport, device: Device) -> str:
    """The model's sha256 on the device, checked against the plan's (exit 2 naming the plan's line
    when it differs); a plan without one gets a warning with the measured hash to pin."""
    found = device_model(transport, device, plan.model.path).sha256
    if plan.model.sha256 is None:
        log.warning(
            "%s: the plan pins no sha256 for %s; %s holds %s (put it in the plan's model.sha256)",
            plan.path,
            plan.model.path,
            device.name,
            found,
        )
    elif found != plan.model.sha256:
        raise ConfigError(
            f"{device.name}: {plan.model.path} has sha256 {found}, not the plan's "
            f"{plan.model.sha256}",
            path=plan.path,
            line=plan.model.line,
            key="sha256",
            hint="push the model the plan names (kzbuild models push FILE), or update the plan",
        )
    return found
