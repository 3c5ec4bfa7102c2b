"""A test device that speaks the real adb wire protocol over TCP, for the real ``adb`` client.

Not part of kzbuild: test support. ``adb connect 127.0.0.1:PORT`` reaches it through a
private adb server; it offers ``shell,v2`` (stdout, stderr and the real exit code),
old-style ``shell:``/``exec:``, and ``sync:`` (STAT/STA2/LST2, LIST/LIS2, SEND, RECV) for
push, pull and stat. Its shell is Android's: ``sh -c`` is mksh, and PATH holds only toybox's
applets (toybox 0.8.9 built with Android's config and libcrypto, :mod:`tests.adbdevice.toybox`)
and a ``getprop`` (see :mod:`tests.adbdevice.fs`); the binaries it runs are this machine's:
deploy a host build to it.

Fixtures (``tests.adbdevice.fixtures``, registered as a plugin by tests/conftest.py)::

    def test_deploy(adb_device):
        device = adb_device.device()  # kzbuild Device: transport adb, serial 127.0.0.1:PORT,
                                      # root /data/local/tmp/kz-engine (name=, root=, env= ... to
                                      change)
        # same as Device(name="testpad", transport="adb", serial=adb_device.serial,
        #                root="/data/local/tmp/kz-engine")
        transport = kzbuild.device.registry.connect(device)   # adb connect + state check
        ...
        adb_device.host_path("/data/local/tmp/kz-engine/current")  # the same dir on the host

- ``adb_server`` (session): ``PrivateAdbServer`` — ``.port``, ``.adb(*args)`` runs the adb
  client against it; stopped by its pid at the end of the session.
- ``adb_env`` (function): sets ``ANDROID_ADB_SERVER_PORT`` for the test (monkeypatch), so
  every adb client, kzbuild's too, uses the private server; the fixtures below include it.
- ``adb_device`` (function): an online ``AdbTestDevice``.
  ``make_adb_device(mode="unauthorized"|"offline", props={...})`` makes more.

The device's filesystem: device path ``P`` is host path ``adb_device.host_path(P)``
(``<tmp>/adbdeviceN/fs/P``); see :mod:`tests.adbdevice.fs` for how shell commands see
``/data/local/tmp`` and the limits of that mapping.

Benchmarks run a device in a process of its own (``tests.adbdevice.process.DeviceProcess``), so
its work does not wait on the measuring process's GIL.

Hooks on an ``AdbTestDevice``:

- ``drop_send_after(nbytes)``: the next push (one ``adb push``, however many files it
  sends) loses the TCP connection after ``nbytes`` bytes of file data (the partial file is
  removed, as adbd does), or the next shell command fed ``nbytes`` bytes of stdin (shell
  protocol v2) loses it there; the adb server reconnects.
- ``faults.send_delay = seconds``: the device stalls after each 64 KiB chunk of a push.
- ``disconnect_all()``: drop every connection now (a pulled cable).
- ``mode = "unauthorized" | "offline"`` for new connections (or ``make_adb_device(mode=...)``).
- ``set_prop(name, value)``: what ``getprop`` answers (defaults: ``ro.build.fingerprint``,
  ``ro.soc.model`` = SM8750, ... in ``fs.DEFAULT_PROPS``).
"""

from tests.adbdevice.device import AdbTestDevice
from tests.adbdevice.server import PrivateAdbServer

__all__ = ["AdbTestDevice", "PrivateAdbServer"]
