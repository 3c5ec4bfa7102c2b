"""The adb test device's toybox: Android's build of it, from Debian's source package.

Debian's ``toybox`` package is built without libcrypto, so its ``sha256sum`` and ``sha1sum`` run
toybox's portable C code; Android builds toybox with ``android_defconfig``, which sets
``CONFIG_TOYBOX_LIBCRYPTO=y`` (BoringSSL there, with the CPU's SHA instructions). A test device
that hashes several times slower than a phone overstates what hashing costs a deploy, so the
device runs toybox 0.8.9 from Debian's ``.orig`` tarball (sha256 as in bookworm's Sources index),
configured with ``make android_defconfig`` and linked against this machine's OpenSSL (libcrypto),
zlib and libselinux. That config also brings the applets Debian's build lacks and Android has
(``tr``, ``dd``, ``diff``, ``expr``, ``gzip``, ``getopt``, ...) and leaves out the ones Android
does not ship (``wget``, ``su``, ``sha3sum``, ...).

    python -m tests.adbdevice.toybox   # scripts/setup runs it; prints the binary's path

It builds once (about 15 s on two cores) into ``$KZ_TEST_CACHE/toybox/<version>-<key>/``, where
the key hashes the tarball's sha256 and the build recipe, and does nothing when that binary is
there. The tests never download: without the binary the device refuses to start and says how to
build it (:func:`android_toybox`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

from tests.cachedir import persistent_cache_root

VERSION = "0.8.9"
TARBALL_URL = f"http://deb.debian.org/debian/pool/main/t/toybox/toybox_{VERSION}+dfsg.orig.tar.xz"
TARBALL_SHA256 = "16fb5967531e88ca33b8c9142376987617ebe52e34e2b3f3a779603674b7d07c"
CONFIG_TARGET = "android_defconfig"
# What android_defconfig must have set for the build to be Android's: hashing through libcrypto,
# gzip through zlib, SELinux (its applets and -Z options).
REQUIRED_CONFIG = ("CONFIG_TOYBOX_LIBCRYPTO=y", "CONFIG_TOYBOX_LIBZ=y", "CONFIG_TOYBOX_SELINUX=y")
BUILD_TIMEOUT = 900


class ToyboxMissing(RuntimeError):
    """Android's toybox has not been built on this machine."""


def build_key() -> str:
    """Names the build: the source tarball and the config recipe (a change to either rebuilds)."""
    recipe = "\n".join((TARBALL_SHA256, CONFIG_TARGET, *REQUIRED_CONFIG))
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def build_dir() -> Path:
    cache = persistent_cache_root()
    return cache / "toybox" / f"{VERSION}-{build_key()}"


def android_toybox() -> Path:
    """The built binary, or :class:`ToyboxMissing` saying how to build it (no fallback)."""
    binary = build_dir() / "toybox"
    if not os.access(binary, os.X_OK):
        raise ToyboxMissing(
            f"the adb test device runs Android's toybox build and {binary} is missing: run "
            "scripts/setup (or python -m tests.adbdevice.toybox) to build it"
        )
    return binary


def download(target: Path) -> None:
    """The tarball, checked against its sha256 before anything unpacks it."""
    digest = hashlib.sha256()
    with urllib.request.urlopen(TARBALL_URL, timeout=60) as response, target.open("wb") as out:
        while block := response.read(1 << 20):
            digest.update(block)
            out.write(block)
    if digest.hexdigest() != TARBALL_SHA256:
        raise RuntimeError(
            f"{TARBALL_URL} has sha256 {digest.hexdigest()}, not {TARBALL_SHA256}: not building it"
        )


def build(work: Path) -> Path:
    """Download, check, configure and build toybox in ``work``; return the binary."""
    tarball = work / "toybox.tar.xz"
    download(tarball)
    with tarfile.open(tarball) as archive:
        archive.extractall(work, filter="data")
    source = work / f"toybox-{VERSION}"
    env = {**os.environ, "CPUS": str(os.cpu_count() or 1)}
    for target in (CONFIG_TARGET, "toybox"):
        done = subprocess.run(
            ["make", target],
            cwd=source,
            env=env,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"toybox: make {target} failed:\n{done.stdout}{done.stderr}")
        if target == CONFIG_TARGET:
            config = (source / ".config").read_text().splitlines()
            unset = [line for line in REQUIRED_CONFIG if line not in config]
            if unset:
                raise RuntimeError(f"toybox: {CONFIG_TARGET} did not set {', '.join(unset)}")
    return source


def install() -> Path:
    """Build into :func:`build_dir` unless it is there; the dir appears whole or not at all."""
    final = build_dir()
    if os.access(final / "toybox", os.X_OK):
        return final / "toybox"
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=".build-") as tmp:
        source = build(Path(tmp))
        staged = Path(tmp) / "out"
        staged.mkdir()
        shutil.copy2(source / "toybox", staged / "toybox")
        shutil.copy2(source / ".config", staged / "config")  # what it was built with
        try:
            staged.rename(final)
        except OSError:
            if not os.access(final / "toybox", os.X_OK):  # not a concurrent build that won
                raise
    return final / "toybox"


def main() -> int:
    try:
        print(install())
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as error:
        print(f"toybox: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
