"""How the test device maps Android paths onto a host directory, and its tiny userland.

Sync (push, pull, stat, list) maps every absolute device path under the host root:
``/data/local/tmp/x`` is ``<root>/data/local/tmp/x``.

Shell commands run as Android runs them: adbd starts ``/system/bin/sh -c CMD``, which is mksh,
and its PATH reaches only toybox applets. Here ``base/bin/sh`` is a symlink to mksh, and PATH
is ``base/bin`` alone: that ``sh``, ``toybox`` and a symlink to it for every applet it
lists, and a ``getprop`` script (run by mksh), so no GNU coreutils, bash or dash is reachable.
The toybox is Android's build of 0.8.9 (``android_defconfig``, hashing through libcrypto; see
:mod:`tests.adbdevice.toybox`), not Debian's package. Android's ``awk`` is not toybox's at all
and is not here. The applets kzbuild's device scripts use are listed and checked in
tests/adb/test_android_userland.py.

The command text has every ``/data/local/tmp`` (the one place a non-root Android shell may
write) replaced by its host directory, and the output has that host directory replaced back,
so ``sha256sum /data/local/tmp/f`` prints ``/data/local/tmp/f``. This was chosen over a mount
namespace because it needs no privileges and no ``/data`` on the host; its limits, stated
plainly:

- only the text of the command is rewritten: a script *file* run on the device that names
  ``/data/local/tmp`` is not;
- file contents are never rewritten: a file written by a command that printed a path
  holds the host path, and pulling it shows that; a pushed symlink keeps its target as sent;
- the shell starts in the host directory of ``/`` (adbd starts in ``/``), so ``pwd`` there
  prints a host path;
- an argument that contains the host root itself would be rewritten on output; the host
  root is a fresh temp dir name that nothing else contains.
"""

from __future__ import annotations

import posixpath
import re
import shutil
import subprocess
from collections.abc import Mapping
from functools import cache
from pathlib import Path

from tests.adbdevice.selinux import denying
from tests.adbdevice.toybox import android_toybox

DEVICE_TMP = "/data/local/tmp"
DEFAULT_PROPS = {
    "ro.build.fingerprint": "kzbuild/testpad/testpad:15/KZTEST.1/1:userdebug/test-keys",
    "ro.soc.model": "SM8750",
    "ro.soc.manufacturer": "QTI",
    "ro.product.model": "testpad",
    "ro.product.name": "testpad",
    "ro.product.device": "testpad",
    "ro.product.cpu.abi": "x86_64",  # honest: the device runs this host's binaries
    "ro.build.version.sdk": "35",
}
SAFE_HOST_PATH = re.compile(r"^/[A-Za-z0-9_./-]+$")
# A device path continues with these characters; "/data/local/tmpfoo" is not mapped.
PATH_CONTINUES = rb"(?![A-Za-z0-9_.+-])"

GETPROP_SCRIPT = """#!{shell}
# getprop of the adb test device: properties are NAME=VALUE lines in {props}
props={props}
if [ "$#" -eq 0 ]; then
    while IFS='=' read -r name value; do printf '[%s]: [%s]\\n' "$name" "$value"; done < "$props"
    exit 0
fi
while IFS='=' read -r name value; do
    if [ "$name" = "$1" ]; then printf '%s\\n' "$value"; exit 0; fi
done < "$props"
printf '%s\\n' "${{2-}}"
"""


def require(program: str) -> str:
    path = shutil.which(program)
    if path is None:
        raise RuntimeError(
            f"the adb test device runs Android's userland and needs '{program}': apt-get install "
            "mksh (scripts/setup)"
        )
    return path


@cache
def toybox_applets() -> tuple[str, str, tuple[str, ...]]:
    """(mksh, toybox, the applets ``toybox`` lists)."""
    mksh, toybox = require("mksh"), str(android_toybox())
    listed = subprocess.run([toybox], check=True, capture_output=True, text=True, timeout=30).stdout
    return mksh, toybox, tuple(listed.split())


class DeviceFs:
    """The device's filesystem (``base/fs``), shell userland (``base/bin``) and properties."""

    def __init__(
        self,
        base: Path,
        props: Mapping[str, str] | None = None,
        *,
        selinux: bool = True,
        symlinks: bool = True,
    ) -> None:
        base = base.resolve()
        if not SAFE_HOST_PATH.match(str(base)):
            # The host root is pasted into shell command text; keep it free of shell syntax.
            raise ValueError(f"test device base dir must be a plain path, not {base}")
        self.root = base / "fs"
        self.bin = base / "bin"
        self.props_file = base / "build.prop"
        for folder in (self.root / DEVICE_TMP.lstrip("/"), self.bin):
            folder.mkdir(parents=True, exist_ok=True)
        self.props: dict[str, str] = dict(DEFAULT_PROPS if props is None else props)
        self.write_props()
        self.shell, toybox, applets = toybox_applets()
        for applet in ("toybox", *applets):
            (self.bin / applet).symlink_to(toybox)
        (self.bin / "sh").symlink_to(self.shell)
        getprop = self.bin / "getprop"
        getprop.write_text(GETPROP_SCRIPT.format(shell=self.shell, props=self.props_file))
        getprop.chmod(0o755)
        self._host_tmp = str(self.root) + DEVICE_TMP
        # Android's rule for adb shell: no hard links, no FIFOs (tests.adbdevice.selinux)
        denied = ("link", "mknod") * selinux + ("symlink",) * (not symlinks)
        self.shell_setup = denying(*denied) if denied else None
        self._to_host = re.compile(re.escape(DEVICE_TMP.encode()) + PATH_CONTINUES)
        self.started: list[subprocess.Popen[bytes]] = []  # shell commands that may still run

    def write_props(self) -> None:
        self.props_file.write_text(
            "".join(f"{name}={value}\n" for name, value in self.props.items())
        )

    def host_path(self, device_path: str | bytes) -> Path:
        """Where a device path lives on the host (``..`` cannot climb out of the root)."""
        text = (
            device_path.decode("utf-8", "surrogateescape")
            if isinstance(device_path, bytes)
            else device_path
        )
        relative = posixpath.normpath("/" + text).lstrip("/")
        return self.root / relative if relative not in ("", ".") else self.root

    # --- the shell ---
    def shell_argv(self, command: bytes) -> list[bytes]:
        sh = bytes(self.bin / "sh")  # mksh, started as sh like adbd starts /system/bin/sh
        if not command:
            return [sh]
        return [sh, b"-c", self._to_host.sub(self._host_tmp.encode(), command)]

    def shell_env(self) -> dict[str, str]:
        return {"PATH": str(self.bin), "HOME": str(self.root), "TMPDIR": self._host_tmp}

    def output_rewriter(self) -> OutputRewriter:
        return OutputRewriter(self._host_tmp.encode(), DEVICE_TMP.encode())


class OutputRewriter:
    """Replaces ``host`` by ``device`` in a byte stream cut into arbitrary chunks."""

    def __init__(self, host: bytes, device: bytes) -> None:
        self.host = host
        self.device = device
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        data = (self._pending + chunk).replace(self.host, self.device)
        keep = next(
            (
                k
                for k in range(min(len(self.host) - 1, len(data)), 0, -1)
                if self.host.startswith(data[-k:])
            ),
            0,
        )
        self._pending = data[len(data) - keep :]
        return data[: len(data) - keep]

    def flush(self) -> bytes:
        rest, self._pending = self._pending, b""
        return rest
