"""Adapters: the one process runner, git, files, locks, YAML and settings. They know no
capability."""
