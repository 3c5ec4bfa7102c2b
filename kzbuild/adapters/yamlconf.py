"""YAML loading that remembers line numbers, and the small checks every config file needs.

Recipes, devices and toolchain files are validated on load; every error names the file,
the line and the key. Mappings load as :class:`Mapping` (a dict that knows where each key
stood), sequences as :class:`Sequence`.

A document that parsed is remembered by the sha256 of its bytes (:class:`ParsedDocuments`,
switched on by :func:`remember_parsed_in`), so a command whose config files did not change
neither imports PyYAML (~12 ms) nor parses (~0.5 ms a file); PyYAML is imported only where a
document is parsed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kzbuild.adapters.files import TextCache
from kzbuild.errors import ConfigError
from kzbuild.model.urls import redact

if TYPE_CHECKING:
    import yaml

NAME_MAX = 255  # bytes in one file name, on every Linux file system


def path_problem(text: str) -> str | None:
    """What makes ``text`` a path no file can have (the OS would raise instead of answering), or
    None."""
    if "\0" in text:
        return "a path cannot hold a NUL byte"
    if any(len(part.encode("utf-8", "surrogatepass")) > NAME_MAX for part in text.split("/")):
        return f"a name in the path is longer than {NAME_MAX} bytes"
    return None


def is_scalar_text(value: object) -> bool:
    """A value that stands for text: a string or a number (never a boolean, null or collection)."""
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


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

    def check_keys(
        self, allowed: Iterable[str], *, required: Iterable[str] = (), context: str = ""
    ) -> None:
        allowed = list(allowed)
        for key in self:
            if key not in allowed:
                import difflib  # only for this hint: ~2 ms of every start otherwise

                close = difflib.get_close_matches(str(key), allowed, n=1)
                hint = (
                    f"did you mean '{close[0]}'?"
                    if close
                    else f"allowed keys: {', '.join(allowed)}"
                )
                raise self.error(
                    str(key), f"unknown key{' in ' + context if context else ''}", hint=hint
                )
        for key in required:
            if key not in self:
                raise self.error(
                    None, f"missing required key '{key}'{' in ' + context if context else ''}"
                )

    def get_str(self, key: str, default: str | None = None) -> str | None:
        """The value as text; a key set to null counts as absent (``default``)."""
        value = self.get(key)
        if value is None:
            value = default
        if value is not None and not isinstance(value, (str, int, float)):
            raise self.error(key, "must be a string")
        return None if value is None else str(value)

    def get_path(self, key: str, default: str | None = None) -> str | None:
        """A string that names a file or folder (checked so that the OS can be asked about it)."""
        value = self.get_str(key, default)
        problem = path_problem(value) if value is not None else None
        if problem:
            raise self.error(key, problem)
        return value

    def get_path_list(self, key: str) -> tuple[str, ...]:
        paths = self.get_str_list(key)
        for index, value in enumerate(paths):
            problem = path_problem(value)
            if problem:
                raise self.get_list(key).error(index, problem, key=key)
        return paths

    def get_str_list(self, key: str) -> tuple[str, ...]:
        """A list of strings (numbers are taken as their text); nested lists, mappings, null and
        booleans are errors."""
        items = self.get_list(key)
        for index, item in enumerate(items):
            if not is_scalar_text(item):
                raise items.error(index, "must be a string", key=key)
        return tuple(str(item) for item in items)

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


# Far above any real config file, far below what an alias bomb expands to ("billion laughs").
MAX_NODES = 100_000


def read_bytes(path: Path) -> bytes:
    """A config file's bytes; one that cannot be read is a ConfigError naming it."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read file: {exc.strerror}", path=path) from exc


def utf8_error(data: bytes, path: Path) -> ConfigError | None:
    """None when ``data`` is UTF-8; else the error naming the file, the line and the first bad
    byte."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        return ConfigError(
            f"not valid UTF-8 (byte 0x{data[exc.start]:02x}); save the file as UTF-8",
            path=path,
            line=line,
        )
    return None


def read_text(path: Path) -> str:
    """A config file's text. A file that cannot be read or is not UTF-8 is a ConfigError naming it
    (and the line)."""
    return text_of(read_bytes(path), path)


def text_of(data: bytes, path: Path) -> str:
    """``data`` read from ``path`` as UTF-8 text, or the ConfigError naming the line of the first
    bad byte."""
    error = utf8_error(data, path)
    if error is not None:
        raise error
    return data.decode("utf-8")


def load(path: Path) -> Mapping:
    """Load a YAML file whose top level is a mapping."""
    data = read_bytes(path)
    remembered = _remembered
    digest = hashlib.sha256(data).hexdigest() if remembered is not None else ""
    if remembered is not None and (doc := remembered.get(digest, path)) is not None:
        return doc
    doc = loads(text_of(data, path), path)
    if remembered is not None:
        remembered.put(digest, doc)
    return doc


MAX_PARSED = 256  # documents kept; each edit of a config file adds one


class ParsedDocuments:
    """Parsed documents by the sha256 of the file's bytes: a changed file is parsed again, and an
    entry only ever stands for the bytes it was parsed from (a TextCache: damage means parsing
    again)."""

    def __init__(self, path: Path) -> None:
        self.texts = TextCache(path, limit=MAX_PARSED)

    def get(self, digest: str, path: Path) -> Mapping | None:
        text = self.texts.get(digest)
        if text is None:
            return None
        try:
            doc = _decode(json.loads(text), path)
        except (ValueError, TypeError, KeyError, IndexError, RecursionError):
            return None
        return doc if isinstance(doc, Mapping) else None

    def put(self, digest: str, doc: Mapping) -> None:
        """Remember ``doc``, unless it holds a credential (a URL with a password, such as the remote
        cache's in ``.kz/config.yaml``): those are parsed every time, and an entry an older kzbuild
        kept with one is dropped here."""
        try:
            text = json.dumps(_encode(doc))
        except (TypeError, ValueError, RecursionError):
            return  # a value JSON cannot hold (a date, binary data): this file is parsed every time
        self.texts.discard(_holds_credential)
        if not _holds_credential(text):
            self.texts.put(digest, text)


def _holds_credential(text: str) -> bool:
    return redact(text) != text


_remembered: ParsedDocuments | None = None


def remember_parsed_in(path: Path | None) -> None:
    """Keep parsed documents in the file ``path`` from now on (None: parse every time)."""
    global _remembered
    _remembered = ParsedDocuments(path) if path is not None else None


def _encode(value: Any) -> Any:
    """A parsed value as JSON: [m, line, [[key, key line, value]...]], [s, line, item lines,
    [values]] or [v, scalar]."""
    if isinstance(value, Mapping):
        return [
            "m",
            value.line,
            [[key, value.key_lines[key], _encode(item)] for key, item in value.items()],
        ]
    if isinstance(value, Sequence):
        return ["s", value.line, list(value.item_lines), [_encode(item) for item in value]]
    if value is None or isinstance(value, (str, bool, int, float)):
        return ["v", value]
    raise TypeError(f"cannot keep a {type(value).__name__}")


def _line(value: Any) -> int:
    if type(value) is not int or value < 1:
        raise ValueError("a line number")
    return value


def _decode(tree: Any, path: Path) -> Any:
    """_encode() undone, checking every part (a stored file may be damaged)."""
    kind = tree[0]
    if (
        kind == "v"
        and len(tree) == 2
        and (tree[1] is None or isinstance(tree[1], (str, bool, int, float)))
    ):
        return tree[1]
    if kind == "m" and len(tree) == 3:
        mapping = Mapping()
        mapping.path, mapping.line, mapping.key_lines = path, _line(tree[1]), {}
        for key, key_line, item in tree[2]:
            if not isinstance(key, str) or key in mapping:
                raise ValueError("a key")
            mapping.key_lines[key] = _line(key_line)
            mapping[key] = _decode(item, path)
        return mapping
    if kind == "s" and len(tree) == 4 and len(tree[2]) == len(tree[3]):
        seq = Sequence()
        seq.path, seq.line, seq.item_lines = path, _line(tree[1]), [_line(line) for line in tree[2]]
        seq.extend(_decode(item, path) for item in tree[3])
        return seq
    raise ValueError("not a stored value")


def _loader_class() -> type[yaml.SafeLoader]:
    """libyaml's parser when PyYAML has it: the pure-Python one takes ~10 ms a file, and a build
    reads a dozen."""
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def loads(text: str, path: Path) -> Mapping:
    import yaml

    try:
        loader = _loader_class()(text)  # checks the characters right away
        try:
            node = loader.get_single_node()
            result = _Converter(path, loader).convert(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise ConfigError(f"invalid YAML: {exc.problem or exc}", path=path, line=line) from exc
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise ConfigError(
            f"invalid YAML: control character #x{exc.character:02x} is not allowed",
            path=path,
            line=line,
        ) from exc
    except RecursionError:
        raise ConfigError("invalid YAML: nested too deeply", path=path) from None
    if node is None:
        raise ConfigError("file is empty", path=path, line=1)
    if not isinstance(result, Mapping):
        raise ConfigError("top level must be a mapping", path=path, line=node.start_mark.line + 1)
    return result


class _Converter:
    """Turns composed YAML nodes into Mapping/Sequence/scalars, refusing alias loops and alias
    bombs."""

    def __init__(self, path: Path, loader: yaml.SafeLoader) -> None:
        self.path = path
        self.loader = loader
        self.open_nodes: set[int] = (
            set()
        )  # collections being converted: an alias to one of them is a loop
        self.converted = 0

    def error(self, node: yaml.Node, message: str, key: str | None = None) -> ConfigError:
        return ConfigError(message, path=self.path, line=node.start_mark.line + 1, key=key)

    def convert(self, node: yaml.Node) -> Any:
        import yaml

        self.converted += 1
        if self.converted > MAX_NODES:
            raise self.error(
                node, f"more than {MAX_NODES} values: aliases (*name) expand to too much"
            )
        if not isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
            return self.scalar(node)
        if id(node) in self.open_nodes:
            raise self.error(
                node, "an alias (*name) refers to a value that contains it: an endless loop"
            )
        self.open_nodes.add(id(node))
        try:
            return self.mapping(node) if isinstance(node, yaml.MappingNode) else self.sequence(node)
        finally:
            self.open_nodes.discard(id(node))

    def scalar(self, node: yaml.Node) -> Any:
        try:
            return self.loader.construct_object(node, deep=True)
        except ValueError as exc:  # e.g. an integer with more digits than Python converts
            raise self.error(node, f"bad value: {exc}") from None

    def mapping(self, node: yaml.MappingNode) -> Mapping:
        import yaml

        mapping = Mapping()
        mapping.path, mapping.line, mapping.key_lines = self.path, node.start_mark.line + 1, {}
        for key_node, value_node in node.value:
            key = self.scalar(key_node) if isinstance(key_node, yaml.ScalarNode) else None
            if key is None or not isinstance(key, (str, int, float, bool)):
                raise self.error(key_node, "keys must be strings, numbers or booleans")
            key = str(key)
            if key in mapping:
                raise self.error(key_node, "duplicate key", key=key)
            mapping.key_lines[key] = key_node.start_mark.line + 1
            mapping[key] = self.convert(value_node)
        return mapping

    def sequence(self, node: yaml.SequenceNode) -> Sequence:
        seq = Sequence()
        seq.path, seq.line = self.path, node.start_mark.line + 1
        seq.item_lines = [item.start_mark.line + 1 for item in node.value]
        seq.extend(self.convert(item) for item in node.value)
        return seq
