"""A device: where built artifacts are deployed and tools run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TransportKind = Literal["adb", "ssh", "local"]
DEFAULT_ROOT = "/data/local/tmp/kz-engine"


@dataclass(frozen=True)
class Device:
    name: str
    transport: TransportKind
    root: str  # staging root on the device: releases/<build-id>/, current -> releases/<id>
    serial: str | None = None  # adb
    server: str | None = (
        None  # adb: HOST:PORT of the adb server that serves it (adb -H -P); None: this machine's
    )
    host: str | None = None  # ssh
    port: int = 22
    user: str | None = None
    key: str | None = None  # path of a private key; None: agent / default keys
    env: tuple[tuple[str, str], ...] = ()  # default env; "{current}" expands to ROOT/current
    runner_prefix: tuple[str, ...] = ()  # e.g. ("qemu-aarch64", "-L", "/usr/aarch64-linux-gnu")
    description: str = ""

    @property
    def address(self) -> str:
        if self.transport == "adb":
            return f"adb:{self.serial}" + (f"@{self.server}" if self.server else "")
        if self.transport == "ssh":
            user = f"{self.user}@" if self.user else ""
            host = (
                f"[{self.host}]" if ":" in (self.host or "") else self.host
            )  # IPv6, as in the spec
            return f"ssh://{user}{host}:{self.port}"
        return f"local:{self.root}"
