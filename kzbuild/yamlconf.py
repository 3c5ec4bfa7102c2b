"""YAML loading that remembers line numbers, and the small checks every config file needs.

Recipes, devices and toolchain files are validated on load; every error names the file,
the line and the key. Mappings load as :class:`Mapping` (a dict that knows where each key
stood), sequences as :class:`Sequence`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from kzbuild.errors import ConfigError


class Mapping(dict[str, Any]):
    """A YAML mapping that knows its file and the line of itself and of each key."""

    path: Path
    line: int
    key_lines: dict[str, int]

    def line_of(self, key: str) -> int:
        return self.key_lines.get(key, self.line)

    def error(self, key: str | None, message: str, *, hint: str | None = None) -> ConfigError:
        line = self.line_of(key) if key is not None else self.line
        return ConfigError(message, path=self.path, line=line, key=key, hint=hint)

    def check_keys(self, allowed: Iterable[str], *, required: Iterable[str] = (), context: str = "") -> None:
        allowed = list(allowed)
        for key in self:
            if key not in allowed:
                close = difflib.get_close_matches(str(key), allowed, n=1)
                hint = f"did you mean '{close[0]}'?" if close else f"allowed keys: {', '.join(allowed)}"
                raise self.error(str(key), f"unknown key{' in ' + context if context else ''}", hint=hint)
        for key in required:
            if key not in self:
                raise self.error(None, f"missing required key '{key}'{' in ' + context if context else ''}")

    def get_str(self, key: str, default: str | None = None) -> str | None:
        value = self.get(key, default)
        if value is not None and not isinstance(value, (str, int, float)):
            raise self.error(key, "must be a string")
        return None if value is None else str(value)

    def get_mapping(self, key: str) -> Mapping:
        value = self.get(key)
        if value is None:
            empty = Mapping()
            empty.path, empty.line, empty.key_lines = self.path, self.line_of(key), {}
            return empty
        if not isinstance(value, Mapping):
            raise self.error(key, "must be a mapping")
        return value

    def get_options(self, key: str) -> tuple[tuple[str, str], ...]:
        """A mapping of scalars as (name, value) strings, booleans as cmake's ON/OFF."""
        mapping = self.get_mapping(key)
        options = []
        for name, value in mapping.items():
            if isinstance(value, bool):
                value = "ON" if value else "OFF"
            if not isinstance(value, (str, int, float)):
                raise mapping.error(name, "values are scalars (strings, numbers, booleans)")
            options.append((name, str(value)))
        return tuple(options)

    def get_list(self, key: str) -> Sequence:
        value = self.get(key)
        if value is None:
            empty = Sequence()
            empty.path, empty.line, empty.item_lines = self.path, self.line_of(key), []
            return empty
        if not isinstance(value, Sequence):
            raise self.error(key, "must be a list")
        return value


class Sequence(list[Any]):
    """A YAML sequence that knows its file and the line of each item."""

    path: Path
    line: int
    item_lines: list[int]

    def error(self, index: int, message: str, *, key: str | None = None) -> ConfigError:
        return ConfigError(message, path=self.path, line=self.item_lines[index], key=key)


def load(path: Path) -> Mapping:
    """Load a YAML file whose top level is a mapping."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read file: {exc.strerror}", path=path) from exc
    return loads(text, path)


def loads(text: str, path: Path) -> Mapping:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise ConfigError(f"invalid YAML: {exc.problem or exc}", path=path, line=line) from exc
    finally:
        loader.dispose()
    if node is None:
        raise ConfigError("file is empty", path=path, line=1)
    result = _convert(node, path, loader)
    if not isinstance(result, Mapping):
        raise ConfigError("top level must be a mapping", path=path, line=node.start_mark.line + 1)
    return result


def _convert(node: yaml.Node, path: Path, loader: yaml.SafeLoader) -> Any:
    if isinstance(node, yaml.MappingNode):
        mapping = Mapping()
        mapping.path, mapping.line, mapping.key_lines = path, node.start_mark.line + 1, {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)):
                raise ConfigError("keys must be scalars", path=path, line=key_node.start_mark.line + 1)
            key = str(key)
            if key in mapping:
                raise ConfigError("duplicate key", path=path, line=key_node.start_mark.line + 1, key=key)
            mapping.key_lines[key] = key_node.start_mark.line + 1
            mapping[key] = _convert(value_node, path, loader)
        return mapping
    if isinstance(node, yaml.SequenceNode):
        seq = Sequence()
        seq.path, seq.line = path, node.start_mark.line + 1
        seq.item_lines = [item.start_mark.line + 1 for item in node.value]
        seq.extend(_convert(item, path, loader) for item in node.value)
        return seq
    return loader.construct_object(node, deep=True)
