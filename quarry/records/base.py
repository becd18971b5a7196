"""The base of every record the kernel defines, and its one forward-compatibility policy.

A record is the JSON content of one scratchpad entry. Threads outlive releases: a supervisor, a
worker or a command line of one release reads entries that a release older or newer than itself
wrote. So every record carries its `kind` and the `schema_version` it was written with, and:

- **Admitted strictly.** Where a record enters a thread (a role's output at the worker's output
  gate, a ledger entry at the scratchpad's `Append`), `Record.parse` refuses anything but what this
  release writes: an unknown field, or a `schema_version` newer than `SCHEMA_VERSION`, is an error
  the writer can act on. The JSON schema offered to a model says the same (no additional properties).
- **Read tolerantly.** Where a stored record is read back (`read_stored`), the fields a newer release
  added are ignored and a newer `schema_version` is accepted, so an older reader still reads a newer
  thread. A newer release may add optional fields only; anything else is a new `kind`.
- **Typed either way.** Types are strict on both sides (a number written as a string is refused) and
  records are values: frozen, deep-copied as themselves.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

__all__ = ["SCHEMA_VERSION", "Record", "RecordError", "read_stored", "record_problems"]

# The version this release writes; bumped when a record family gains a field.
SCHEMA_VERSION = 1

_Extra = Literal["forbid", "ignore"]
_T = TypeVar("_T")


class RecordError(ValueError):
    """Content that is no valid record of the kind asked for; `problems` says why, one line each."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


def record_problems(error: ValidationError) -> list[str]:
    """A validation error as "field.path: message" lines, the words a model or an operator can act on."""
    return [f"{'.'.join(str(part) for part in e['loc']) or 'record'}: {e['msg']}" for e in error.errors()]


class Record(BaseModel):
    """A typed, immutable record; the module docstring gives the forward-compatibility policy."""

    # "forbid" is what a writer must meet; `read` relaxes it to "ignore" for what a newer release added.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    schema_version: int = Field(default=SCHEMA_VERSION, ge=1)

    @classmethod
    def parse(cls, content: str | bytes) -> Self:
        """A record this release would write, from its JSON; RecordError when it is not one."""
        record = cls._validate(content, "forbid")
        if record.schema_version > SCHEMA_VERSION:
            raise RecordError([f"schema_version: this release writes version {SCHEMA_VERSION} at most"])
        return record

    @classmethod
    def _validate(cls, content: str | bytes, extra: _Extra) -> Self:
        try:
            return cls.model_validate_json(content, extra=extra)
        except ValidationError as error:
            raise RecordError(record_problems(error)) from None

    def to_json(self) -> str:
        return self.model_dump_json()

    def __deepcopy__(self, memo: dict[int, object] | None = None) -> Self:
        # Immutable all the way down, so a copy is the record itself (a read-only mapping cannot be pickled).
        return self


def read_stored(records: TypeAdapter[_T], content: str | bytes) -> _T:
    """A stored record (of the types `records` validates), written by this release or another: what a newer
    release added is ignored. RecordError when the content is none of them."""
    try:
        return records.validate_json(content, extra="ignore")
    except ValidationError as error:
        raise RecordError(record_problems(error)) from None
