"""Devices: one Transport interface over adb, ssh and the local machine."""
