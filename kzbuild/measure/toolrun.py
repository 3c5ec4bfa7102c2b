"""``kzbuild run``'s record: the tool's peak memory and llama.cpp's buffers, stored as bench's.

A run of a tool is one record of kind ``run`` in the results store: its test is the tool's name,
its configuration the tool's arguments, its memory kz-peakrss's peak and the buffers of its
stderr (the parser and the format check of ``kzbuild.measure.memory``), its provenance that of a
bench (lock, toolchains, build id, model sha256 when ``-m`` names one, device fingerprint). It
has no throughput. Its stderr is kept in ``WORK/run/<run-id>/stderr.log``; a run that fails
stores nothing.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from itertools import pairwise

from kzbuild.adapters.settings import Settings
from kzbuild.device.base import ByteSink, Transport
from kzbuild.device.run import memory_measured, run_in_release
from kzbuild.errors import ConfigError
from kzbuild.measure.bench import device_model, new_run_id, probe, provenance_of
from kzbuild.measure.memory import check_recipe_formats, memory_of
from kzbuild.measure.resultsdb import ResultsStore
from kzbuild.model.device import Device
from kzbuild.model.memory import MemoryLimits
from kzbuild.model.result import BenchRecord, BuildInfo, DeviceInfo, ModelInfo
from kzbuild.model.run import Release

log = logging.getLogger(__name__)

MODEL_FLAGS = ("-m", "--model")  # llama.cpp's tools name their model file so


def model_arg(args: Sequence[str]) -> str | None:
    """The model file the arguments name (``-m PATH`` or ``--model PATH``), if any."""
    return next((value for flag, value in pairwise(args) if flag in MODEL_FLAGS), None)


def with_model(args: Sequence[str], model: str) -> list[str]:
    """``args`` with the value of their model flag replaced by ``model``."""
    out = list(args)
    for index, flag in enumerate(out[:-1]):
        if flag in MODEL_FLAGS:
            out[index + 1] = model
            break
    return out


def run_tool(
    settings: Settings,
    transport: Transport,
    device: Device,
    release: Release,
    tool: str,
    args: Sequence[str],
    store: ResultsStore,
    *,
    env: Mapping[str, str],
    limits: MemoryLimits,
    timeout: float | None,
    on_stdout: ByteSink,
    on_stderr: ByteSink,
) -> tuple[int, BenchRecord | None]:
    """Run the tool under kz-peakrss (when the release has it) and store its record; returns the
    tool's exit code and the record (None when the tool failed)."""
    measured = memory_measured(transport, device, release, limits)
    recipe = release.manifest.get("recipe")
    check_recipe_formats(settings, recipe if isinstance(recipe, str) else None)
    model = model_arg(args)
    model_hash = None
    if model is not None:
        try:
            found = device_model(transport, device, model)
            model_hash = found.sha256
            args = with_model(args, found.tool_path)
        except ConfigError as exc:  # the tool says what is wrong with its model itself
            log.warning("%s; the record names no model sha256", exc.message)
    state = probe(transport)
    now = datetime.now(timezone.utc)
    run_id = new_run_id(now)
    logs = settings.work / "run" / run_id
    logs.mkdir(parents=True, exist_ok=True)
    stderr_log = logs / "stderr.log"
    with open(stderr_log, "wb") as sink:

        def tee(chunk: bytes) -> None:
            sink.write(chunk)
            on_stderr(chunk)

        call, code = run_in_release(
            settings,
            transport,
            device,
            release,
            tool,
            args,
            env=env,
            measured=measured,
            timeout=timeout,
            on_stdout=on_stdout,
            on_stderr=tee,
        )
    if code != 0:
        return code, None
    text = stderr_log.read_text(errors="replace")
    record = BenchRecord(
        run_id=run_id,
        kind="run",
        host_time=now.isoformat(timespec="seconds"),
        test=tool,
        seq=0,
        build=BuildInfo.of_release(release, None),
        device=DeviceInfo(
            name=device.name, address=device.address, fingerprint=dict(state.fingerprint)
        ),
        model=ModelInfo(path=model or "", sha256=model_hash),
        config={"args": shlex.join(args)},
        unit="",
        env=dict(call.env),
        argv=tuple(call.argv),
        cwd=call.cwd,
        conditions=dict(state.conditions),
        memory=memory_of(text, source=str(stderr_log), measured=measured, limits=limits),
        provenance=provenance_of(release, model_hash, state),
    )
    store.add([record])
    return code, record
