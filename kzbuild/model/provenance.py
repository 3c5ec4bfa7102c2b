"""One identity for a number: the provenance id of a record.

A hash of every input that decides the number: the lock (upstream commit, patches, overlays),
the toolchains' versions, the build id, the model's sha256, the corpus's sha256 (quality records
only) and the device's fingerprint. Two records with the same id were measured with the same
inputs; ``kzbuild results show --provenance ID`` lists the parts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kzbuild.errors import BadRecord
from kzbuild.model.jsonfields import Fields

PROVENANCE_KEYS = frozenset(
    {"id", "lock_sha256", "toolchains", "build_id", "model_sha256", "corpus_sha256", "device"}
)


@dataclass(frozen=True)
class Provenance:
    lock_sha256: str | None
    toolchains: Mapping[str, str]  # toolchain name -> version, from the release's manifest
    build_id: str | None
    model_sha256: str | None
    device: Mapping[str, str]  # the device's fingerprint
    corpus_sha256: str | None = None  # quality records: the text the logits were taken on

    def parts_dict(self) -> dict[str, Any]:
        return {
            "lock_sha256": self.lock_sha256,
            "toolchains": dict(sorted(self.toolchains.items())),
            "build_id": self.build_id,
            "model_sha256": self.model_sha256,
            "corpus_sha256": self.corpus_sha256,
            "device": dict(sorted(self.device.items())),
        }

    @property
    def id(self) -> str:
        text = json.dumps(
            self.parts_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id} | self.parts_dict()

    @classmethod
    def from_fields(cls, fields: Fields) -> Provenance:
        fields.check_known(PROVENANCE_KEYS)
        found = cls(
            lock_sha256=fields.optional_text("lock_sha256"),
            toolchains=fields.text_map("toolchains", {}),
            build_id=fields.optional_text("build_id"),
            model_sha256=fields.optional_text("model_sha256"),
            device=fields.text_map("device", {}),
            corpus_sha256=fields.optional_text("corpus_sha256"),
        )
        stored = fields.text("id")
        if stored != found.id:
            raise BadRecord(
                f"{fields.where}: id {stored} is not the hash of its parts ({found.id}): "
                "a part was edited"
            )
        return found


def toolchain_versions(manifest: Mapping[str, Any]) -> dict[str, str]:
    """name -> version of each toolchain a build manifest records (``toolchains.NAME.version``)."""
    found = manifest.get("toolchains")
    if not isinstance(found, dict):
        return {}
    return {
        name: str(item["version"])
        for name, item in found.items()
        if isinstance(item, dict) and isinstance(item.get("version"), (str, int, float))
    }
