"""A Delegate request checked before anything runs: its ids, its task's bounds, its role and workspace,
and, for a delegation_id already used, that it is the same request."""

from __future__ import annotations

import re

from quarry import ids
from quarry.errors import ErrorReason, FailedPrecondition, FieldViolation, InvalidArgument
from quarry.identity import Role
from quarry.records.research import InputRefs
from worker_svc.delegations import DelegationRecord, DelegationRequest
from worker_svc.roles import ROLES, Needs

MAX_TURNS_LIMIT = 64
MAX_OBJECTIVE_CHARS = 16_000
# As many as the supervisor's delegate_research tool may ask for; a criterion is a sentence, an input
# ref a scratchpad entry or a URL (the scratchpad's longest).
MAX_CRITERIA = 10
MAX_CRITERION_CHARS = 1000
MAX_INPUT_REFS = 20
MAX_INPUT_REF_CHARS = 2048
MAX_TIMEOUT_SECONDS = 24 * 3600
# A monitor's workspace id ("ws-" and hex digits today); the monitor checks it exactly.
_WORKSPACE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def validate(request: DelegationRequest) -> None:
    violations = ids.violations(
        ids.DELEGATION_ID.check("delegation_id", request.delegation_id),
        ids.RUN_REFERENCE.check("run_id", request.run_id),
        ids.TOOL_CALL_ID.check("tool_call_id", request.tool_call_id, when_missing=None),
        ids.THREAD_ID.check("scratchpad_thread_id", request.scratchpad_thread_id),
    )
    if not request.objective.strip():
        violations.append(FieldViolation("task.objective", "required"))
    elif len(request.objective) > MAX_OBJECTIVE_CHARS:
        violations.append(FieldViolation("task.objective", f"at most {MAX_OBJECTIVE_CHARS} characters"))
    elif "\x00" in request.objective:
        violations.append(FieldViolation("task.objective", "must not contain NUL characters"))
    if len(request.question) > MAX_OBJECTIVE_CHARS:
        violations.append(FieldViolation("task.question", f"at most {MAX_OBJECTIVE_CHARS} characters"))
    elif "\x00" in request.question:
        violations.append(FieldViolation("task.question", "must not contain NUL characters"))
    violations.extend(_list_violations("task.criteria", request.criteria, MAX_CRITERIA, MAX_CRITERION_CHARS))
    violations.extend(_list_violations("task.input_refs", request.input_refs, MAX_INPUT_REFS, MAX_INPUT_REF_CHARS))
    if request.role is None or request.role not in ROLES:
        roles = ", ".join(f"ROLE_{role.name}" for role in ROLES)
        violations.append(FieldViolation("role", f"a worker runs one of: {roles}"))
    else:
        violations.extend(_input_violations(request.role, InputRefs.parse(request.input_refs)))
    violations.extend(_workspace_violations(request))
    if not 0 <= request.max_turns <= MAX_TURNS_LIMIT:
        violations.append(FieldViolation("budget.max_turns", f"between 1 and {MAX_TURNS_LIMIT} (0: default)"))
    if not 0 <= request.timeout_seconds <= MAX_TIMEOUT_SECONDS:
        violations.append(FieldViolation("budget.timeout", f"between 0 and {MAX_TIMEOUT_SECONDS} seconds"))
    if request.max_tokens < 0:
        violations.append(FieldViolation("budget.max_tokens", "must not be negative"))
    if violations:
        raise InvalidArgument(violations)


def _input_violations(role: Role, inputs: InputRefs) -> list[FieldViolation]:
    """A blind role's inputs are all it may see: without what its task works on it could only spend tokens."""
    needs = ROLES[role].needs
    if needs is Needs.ENTRIES and not inputs.entries:
        return [
            FieldViolation(
                "task.input_refs",
                f'a ROLE_{role.name} task names the scratchpad entries it judges (sequence numbers, e.g. "12")',
            )
        ]
    if needs is Needs.ONE_URL and len(inputs.urls) != 1:
        return [FieldViolation("task.input_refs", f"a ROLE_{role.name} task names the one source it reads (a URL)")]
    return []


def _workspace_violations(request: DelegationRequest) -> list[FieldViolation]:
    """An engineer works in the workspace its task names; no other role is given one."""
    field, workspace_id = "task.workspace_id", request.workspace_id
    if request.role is None or request.role not in ROLES:
        return []  # the role's own violation says what is wrong
    if ROLES[request.role].works_in_workspace and not workspace_id:
        return [FieldViolation(field, f"required for ROLE_{request.role.name}: the monitor's workspace it works in")]
    if workspace_id and not ROLES[request.role].works_in_workspace:
        roles = ", ".join(f"ROLE_{role.name}" for role, spec in ROLES.items() if spec.works_in_workspace)
        return [FieldViolation(field, f"only {roles} works in a workspace")]
    if workspace_id and not _WORKSPACE_ID.fullmatch(workspace_id):
        return [FieldViolation(field, "a workspace id from the monitor's OpenWorkspace")]
    return []


def _list_violations(field: str, items: tuple[str, ...], max_items: int, max_chars: int) -> list[FieldViolation]:
    """A bounded list of short texts without NUL (which PostgreSQL cannot store)."""
    if len(items) > max_items:
        return [FieldViolation(field, f"at most {max_items} items")]
    found = []
    for index, item in enumerate(items):
        if len(item) > max_chars:
            found.append(FieldViolation(f"{field}[{index}]", f"at most {max_chars} characters"))
        elif "\x00" in item:
            found.append(FieldViolation(f"{field}[{index}]", "must not contain NUL characters"))
    return found


def check_same_request(record: DelegationRecord, request: DelegationRequest) -> None:
    """A delegation_id names one request: a different one under the same id is refused, not answered."""
    if (record.run_id, record.tool_call_id, record.objective, record.scratchpad_thread_id, record.workspace_id) != (
        request.run_id,
        request.tool_call_id,
        request.objective,
        request.scratchpad_thread_id,
        request.workspace_id,
    ):
        raise FailedPrecondition(
            f"delegation_id {request.delegation_id!r} was already used for a different request",
            reason=ErrorReason.DELEGATION_ID_REUSED,
            metadata={"delegation_id": request.delegation_id},
        )
