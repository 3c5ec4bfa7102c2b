"""A patch's device checks (``Kz-Device-Test`` trailers) and their results on a device."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from kzbuild.model.jsonfields import Fields
from kzbuild.model.result import FIELD_NAMES as RESULT_FIELDS
from kzbuild.model.result import BuildInfo, DeviceInfo, build_info, device_info


@dataclass(frozen=True)
class DeviceTest:
    """``Kz-Device-Test: test-backend-ops -o GATED_DELTA_NET -b HTP0``: a tool of the release and
    its arguments."""

    patch: str  # series name
    tool: str
    args: tuple[str, ...]
    line: int  # of the trailer in the patch file

    @property
    def command(self) -> str:
        return " ".join((self.tool, *self.args))


@dataclass(frozen=True)
class DeviceTestResult:
    """One device check of a patch, run on a device (``kzbuild check RECIPE --device D``), with its
    provenance."""

    run_id: str
    host_time: str
    recipe: str
    patch: str
    command: str  # as the trailer gives it
    build: BuildInfo
    device: DeviceInfo
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    returncode: int = 0
    passed: bool = True
    logs: str = ""  # the folder with its stdout and stderr
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["argv"] = list(self.argv)
        return data

    @classmethod
    def from_dict(cls, data: object, where: str = "device test") -> DeviceTestResult:
        fields = Fields(data, where)
        fields.check_known(FIELD_NAMES)
        build, device = fields.object("build"), fields.object("device")
        build.check_known(RESULT_FIELDS[BuildInfo])
        device.check_known(RESULT_FIELDS[DeviceInfo])
        passed = fields.data.get("passed")
        if not isinstance(passed, bool):
            raise fields.error("passed", "true or false")
        code = fields.data.get("returncode")
        if isinstance(code, bool) or not isinstance(code, int):
            raise fields.error("returncode", "an integer")
        return cls(
            run_id=fields.text("run_id"),
            host_time=fields.text("host_time"),
            recipe=fields.text("recipe"),
            patch=fields.text("patch"),
            command=fields.text("command"),
            build=build_info(build),
            device=device_info(device),
            argv=fields.texts("argv"),
            env=fields.text_map("env", {}),
            returncode=code,
            passed=passed,
            logs=fields.text("logs", ""),
            seconds=float(fields.number("seconds", 0.0, zero_ok=True)),
        )


FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(DeviceTestResult))
