"""What ``kzbuild doctor`` found: per target its toolchains, and whether the device answers."""

from __future__ import annotations

from dataclasses import dataclass

from kzbuild.model.toolchain import Found


@dataclass(frozen=True)
class TargetCheck:
    target: str
    required: tuple[Found, ...]
    optional: tuple[Found, ...]

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.required)

    def to_dict(self) -> dict[str, object]:
        return {
            "target": self.target,
            "ok": self.ok,
            "toolchains": [f.to_dict() for f in self.required],
            "optional": [f.to_dict() for f in self.optional],
        }


@dataclass(frozen=True)
class DeviceCheck:
    """Whether the device answers from this machine (adb state, ssh login with the host-key check,
    the local runner)."""

    device: str
    transport: str
    ok: bool
    detail: str
    hint: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "device": self.device,
            "transport": self.transport,
            "ok": self.ok,
            "detail": self.detail,
            "hint": self.hint,
        }


@dataclass(frozen=True)
class DoctorReport:
    targets: tuple[TargetCheck, ...]
    device: DeviceCheck | None = None

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.targets) and (self.device is None or self.device.ok)

    def to_dict(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "targets": [t.to_dict() for t in self.targets],
            "device": self.device.to_dict() if self.device else None,
        }
