"""Find and verify toolchains described by ``toolchains/*.yaml``.

Each file says where a toolchain may be (environment variables, a configured path, search
globs, programs on PATH) and how its version is proven (a file such as the NDK's
``source.properties``, a folder name, or a program's ``--version``). Detection reads only
those files and runs only those ``--version`` commands, so tests can build directory layouts
with just the files detection reads.

Configured paths live in ``<work>/toolchains.yaml`` (git-ignored), one ``NAME: PATH`` per
line; they are tried before the environment.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from kzbuild.adapters import proc, yamlconf
from kzbuild.adapters.files import TextCache
from kzbuild.adapters.settings import Settings
from kzbuild.errors import CommandFailed, ConfigError, NotAvailableHere
from kzbuild.model.toolchain import (
    DirectorySpec,
    Found,
    ImageSpec,
    PartSpec,
    ProbeSpec,
    ProgramSpec,
    ToolchainSpec,
    VersionRule,
    template_fields,
)

log = logging.getLogger(__name__)

TOOLCHAIN_KEYS = (
    "description",
    "label",
    "release",
    "provides",
    "directory",
    "version",
    "parts",
    "programs",
    "probes",
    "image",
    "cmake",
    "env",
    "runner",
)
VERSION_KEYS = ("file", "dirname", "args", "regex", "expect", "minimum")
PROBE_TIMEOUT = 20.0
ENV_REF = re.compile(r"\$(\w+)|\$\{(\w+)\}")


def toolchains_dir(settings: Settings) -> Path:
    return settings.project / "toolchains"


def configured_paths_file(settings: Settings) -> Path:
    return settings.work / "toolchains.yaml"


# --- loading ---------------------------------------------------------------------------


def load_toolchains(folder: Path) -> dict[str, ToolchainSpec]:
    """Every ``*.yaml`` in ``folder``, by file stem."""
    specs = {}
    for path in sorted(folder.glob("*.yaml")):
        specs[path.stem] = parse_toolchain(yamlconf.load(path), name=path.stem)
    return specs


def parse_toolchain(doc: yamlconf.Mapping, *, name: str) -> ToolchainSpec:
    doc.check_keys(TOOLCHAIN_KEYS, required=("label", "provides"), context="toolchain")
    directory = _parse_directory(doc.get_mapping("directory")) if "directory" in doc else None
    version = None
    if "version" in doc:
        if directory is None:
            raise doc.error(
                "version",
                "a top-level version needs a directory; put a program's version under programs",
            )
        version = _parse_version(doc.get_mapping("version"), default_source=None)
    programs = tuple(
        _parse_program(key, value, doc.get_mapping("programs"))
        for key, value in doc.get_mapping("programs").items()
    )
    parts = tuple(
        _parse_part(key, value, doc.get_mapping("parts"))
        for key, value in doc.get_mapping("parts").items()
    )
    if parts and directory is None:
        raise doc.error("parts", "parts live inside a directory toolchain")
    program_keys = {p.key for p in programs}
    probes = []
    entries = doc.get_list("probes")
    for index, entry in enumerate(entries):
        if not isinstance(entry, yamlconf.Mapping):
            raise entries.error(
                index, "a probe is a mapping with what, program and args", key="probes"
            )
        entry.check_keys(
            ("what", "program", "args"), required=("what", "program", "args"), context="probe"
        )
        program = entry.get_str("program") or ""
        if program not in program_keys:
            raise entry.error(
                "program",
                f"'{program}' is not one of this toolchain's programs "
                f"({', '.join(sorted(program_keys)) or 'none'})",
            )
        probes.append(
            ProbeSpec(
                what=entry.get_str("what") or "", program=program, args=entry.get_str_list("args")
            )
        )
    image = _parse_image(doc.get_mapping("image")) if "image" in doc else None
    provides = doc.get_str_list("provides")
    if not provides:
        raise doc.error("provides", "name at least one role, e.g. [compiler]")
    spec = ToolchainSpec(
        name=name,
        path=doc.path,
        description=doc.get_str("description", "") or "",
        label=doc.get_str("label") or name,
        release=doc.get_str("release") or "",
        provides=provides,
        directory=directory,
        version=version,
        parts=parts,
        programs=programs,
        probes=tuple(probes),
        image=image,
        cmake=doc.get_options("cmake"),
        env=doc.get_options("env"),
        runner=doc.get_str_list("runner"),
    )
    known = spec.template_names()
    for key in ("cmake", "env"):
        section = doc.get_mapping(key)
        for option, template in section.items():
            _check_template(section, option, str(template), known)
    for template in spec.runner:
        _check_template(doc, "runner", template, known)
    return spec


def _check_template(where: yamlconf.Mapping, key: str, template: str, known: set[str]) -> None:
    try:
        fields = template_fields(template)
    except ValueError as exc:
        raise where.error(key, f"bad template '{template}': {exc}") from exc
    for field_name in fields:
        if field_name not in known:
            raise where.error(
                key,
                f"unknown field {{{field_name}}}",
                hint=f"known fields: {', '.join(sorted(known)) or 'none'}",
            )


def _parse_directory(section: yamlconf.Mapping) -> DirectorySpec:
    section.check_keys(("env", "search", "requires"), context="directory")
    return DirectorySpec(
        env=section.get_str_list("env"),
        search=section.get_path_list("search"),
        requires=section.get_path_list("requires"),
    )


def _parse_version(section: yamlconf.Mapping, *, default_source: str | None) -> VersionRule:
    section.check_keys(VERSION_KEYS, context="version")
    regex = section.get_str("regex")
    if "file" in section:
        source = "file"
    elif "dirname" in section:
        source = "dirname"
        regex = regex or section.get_str("dirname")
    elif default_source is not None:
        source = default_source
    else:
        raise section.error(None, "say where the version is read: file: PATH or dirname: REGEX")
    if regex is not None:
        try:
            compiled = re.compile(regex)
        except re.error as exc:
            raise section.error("regex", f"invalid regular expression: {exc}") from exc
        if compiled.groups < 1:
            raise section.error("regex", "the regex needs a group that captures the version")
    fields: dict[str, object] = {
        "source": source,
        "file": section.get_path("file", "") or "",
        "expect": section.get_str("expect"),
        "minimum": section.get_str("minimum"),
    }
    if regex is not None:
        fields["regex"] = regex
    if "args" in section:
        fields["args"] = section.get_str_list("args")
    return VersionRule(**fields)  # type: ignore[arg-type]


def _parse_program(key: str, value: object, section: yamlconf.Mapping) -> ProgramSpec:
    if isinstance(value, str):
        return ProgramSpec(key=key, name=value)
    if not isinstance(value, yamlconf.Mapping):
        raise section.error(key, "a program is a name or a mapping with name and version")
    value.check_keys(("name", "version"), required=("name",), context=f"program {key}")
    version = (
        _parse_version(value.get_mapping("version"), default_source="command")
        if "version" in value
        else None
    )
    return ProgramSpec(key=key, name=value.get_str("name") or "", version=version)


def _parse_part(name: str, value: object, section: yamlconf.Mapping) -> PartSpec:
    if not isinstance(value, yamlconf.Mapping):
        raise section.error(name, "a part is a mapping with label, default, env, requires, version")
    value.check_keys(
        ("label", "default", "env", "requires", "version"),
        required=("default",),
        context=f"part {name}",
    )
    version = (
        _parse_version(value.get_mapping("version"), default_source=None)
        if "version" in value
        else None
    )
    return PartSpec(
        name=name,
        label=value.get_str("label", name) or name,
        default=value.get_path("default") or "",
        env=value.get_str("env"),
        requires=value.get_path_list("requires"),
        version=version,
    )


def _parse_image(section: yamlconf.Mapping) -> ImageSpec:
    section.check_keys(
        ("repository", "tag", "digest"), required=("repository", "tag"), context="image"
    )
    digest = section.get_str("digest") or None
    if digest is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise section.error("digest", f"'{digest}' is not an image digest (sha256:<64 hex>)")
    return ImageSpec(
        repository=section.get_str("repository") or "",
        tag=section.get_str("tag") or "",
        digest=digest,
    )


def load_configured_paths(path: Path, specs: Mapping[str, ToolchainSpec]) -> dict[str, Path]:
    """``NAME: PATH`` lines of the local toolchains file; unknown names are errors."""
    if not path.is_file():
        return {}
    doc = yamlconf.load(path)
    doc.check_keys(sorted(specs), context="configured toolchain paths")
    paths = {}
    for name in doc:
        value = doc.get_str(name)
        if not value:
            raise doc.error(name, "must be the path of the toolchain")
        paths[name] = Path(value).expanduser()
    return paths


# --- detection -------------------------------------------------------------------------


class Detector:
    """Looks for toolchains in one environment; each toolchain is looked for once."""

    def __init__(
        self,
        specs: Mapping[str, ToolchainSpec],
        environ: Mapping[str, str],
        configured: Mapping[str, Path] | None = None,
        known_outputs: VersionOutputs | None = None,
    ) -> None:
        self.specs = dict(specs)
        self.environ = environ
        self.configured = dict(configured or {})
        self.known_outputs = known_outputs
        self._found: dict[tuple[str, str], Found] = {}

    @classmethod
    def for_settings(cls, settings: Settings, environ: Mapping[str, str]) -> Detector:
        specs = load_toolchains(toolchains_dir(settings))
        return cls(
            specs,
            environ,
            load_configured_paths(configured_paths_file(settings), specs),
            VersionOutputs(settings.toolchain_versions),
        )

    def spec(self, name: str) -> ToolchainSpec:
        try:
            return self.specs[name]
        except KeyError:
            raise ConfigError(
                f"no toolchain named '{name}'",
                hint=f"known toolchains: {', '.join(sorted(self.specs)) or 'none'} (files in "
                "toolchains/)",
            ) from None

    def find(self, name: str, *, needed_by: str = "the build") -> Found:
        key = (name, needed_by)
        if key not in self._found:
            self._found[key] = detect(
                self.spec(name),
                self.environ,
                self.configured.get(name),
                needed_by=needed_by,
                known_outputs=self.known_outputs,
            )
        return self._found[key]


def detect(
    spec: ToolchainSpec,
    environ: Mapping[str, str],
    configured: Path | None = None,
    *,
    needed_by: str,
    known_outputs: VersionOutputs | None = None,
) -> Found:
    values: dict[str, str] = {}
    versions: dict[str, str] = {}
    problems: list[str] = []
    notes: list[str] = []
    version = proof = None
    root = None
    if spec.directory is not None:
        located = _locate_directory(spec, environ, configured, needed_by)
        notes += located.notes
        if located.root is None:
            problems += located.problems
        else:
            root = located.root
            values.update(located.values)
            versions.update(located.versions)
            version, proof = located.version, located.proof
    banners: dict[str, str] = {}
    for program in spec.programs:
        path, program_version, banner, trouble = _find_program(
            spec, program, environ, needed_by, known_outputs
        )
        if trouble:
            problems.append(trouble)
            continue
        assert path is not None
        values[program.key] = path
        if banner:
            banners[program.name] = banner
        if program_version is not None:
            versions[program.name] = program_version
            if version is None:
                version, proof = program_version, path
    if not problems:
        for probe in spec.probes:
            trouble = _run_probe(probe, values[probe.program], environ)
            if trouble:
                problems.append(trouble)
    if spec.image is not None:
        # What builds is the image, not the docker client: the image is the version.
        values["image"] = spec.image.ref
        version, proof = spec.image.digest or spec.image.tag, spec.image.ref
    return Found(
        spec=spec,
        ok=not problems,
        version=version,
        proof=proof,
        root=root,
        values=tuple(values.items()),
        problems=tuple(problems),
        notes=tuple(notes),
        versions=tuple(versions.items()),
        banners=tuple(banners.items()),
    )


class _Located:
    def __init__(self) -> None:
        self.root: Path | None = None
        self.values: dict[str, str] = {}
        self.versions: dict[str, str] = {}
        self.version: str | None = None
        self.proof: str | None = None
        self.problems: list[str] = []
        self.notes: list[str] = []


def _candidates(
    spec: ToolchainSpec, environ: Mapping[str, str], configured: Path | None
) -> tuple[list[tuple[str, Path]], list[str]]:
    """(where it came from, path) in precedence order, plus notes for places that had nothing."""
    assert spec.directory is not None
    found: list[tuple[str, Path]] = []
    empty: list[str] = []
    if configured is not None:
        found.append(("the configured path", configured))
    for var in spec.directory.env:
        value = environ.get(var)
        if value:
            found.append((f"${var}", Path(value).expanduser()))
        else:
            empty.append(f"${var} is unset")
    for pattern in spec.directory.search:
        expanded = _expand_env(pattern, environ)
        if expanded is None:
            continue
        matches = sorted(glob.glob(str(Path(expanded).expanduser())), reverse=True)
        if not matches:
            empty.append(f"{expanded} does not exist")
        found += [(f"search path {pattern}", Path(m)) for m in matches]
    seen: set[Path] = set()
    unique = []
    for origin, path in found:
        key = path.resolve() if path.exists() else path
        if key not in seen:
            seen.add(key)
            unique.append((origin, path))
    return unique, empty


def _expand_env(pattern: str, environ: Mapping[str, str]) -> str | None:
    """``$ANDROID_HOME/ndk/x`` with the variable filled in; None when a variable is unset."""
    missing = False

    def fill(match: re.Match[str]) -> str:
        nonlocal missing
        value = environ.get(match.group(1) or match.group(2))
        if not value:
            missing = True
            return ""
        return value

    expanded = ENV_REF.sub(fill, pattern)
    return None if missing else expanded


def _locate_directory(
    spec: ToolchainSpec, environ: Mapping[str, str], configured: Path | None, needed_by: str
) -> _Located:
    assert spec.directory is not None
    result = _Located()
    candidates, empty = _candidates(spec, environ, configured)
    failures: list[str] = []
    for origin, path in candidates:
        trouble = _check_directory(spec, path, environ, needed_by, result)
        if trouble is None:
            result.root = path
            result.notes += [f"passed over: {f}" for f in failures]
            return result
        failures.append(f"{trouble} (from {origin})")
    if failures:
        result.problems += failures
    else:
        looked = "; ".join(empty) or "no places to look are configured"
        result.problems.append(f"{spec.title} not found: {looked}")
    return result


def _check_directory(
    spec: ToolchainSpec, path: Path, environ: Mapping[str, str], needed_by: str, result: _Located
) -> str | None:
    """None when ``path`` is the wanted toolchain; otherwise what is wrong with it."""
    assert spec.directory is not None
    if not path.is_dir():
        return f"{path} is not a folder"
    for required in spec.directory.requires:
        if not (path / required).exists():
            return f"{spec.label} at {path} lacks {required}"
    version = proof = None
    if spec.version is not None:
        version, proof, trouble = _read_version(
            spec.version, path, spec.label, spec.wanted, needed_by
        )
        if trouble:
            return trouble
    values = {"root": str(path)}
    versions = {spec.label: version} if version else {}
    for part in spec.parts:
        part_path, part_version, trouble = _check_part(part, path, environ, needed_by)
        if trouble:
            return trouble
        values[part.name] = str(part_path)
        if part_version:
            versions[part.label] = part_version
    result.values, result.versions, result.version, result.proof = values, versions, version, proof
    return None


def _check_part(
    part: PartSpec, root: Path, environ: Mapping[str, str], needed_by: str
) -> tuple[Path, str | None, str | None]:
    from_env = environ.get(part.env) if part.env else None
    path = Path(from_env).expanduser() if from_env else root / part.default
    origin = f" (from ${part.env})" if from_env else ""
    if not path.is_dir():
        return path, None, f"{part.label} folder {path} does not exist{origin}"
    for required in part.requires:
        if not (path / required).exists():
            return path, None, f"{part.label} at {path} lacks {required}{origin}"
    if part.version is None:
        return path, None, None
    wanted = part.version.wanted
    version, _, trouble = _read_version(part.version, path, part.label, wanted, needed_by)
    return path, version, (trouble + origin if trouble else None)


def _read_version(
    rule: VersionRule, path: Path, label: str, wanted: str, needed_by: str
) -> tuple[str | None, str | None, str | None]:
    """(version, the file or folder that proved it, trouble)."""
    if rule.source == "dirname":
        proof = str(path)
        version = rule.read(path.name)
        if version is None:
            return (
                None,
                proof,
                f"cannot tell the {label} version at {path}: its folder name '{path.name}' is not "
                "a version",
            )
    else:
        proof_path = path / rule.file
        proof = str(proof_path)
        try:
            text = proof_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None, proof, f"cannot tell the {label} version at {path}: {rule.file} is missing"
        version = rule.read(text)
        if version is None:
            return None, proof, f"cannot tell the {label} version: no version in {proof_path}"
    if not rule.accepts(version):
        return version, proof, f"found {label} {version} at {proof}; {needed_by} needs {wanted}"
    return version, proof, None


def _find_program(
    spec: ToolchainSpec,
    program: ProgramSpec,
    environ: Mapping[str, str],
    needed_by: str,
    known_outputs: VersionOutputs | None = None,
) -> tuple[str | None, str | None, str | None, str | None]:
    """(path, version, the output line that holds the version, trouble)."""
    path = shutil.which(program.name, path=environ.get("PATH", os.defpath))
    if path is None:
        return None, None, None, f"'{program.name}' ({spec.label}) is not on PATH"
    if program.version is None:
        return path, None, None, None
    argv = [path, *program.version.args]
    key = known_outputs.key(argv, environ) if known_outputs is not None else None
    remembered = known_outputs.get(key) if known_outputs is not None and key is not None else None
    output = remembered
    if output is None:
        try:
            result = proc.run(
                argv, env=environ, replace_env=True, check=False, timeout=PROBE_TIMEOUT
            )
        except (NotAvailableHere, CommandFailed) as exc:
            return (
                None,
                None,
                None,
                f"'{program.name}' ({spec.label}) cannot be run: {exc.message.splitlines()[0]}",
            )
        output = result.stdout + "\n" + result.stderr
    version = program.version.read(output)
    if remembered is None and version is not None and known_outputs is not None and key is not None:
        known_outputs.put(
            key, output
        )  # only an output that names a version: a failed run is asked again
    if version is None:
        return (
            path,
            None,
            None,
            f"cannot tell the version of {path}: "
            f"'{' '.join([program.name, *program.version.args])}' printed none",
        )
    banner = next((line.strip() for line in output.splitlines() if version in line), version)
    if not program.version.accepts(version):
        return (
            path,
            version,
            banner,
            f"found {program.name} {version} at {path}; {needed_by} needs {program.version.wanted}",
        )
    return path, version, banner, None


VERSION_ENV = (
    "PATH",
    "LANG",
    "LC_ALL",
    "LC_MESSAGES",
)  # what a version command's output may depend on
WRAPPERS = frozenset(
    {"ccache", "sccache", "distcc", "icecc", "buildcache"}
)  # masquerade links: the wrapped program can change
MAX_VERSION_OUTPUTS = 64


class VersionOutputs(TextCache):
    """What each program's version command printed, remembered per binary, so a no-op build runs
    no ``--version`` probes (about 10 ms each).

    An entry is keyed by the identity of the file that runs (device, inode, size, mtime and
    ctime of its resolved path), the arguments, PATH and the locale: an upgraded or replaced
    binary has a new identity. Scripts and compiler-cache wrappers are never remembered, since
    what they run can change while they do not. A TextCache: damage means probing again."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, limit=MAX_VERSION_OUTPUTS)

    def key(self, argv: Sequence[str], environ: Mapping[str, str]) -> str | None:
        """The entry's key, or None when this program must be probed every time."""
        try:
            real = os.path.realpath(argv[0])
            with open(real, "rb") as handle:
                if handle.read(2) == b"#!":
                    return None
            if os.path.basename(real) in WRAPPERS and os.path.basename(argv[0]) != os.path.basename(
                real
            ):
                return None  # e.g. /usr/lib/ccache/g++: ccache runs whichever g++ PATH finds
            info = os.stat(real)
        except OSError:
            return None
        identity = [
            argv[0],
            real,
            info.st_dev,
            info.st_ino,
            info.st_size,
            info.st_mtime_ns,
            info.st_ctime_ns,
            list(argv[1:]),
        ]
        identity += [environ.get(name) for name in VERSION_ENV]
        return hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:32]


def _run_probe(probe: ProbeSpec, program: str, environ: Mapping[str, str]) -> str | None:
    argv = [program, *probe.args]
    try:
        result = proc.run(argv, env=environ, replace_env=True, check=False, timeout=PROBE_TIMEOUT)
    except (NotAvailableHere, CommandFailed) as exc:
        return f"{probe.what} is not available here: {exc.message.splitlines()[0]}"
    if result.ok:
        return None
    said = next(
        (
            line.strip()
            for line in (result.stderr + "\n" + result.stdout).splitlines()
            if line.strip()
        ),
        "",
    )
    return f"{probe.what} is not available here: '{proc.describe(argv)}' failed" + (
        f": {said}" if said else ""
    )
