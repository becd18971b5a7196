"""`quarry runs`: list, show, watch, approve or reject, verify and export the runs of the public API."""

from __future__ import annotations

import json
import sys

from google.protobuf import json_format
from rich.console import Console
from rich.markdown import Markdown
from rich.table import Table
from rich.text import Text

from quarry.cli.ask import (
    EXIT_FAILED,
    Supervisor,
    approval_hint,
    follow,
    name_of,
    print_warnings,
    usage_line,
)
from quarry.cli.terminal import clean, safe_markup, shown
from quarry.convert import readable_entries, verification_to_proto
from quarry.records.fold import fold_ledger
from quarry.v1 import supervisor_pb2


async def list_runs(supervisor: Supervisor, state: str, limit: int, *, as_json: bool) -> int:
    state_value = (
        supervisor_pb2.RunState.Value(f"RUN_STATE_{state.upper()}") if state else supervisor_pb2.RUN_STATE_UNSPECIFIED
    )
    async with supervisor.connect() as client:
        response = await client.list_runs(page_size=limit, state=state_value)
    if as_json:
        for run in response.runs:
            print(json.dumps(json_format.MessageToDict(run)))
        return 0
    table = Table("state", "created", "question")
    table.add_column("run", no_wrap=True)  # whole, so it can be copied into `quarry runs show`
    for run in response.runs:
        table.add_row(
            name_of(supervisor_pb2.RunState, run.state),
            run.create_time.ToDatetime().strftime("%Y-%m-%d %H:%M:%S"),
            shown(run.question, limit=70),
            run.run_id,
        )
    Console().print(table)
    return 0


async def watch_run(supervisor: Supervisor, run_id: str, *, as_json: bool, wait_seconds: float) -> int:
    """Follow a run from its first event to its end, as `quarry ask` does, without cancelling it on Ctrl-C."""
    async with supervisor.connect() as client:
        run = await client.get_run(run_id)
    return await follow(supervisor, run_id, run.question, as_json=as_json, wait_seconds=wait_seconds, cancel=False)


async def export_run(supervisor: Supervisor, run_id: str) -> int:
    """Writes the run's .qrun recording to standard output as it arrives."""
    if sys.stdout.isatty():
        print("quarry: a recording is a file: redirect it, e.g. quarry runs export RUN_ID > run.qrun", file=sys.stderr)
        return EXIT_FAILED
    async with supervisor.connect() as client:
        async for piece in client.export_run(run_id):
            sys.stdout.buffer.write(piece)
    sys.stdout.buffer.flush()
    return 0


# `quarry runs verify` found nothing to check: the run was not verified, or its review has not finished.
EXIT_NOTHING_TO_VERIFY = 2


def _review_finished(run: supervisor_pb2.Run) -> bool:
    """Whether the run's review ran to its end: it succeeded, awaits a person, or a person rejected it (a run
    that failed or was cancelled during its review serves the verification of an earlier step)."""
    rejected = run.state == supervisor_pb2.RUN_STATE_FAILED and run.error.code == supervisor_pb2.RUN_ERROR_CODE_REJECTED
    return rejected or run.state in (supervisor_pb2.RUN_STATE_SUCCEEDED, supervisor_pb2.RUN_STATE_AWAITING_APPROVAL)


async def verify_run(supervisor: Supervisor, run_id: str) -> int:
    """Fold the run's ledger again and compare the fold with the verification the run serves."""
    console = Console()
    async with supervisor.connect() as client:
        run = await client.get_run(run_id)
        if not run.verification.enabled or not _review_finished(run):
            why = "was not verified" if not run.verification.enabled else "has not finished its review"
            console.print(f"run {run_id} {why}: there is no finished verification to check", markup=False)
            return EXIT_NOTHING_TO_VERIFY
        entries = await client.read_ledger(run_id)
    folded = verification_to_proto(fold_ledger(readable_entries(entries)))
    differences = verification_differences(run.verification, folded)
    if differences:
        console.print(f"run {run_id}: its ledger does not fold to the verification it serves:", markup=False)
        for difference in differences:
            console.print(f"  {difference}", markup=False)
        return EXIT_FAILED
    served = run.verification
    console.print(
        f"run {run_id}: its ledger ({len(entries)} entries) folds to exactly the verification it serves: "
        f"{len(served.findings)} findings, {len(served.sentences)} sentences, {len(served.objections)} objections, "
        f"{len(served.contradictions)} contradictions",
        markup=False,
    )
    return 0


def verification_differences(served: supervisor_pb2.Verification, folded: supervisor_pb2.Verification) -> list[str]:
    """Where the served verification and the ledger's fold differ, one line each (none: they are the same)."""
    lines = []
    for name in ("findings", "sentences", "objections", "contradictions"):
        ours, theirs = getattr(served, name), getattr(folded, name)
        for index in range(max(len(ours), len(theirs))):
            left = json_format.MessageToDict(ours[index]) if index < len(ours) else None
            right = json_format.MessageToDict(theirs[index]) if index < len(theirs) else None
            if left != right:
                lines.append(f"{name}[{index}]: served {json.dumps(left)}; the ledger gives {json.dumps(right)}")
    for name in ("supported_claims", "removed_claims", "contested_claims", "revision_rounds", "enabled"):
        if getattr(served, name) != getattr(folded, name):
            lines.append(f"{name}: served {getattr(served, name)}; the ledger gives {getattr(folded, name)}")
    return lines


async def show_run(supervisor: Supervisor, run_id: str, *, as_json: bool) -> int:
    async with supervisor.connect() as client:
        run = await client.get_run(run_id)
    if as_json:
        print(json.dumps(json_format.MessageToDict(run)))
        return 0
    console = Console()
    console.print(shown(run.question, "bold"))
    console.print(shown(f"{run.run_id}: {name_of(supervisor_pb2.RunState, run.state)}{_who(run)}"))
    if run.HasField("error"):
        console.print(shown(run.error.message, "red"))
    if run.cancel_reason:
        console.print(f"[yellow]run cancelled[/]: {safe_markup(run.cancel_reason)}")
    if run.state == supervisor_pb2.RUN_STATE_AWAITING_APPROVAL:
        console.print(approval_hint(run.run_id, "awaiting approval"))
    if run.HasField("verification"):
        _print_verification(console, run.verification)
    if run.HasField("report"):
        console.print(Markdown(clean(run.report.markdown)))
        for citation in run.report.citations:
            console.print(
                shown(f'[{citation.number}] {citation.title or citation.url} <{citation.url}>: "{citation.excerpt}"')
            )
    print_warnings(console, run.warnings)
    console.print(Text(usage_line(run.usage), style="dim"))
    return 0


def _print_verification(console: Console, verification: supervisor_pb2.Verification) -> None:
    console.print(
        f"verification: {verification.supported_claims} claim(s) supported, {verification.removed_claims} removed, "
        f"{verification.contested_claims} contested, {verification.revision_rounds} revision round(s)"
    )
    for objection in verification.objections:
        if objection.status == supervisor_pb2.OBJECTION_STATUS_OPEN:
            console.print(
                f"[yellow]open objection[/] on sentence {objection.sentence_index}: {safe_markup(objection.reason)}"
            )


async def decide(
    supervisor: Supervisor, run_id: str, *, approve: bool, note: str, as_json: bool, over_objections: bool = False
) -> int:
    """`quarry runs approve` / `reject`: the decision, then the run as it ended."""
    async with supervisor.connect() as client:
        if approve:
            run = await client.approve_run(run_id, comment=note, over_objections=over_objections)
        else:
            run = await client.reject_run(run_id, reason=note)
    if as_json:
        print(json.dumps(json_format.MessageToDict(run)))
        return 0
    Console().print(shown(f"{run.run_id}: {name_of(supervisor_pb2.RunState, run.state)}{_who(run)}"))
    return 0


def _who(run: supervisor_pb2.Run) -> str:
    """Who started the run and who decided on it, as the supervisor authenticated them."""
    started = f", started by {run.created_by}" if run.created_by else ""
    return started + (f", decided by {run.decided_by}" if run.decided_by else "")
