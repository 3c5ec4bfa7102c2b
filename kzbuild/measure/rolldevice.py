"""``kzbuild roll --device``: the pin and a candidate benched on a device (roll's ABRunner).

Its own module so that a roll without ``--device`` loads none of deploy, interleave or results.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from kzbuild.adapters.settings import Settings
from kzbuild.device.base import Transport
from kzbuild.measure.interleave import deploy_arms, run_interleaved
from kzbuild.measure.quality import check_variants, quality_store
from kzbuild.measure.resultsdb import ResultsStore
from kzbuild.model.bench import BenchSpec
from kzbuild.model.device import Device
from kzbuild.model.quality import QualityRecord, QualitySpec


class DeviceRunner:
    """The ABRunner of a device: each variant's artifact is deployed (a release each; only contents
    the device lacks move), then all are benched by kzbuild.measure.interleave (as `kzbuild ab`
    does) in the
    roll's order, each record stored with its variant. The pin is deployed last, so `current` stays
    on it. A sample is one run's median of its first test (e.g. pp512), in tokens per second."""

    def __init__(
        self,
        settings: Settings,
        transport: Transport,
        device: Device,
        spec: BenchSpec,
        store: ResultsStore,
        *,
        wait: float = 0.0,
        quality_spec: QualitySpec | None = None,
    ) -> None:
        self.settings, self.transport, self.device, self.spec, self.store, self.wait = (
            settings,
            transport,
            device,
            spec,
            store,
            wait,
        )
        self.metric = "the first test's t/s"  # named after the run, by the test it measured
        self.quality_spec = quality_spec
        self.quality: Sequence[QualityRecord] = ()
        self.memory_over: Mapping[str, Sequence[str]] = {}

    def run(
        self, variants: Mapping[str, Path], order: Sequence[Sequence[str]], seed: int
    ) -> Mapping[str, Sequence[float]]:
        pin_last = sorted(variants.items(), key=lambda item: item[0] == "pin")
        arms = deploy_arms(self.transport, self.device, pin_last, wait=self.wait)
        done = run_interleaved(
            self.settings,
            self.transport,
            self.device,
            arms,
            self.spec,
            self.store,
            blocks=len(order),
            seed=seed,
            order=order,
        )
        first = done.first_record()
        self.metric = f"{first.test} t/s"
        self.memory_over = {
            name: sorted({over for r in records if r.memory for over in r.memory.over})
            for name, records in done.records.items()
        }
        if (
            self.quality_spec is not None
        ):  # a roll has no bare-upstream variant: the pin's logits on the CPU are the reference
            releases = {arm.name: arm.release for arm in arms}
            spec = (
                self.quality_spec
                if self.quality_spec.reference in releases
                else replace(self.quality_spec, reference="pin")
            )
            self.quality = tuple(
                check_variants(
                    self.transport,
                    self.device,
                    releases,
                    spec,
                    self.spec.model,
                    quality_store(self.settings.results),
                    self.settings.work / "quality",
                )
            )
        # one sample per run: its median, of the first test's group (same test,
        # configuration and env)
        return {
            name: [
                r.summary.median
                for r in records
                if r.group_key == first.group_key and r.summary.median
            ]
            for name, records in done.records.items()
        }
