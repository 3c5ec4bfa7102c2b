"""What `kzbuild ci` did: one step per stage (sync, patches, build per target) and the report."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Status = str  # ok | failed | skipped


@dataclass(frozen=True)
class CiStep:
    name: str  # sync | patches | build:<target>
    status: Status
    detail: str
    seconds: float = 0.0
    exit_code: int = 0
    data: Mapping[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {
            "step": self.name,
            "status": self.status,
            "detail": self.detail,
            "seconds": round(self.seconds, 2),
            "exit_code": self.exit_code,
            **self.data,
        }


@dataclass(frozen=True)
class CiReport:
    recipe: str
    steps: tuple[CiStep, ...]

    @property
    def ok(self) -> bool:
        return all(s.status != "failed" for s in self.steps)

    @property
    def exit_code(self) -> int:
        """0, or the exit code of the first failed step (so scripts can tell a build failure from a
        missing SDK)."""
        return next((s.exit_code for s in self.steps if s.status == "failed"), 0)

    def to_dict(self) -> dict[str, object]:
        return {
            "recipe": self.recipe,
            "ok": self.ok,
            "exit_code": self.exit_code,
            "steps": [s.to_dict() for s in self.steps],
        }

    def to_markdown(self) -> str:
        icon = {"ok": "✅", "failed": "❌", "skipped": "⏭️"}
        lines = [
            f"### kzbuild ci: {self.recipe} {'passed' if self.ok else 'FAILED'}",
            "",
            "| step | status | detail | seconds |",
            "|---|---|---|---|",
        ]
        for step in self.steps:
            detail = step.detail.replace("|", "\\|").replace("\n", "<br>")
            lines.append(
                f"| {step.name} | {icon.get(step.status, '')} {step.status} | {detail} | "
                f"{step.seconds:.1f} |"
            )
        return "\n".join(lines) + "\n"
