"""Request validation: every problem found is reported as a field violation, all at once."""

from __future__ import annotations

import re
from dataclasses import dataclass

from quarry import ids, paging
from quarry.errors import FieldViolation, InvalidArgument
from quarry.identity import Role
from quarry.records.base import RecordError
from quarry.records.research import RECORD_TYPES, ResearchRecord, parse_record
from quarry.vocabulary import EntryKind
from scratchpad_svc.threads import AppendCommand, NewThread

ROLES = ", ".join(f"ROLE_{role.name}" for role in Role)
SOURCE_SCHEMES = ("http://", "https://", "corpus://")
MAX_URL_CHARS = 2048
MAX_TITLE_CHARS = 1024
MAX_THREAD_TITLE_CHARS = 1024
MAX_LABELS = 64
MAX_LABEL_CHARS = 256
SEQUENCE_NO = re.compile(r"[0-9]{1,19}")
MAX_SEQUENCE_NO = 2**63 - 1
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
# The ledger's kinds hold one research record each, checked here too; a verdict may still be prose (verifiers
# wrote them so before records existed), though a worker's claim-verifier writes a ClaimVerdict.
TYPED_KINDS = frozenset(RECORD_TYPES) - {EntryKind.VERDICT}


@dataclass(frozen=True)
class Limits:
    max_content_bytes: int
    max_sources: int


def _nul_violations(fields: dict[str, str]) -> list[FieldViolation]:
    """PostgreSQL text and jsonb cannot store NUL; refuse it on every backend alike."""
    return [
        FieldViolation(field, "must not contain NUL characters") for field, value in fields.items() if "\x00" in value
    ]


def validate_new_thread(request: NewThread) -> None:
    violations = ids.violations(
        ids.THREAD_ID.check("thread_id", request.thread_id, when_missing=None),
        ids.REQUEST_ID.check("request_id", request.request_id, when_missing=None),
    )
    if len(request.title) > MAX_THREAD_TITLE_CHARS:
        violations.append(FieldViolation("title", f"at most {MAX_THREAD_TITLE_CHARS} characters"))
    if len(request.labels) > MAX_LABELS:
        violations.append(FieldViolation("labels", f"at most {MAX_LABELS} labels"))
    texts = {"title": request.title, **{f"labels[{key!r}]": key + value for key, value in request.labels.items()}}
    violations.extend(_nul_violations(texts))
    for key, value in request.labels.items():
        if not key or len(key) > MAX_LABEL_CHARS or len(value) > MAX_LABEL_CHARS:
            violations.append(
                FieldViolation(
                    f"labels[{key!r}]", f"keys 1-{MAX_LABEL_CHARS} characters, values at most {MAX_LABEL_CHARS}"
                )
            )
    if violations:
        raise InvalidArgument(violations)


def validate_append(command: AppendCommand, limits: Limits) -> ResearchRecord | None:
    """Refuse an invalid append with all its field violations; the research record it holds, if its kind holds one."""
    record = None
    violations = ids.violations(
        ids.THREAD_ID.check("thread_id", command.thread_id),
        ids.REQUEST_ID.check("request_id", command.request_id, when_missing="required: it makes retries safe"),
    )
    if command.kind is None:
        kinds = ", ".join(f"ENTRY_KIND_{kind.name}" for kind in EntryKind)
        violations.append(FieldViolation("kind", f"unknown or unspecified; one of: {kinds}"))
    violations.extend(ids.violations(ids.PRINCIPAL_ID.check("author.principal_id", command.author_id)))
    if command.role is None:
        violations.append(FieldViolation("author.role", f"unknown or unspecified; one of: {ROLES}"))
    if not command.content.strip():
        violations.append(FieldViolation("content", "must not be empty"))
    elif (size := len(command.content.encode())) > limits.max_content_bytes:
        violations.append(FieldViolation("content", f"{size} bytes exceeds the limit of {limits.max_content_bytes}"))
    elif command.kind is not None and command.kind in RECORD_TYPES:
        try:
            record = parse_record(command.kind, command.content)
        except RecordError as error:
            if command.kind in TYPED_KINDS:  # a prose verdict is still a verdict, and holds no record to check
                expected = RECORD_TYPES[command.kind].__name__
                violations.append(FieldViolation("content", f"must be the JSON of a {expected}: {error}"))
    if len(command.sources) > limits.max_sources:
        violations.append(FieldViolation("sources", f"at most {limits.max_sources} sources"))
    for index, source in enumerate(command.sources):
        field = f"sources[{index}]"
        if not source.url.startswith(SOURCE_SCHEMES) or len(source.url) > MAX_URL_CHARS:
            violations.append(
                FieldViolation(
                    f"{field}.url", f"must be an http(s):// or corpus:// URL of at most {MAX_URL_CHARS} characters"
                )
            )
        if len(source.title) > MAX_TITLE_CHARS:
            violations.append(FieldViolation(f"{field}.title", f"at most {MAX_TITLE_CHARS} characters"))
        if len(source.excerpt.encode()) > limits.max_content_bytes:
            violations.append(
                FieldViolation(f"{field}.excerpt", f"exceeds the limit of {limits.max_content_bytes} bytes")
            )
        violations.extend(
            _nul_violations(
                {f"{field}.url": source.url, f"{field}.title": source.title, f"{field}.excerpt": source.excerpt}
            )
        )
    violations.extend(_nul_violations({"content": command.content, "author.principal_id": command.author_id}))
    if violations:
        raise InvalidArgument(violations)
    return record


@dataclass(frozen=True)
class ReadCursor:
    after_sequence_no: int
    limit: int


def read_cursor(thread_id: str, after_sequence_no: int, page_size: int, page_token: str) -> ReadCursor:
    violations = ids.violations(ids.THREAD_ID.check("thread_id", thread_id))
    if after_sequence_no < 0:
        violations.append(FieldViolation("after_sequence_no", "must not be negative"))
    if page_size < 0:
        violations.append(FieldViolation("page_size", "must not be negative"))
    after = after_sequence_no
    if page_token:
        decoded = decode_page_token(page_token)
        if decoded is None or decoded[0] != thread_id:
            violations.append(FieldViolation("page_token", "not a token from a Read of this thread"))
        else:
            after = decoded[1]
    if violations:
        raise InvalidArgument(violations)
    limit = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
    return ReadCursor(after_sequence_no=after, limit=limit)


def encode_page_token(thread_id: str, after_sequence_no: int) -> str:
    return paging.encode_token(f"v1:{thread_id}:{after_sequence_no}")


def decode_page_token(token: str) -> tuple[str, int] | None:
    raw = paging.decode_token(token)
    if raw is None:
        return None
    version, _, rest = raw.partition(":")
    thread_id, _, after = rest.rpartition(":")
    if version != "v1" or not ids.THREAD_ID.matches(thread_id) or not SEQUENCE_NO.fullmatch(after):
        return None
    # Only the form encode_page_token writes: no leading zeros, nothing past the largest sequence number.
    if int(after) > MAX_SEQUENCE_NO or str(int(after)) != after:
        return None
    return thread_id, int(after)
