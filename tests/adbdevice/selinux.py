"""Android's SELinux rule for ``adb shell``, on the test device: no hard links.

AOSP's policy (system/sepolicy, public/shell.te) says ``neverallow shell file_type:file link``:
a process ``adb shell`` starts may not hard-link any file, /data/local/tmp included, and CTS
holds every certified device to it (``ln a b`` there says "Permission denied"). A host has no
such rule, so the test device puts it on its shell with a seccomp filter that makes ``link``
and ``linkat`` fail with EACCES, as SELinux does; the filter passes to everything the shell
starts. adbd's own writes (push) are not the shell's and stay allowed.

The same policy grants shell in /data/local/tmp (``shell_data_file``) only dirs, files and
symlinks: no FIFO (``mkfifo`` makes one with mknod), so the rule denies ``mknod`` and
``mknodat`` too. A device can also refuse symlinks (as a FUSE-backed /sdcard does), for the
checks that must notice such a device root.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import platform
import struct
from collections.abc import Callable

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
BPF_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS: load a word of struct seccomp_data
BPF_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
BPF_RET_K = 0x06  # BPF_RET | BPF_K
ARCH_OFFSET, NR_OFFSET = 4, 0  # in struct seccomp_data
# the audit arch, and the numbers of the calls a rule denies (aarch64 has only the *at calls)
CALLS = {
    "x86_64": (0xC000003E, {"link": (86, 265), "symlink": (88, 266), "mknod": (133, 259)}),
    "aarch64": (0xC00000B7, {"link": (37,), "symlink": (36,), "mknod": (33,)}),
}


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def denying(*kinds: str) -> Callable[[], None]:
    """A ``preexec_fn`` that makes the calls of ``kinds`` ("link": hard links, "symlink") fail
    with EACCES for the child and all it starts. Everything is prepared here, before the fork: in
    the child it only makes two system calls."""
    machine = platform.machine()
    if machine not in CALLS:
        raise RuntimeError(f"the test device's SELinux rule has no seccomp filter for {machine}")
    arch, by_kind = CALLS[machine]
    numbers = [number for kind in kinds for number in by_kind[kind]]
    deny = SECCOMP_RET_ERRNO | errno.EACCES
    # arch check; load the call's number; one jump per denied call to the last-but-one (deny)
    program = [(BPF_LD_W_ABS, 0, 0, ARCH_OFFSET), (BPF_JEQ_K, 1, 0, arch)]
    program.append((BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW))  # another arch: not ours to judge
    program.append((BPF_LD_W_ABS, 0, 0, NR_OFFSET))
    for left, number in zip(range(len(numbers), 0, -1), numbers, strict=True):
        program.append((BPF_JEQ_K, left, 0, number))
    program += [(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW), (BPF_RET_K, 0, 0, deny)]
    code = b"".join(struct.pack("=HBBI", *step) for step in program)
    fprog = SockFprog(len(program), code)
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    keep = (code, fprog)  # alive until the fork

    def install() -> None:
        if prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) or prctl(
            PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(keep[1]), 0, 0
        ):
            raise OSError(ctypes.get_errno(), "the test device's seccomp filter was refused")

    return install
