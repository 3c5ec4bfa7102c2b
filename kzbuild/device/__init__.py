"""Devices: transports (local, ssh, adb), the release store, chunks, the lock, deploy and run."""
