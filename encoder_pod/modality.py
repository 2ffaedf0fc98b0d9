"""Media modalities, as named on SGLang's /encode contract."""

from __future__ import annotations

from enum import Enum


class Modality(str, Enum):
    """The kind of media one request carries (the wire spells it in capitals)."""

    IMAGE = "IMAGE"
    AUDIO = "AUDIO"
    VIDEO = "VIDEO"

    @classmethod
    def parse(cls, value: object) -> "Modality":
        """Case-insensitive parse; raises ValueError naming the allowed values."""
        if isinstance(value, str):
            try:
                return cls[value.strip().upper()]
            except KeyError:
                pass
        allowed = ", ".join(m.value for m in cls)
        raise ValueError(f"must be one of {allowed} (case-insensitive), got {value!r}")

    @property
    def batchable(self) -> bool:
        """Video preprocessing parameters vary per clip, so videos run one request at a time."""
        return self is not Modality.VIDEO
