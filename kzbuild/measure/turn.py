"""The team's turn (a plan's ``turn:``) from measured records: prefill then decode, each at its
best measured configuration (the highest median over the records of one configuration)."""

from __future__ import annotations

from collections.abc import Sequence

from kzbuild.errors import ResultsError
from kzbuild.measure.compare import describe_config, describe_env, group
from kzbuild.model.result import BenchRecord, Group
from kzbuild.model.turn import TurnTime


def best(records: Sequence[BenchRecord], test: str, what: str) -> Group:
    groups = [
        g
        for g in group(r for r in records if r.test == test and r.kind == "bench")
        if g.summary.median
    ]
    if not groups:
        raise ResultsError(f"no measured {test} results for the turn's {what}")
    return max(groups, key=lambda g: g.summary.median or 0.0)


def _config(record: BenchRecord) -> str:
    """Its llama-bench configuration and the GGML_* env it ran with (a swept kernel choice)."""
    return " ".join(
        filter(
            None,
            (
                describe_config(record),
                describe_env((k, v) for k, v in record.env_set if k.startswith("GGML_")),
            ),
        )
    )


def turn_time(
    prefill: Sequence[BenchRecord], decode: Sequence[BenchRecord], *, prompt: int, generate: int
) -> TurnTime:
    """TTFT and the whole turn from the best pp<prompt> of ``prefill`` and the best tg<generate> of
    ``decode``; ResultsError when either has none."""
    pp, tg = best(prefill, f"pp{prompt}", "prefill"), best(decode, f"tg{generate}", "decode")
    assert pp.summary.median and tg.summary.median  # best() keeps groups with a median only
    return TurnTime(
        prompt=prompt,
        generate=generate,
        prefill_tps=pp.summary.median,
        decode_tps=tg.summary.median,
        prefill_config=_config(pp.first),
        decode_config=_config(tg.first),
    )
