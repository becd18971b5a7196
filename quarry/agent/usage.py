"""What model work costs, in one shape for a reply, a run, a delegation and a run's tiers.

Kept apart from the model client so that services converting usage need not import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Usage:
    """What model work cost: of one reply (tokens only), one run, or many runs added up."""

    input_tokens: int = 0
    output_tokens: int = 0
    model_calls: int = 0
    tool_calls: int = 0
    # Model calls whose tokens are estimated from characters: their server reported no usage.
    estimated_calls: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.model_calls + other.model_calls,
            self.tool_calls + other.tool_calls,
            self.estimated_calls + other.estimated_calls,
        )

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def to_json(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Usage:
        """Reads its own keys and ignores others, so it can sit flat inside a larger record."""
        return cls(**{name: int(data.get(name, 0)) for name in _USAGE_FIELDS})


_USAGE_FIELDS = tuple(usage_field.name for usage_field in fields(Usage))
