"""The remote build cache shared between machines: its configuration, what it did for one build, its
statistics.

Configured by ``KZ_REMOTE_CACHE`` (a URL) or the project's ``.kz/config.yaml``; see
:mod:`kzbuild.build.remotecache`. A URL may hold credentials: print ``shown``, never ``url``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kzbuild.model.urls import redact

DEFAULT_TIMEOUT = 2.0  # seconds without an answer before a cache counts as down


@dataclass(frozen=True)
class RemoteConfig:
    # redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] or
    # http(s)://[USER:PASSWORD@]HOST[:PORT][/PATH]; may hold a password
    url: str
    source: str  # where it was set: KZ_REMOTE_CACHE, or FILE:LINE
    artifacts: bool = True  # pull artifacts by build id before building, push them after
    ccache: bool = True  # ccache's own remote storage for every compile
    timeout: float = DEFAULT_TIMEOUT

    @property
    def shown(self) -> str:
        """The URL with its password replaced by ****: the only form that is printed or logged."""
        return redact(self.url)

    @property
    def kind(self) -> str:
        """redis or http (https included)."""
        return "redis" if self.url.startswith("redis://") else "http"

    def to_dict(self) -> dict[str, object]:
        return {
            "url": self.shown,
            "source": self.source,
            "artifacts": self.artifacts,
            "ccache": self.ccache,
            "timeout_s": self.timeout,
        }


@dataclass(frozen=True)
class RemoteOutcome:
    """What the remote cache did for one build."""

    store: str  # the shown URL
    available: bool  # answered within the timeout
    pulled: bool = False  # the artifact came from the store (verified); nothing was compiled
    pushed: bool = False  # the built artifact was stored
    uploaded_bytes: int = 0
    downloaded_bytes: int = 0
    refused: str | None = None  # why a stored artifact was refused (a sha256 mismatch, ...)
    problems: tuple[str, ...] = ()  # what went wrong with the cache (each also logged as a warning)
    seconds: float = 0.0  # spent talking to the store (probe, pull, push)

    def to_dict(self) -> dict[str, object]:
        return {
            "store": self.store,
            "available": self.available,
            "pulled": self.pulled,
            "pushed": self.pushed,
            "uploaded_bytes": self.uploaded_bytes,
            "downloaded_bytes": self.downloaded_bytes,
            "refused": self.refused,
            "problems": list(self.problems),
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class ArtifactCounts:
    """How this machine's builds were served: a local artifact, a pulled one, or a compile."""

    local: int = 0
    pulled: int = 0
    built: int = 0

    @property
    def lookups(self) -> int:
        return self.local + self.pulled + self.built

    def rate(self, count: int) -> float | None:
        return count / self.lookups if self.lookups else None

    def to_dict(self) -> dict[str, object]:
        return {
            "local": self.local,
            "pulled": self.pulled,
            "built": self.built,
            "local_hit_rate": self.rate(self.local),
            "remote_hit_rate": self.rate(self.pulled),
        }


@dataclass(frozen=True)
class CcacheCounts:
    """ccache's own counters for this machine's cache dir (``ccache --print-stats``)."""

    size_bytes: int
    files: int
    local_hits: int
    remote_hits: int
    misses: int
    remote_errors: int  # remote_storage_error + remote_storage_timeout

    @property
    def compiles(self) -> int:
        return self.local_hits + self.remote_hits + self.misses

    def rate(self, count: int) -> float | None:
        return count / self.compiles if self.compiles else None

    def to_dict(self) -> dict[str, object]:
        return {
            "size_bytes": self.size_bytes,
            "files": self.files,
            "local_hits": self.local_hits,
            "remote_hits": self.remote_hits,
            "misses": self.misses,
            "remote_errors": self.remote_errors,
            "local_hit_rate": self.rate(self.local_hits),
            "remote_hit_rate": self.rate(self.remote_hits),
        }


@dataclass(frozen=True)
class RemoteUsage:
    """What the store says about itself; None where it cannot tell (a WebDAV server lists
    nothing)."""

    size_bytes: int | None = None
    entries: int | None = None
    server_hits: int | None = None  # redis: keyspace hits of the whole server
    server_misses: int | None = None
    problem: str | None = None  # why nothing could be asked (down, refused)

    @property
    def server_hit_rate(self) -> float | None:
        if (
            self.server_hits is None
            or self.server_misses is None
            or not self.server_hits + self.server_misses
        ):
            return None
        return self.server_hits / (self.server_hits + self.server_misses)

    def to_dict(self) -> dict[str, object]:
        return {
            "size_bytes": self.size_bytes,
            "entries": self.entries,
            "server_hits": self.server_hits,
            "server_misses": self.server_misses,
            "server_hit_rate": self.server_hit_rate,
            "problem": self.problem,
        }


@dataclass(frozen=True)
class CacheStats:
    """``kzbuild cache stats``: this machine's caches and the remote one."""

    ccache_dir: str
    ccache: CcacheCounts | None  # None: ccache is not installed, or its dir is empty
    artifacts_dir: str
    artifact_count: int
    artifact_bytes: int
    artifact_counts: ArtifactCounts
    remote: RemoteConfig | None
    remote_usage: RemoteUsage | None

    def to_dict(self) -> dict[str, object]:
        return {
            "local": {
                "ccache": {
                    "dir": self.ccache_dir,
                    **(self.ccache.to_dict() if self.ccache else {}),
                },
                "artifacts": {
                    "dir": self.artifacts_dir,
                    "count": self.artifact_count,
                    "size_bytes": self.artifact_bytes,
                },
            },
            "artifact_lookups": self.artifact_counts.to_dict(),
            "remote": None
            if self.remote is None
            else {
                **self.remote.to_dict(),
                **(self.remote_usage.to_dict() if self.remote_usage else {}),
            },
        }
