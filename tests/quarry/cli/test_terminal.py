"""Text from a model, a page, a job or another service shown by the command line: never read as markup,
never obeyed by the terminal, in `quarry ask`, `quarry runs`, `quarry lab` and `doctor` alike."""

from __future__ import annotations

import re

import pytest
from rich.console import Console, RenderableType

from quarry.cli.ask import RunView, summary
from quarry.cli.doctor import Verdict, print_verdict
from quarry.cli.lab.commands import _show
from quarry.cli.lab.view import CampaignView, ledger_table
from quarry.cli.terminal import clean, safe_markup, shown
from quarry.v1 import campaign_pb2, supervisor_pb2

# What a model or a page might write: markup that would style, close, link or crash, and escape sequences that
# would recolour the terminal (in a colour rich never uses), retitle its window, ring it, or clear the screen.
HOSTILE = "[bold]b[/] [/] [link=https://e.x]l[/link] \x1b[38;5;196mred\x1b[0m\x1b]0;title\x07\x1b[2J end"
SEQUENCES = ("\x1b[38;5;196m", "\x1b]0;", "\x07", "\x1b[2J")
# What must be shown instead: the brackets literally, the escape sequences gone.
LITERAL = ("[bold]b[/]", "[/]", "[link=https://e.x]l[/link]", "red", "end")
_STYLING = re.compile(r"\x1b\[[0-9;]*m")  # the styles rich itself writes


def printed(*renderables: RenderableType) -> str:
    """What a terminal would be sent, escape sequences included."""
    console = terminal()
    with console.capture() as captured:
        for renderable in renderables:
            console.print(renderable)
    return captured.get()


def terminal() -> Console:
    return Console(width=400, force_terminal=True, color_system="256", highlight=False)


def assert_harmless(output: str, literal: tuple[str, ...] = LITERAL) -> None:
    for sequence in SEQUENCES:
        assert sequence not in output, (sequence, output)
    text = _STYLING.sub("", output)
    for part in literal:
        assert part in text, (part, text)


def test_clean_drops_escape_sequences_and_control_characters_but_keeps_lines() -> None:
    assert clean(HOSTILE) == "[bold]b[/] [/] [link=https://e.x]l[/link] red end"
    assert clean("one\ntwo\tthree\x00\x7f\x9b") == "one\ntwo\tthree"
    assert_harmless(printed(shown(HOSTILE)))
    assert_harmless(printed(f"[dim]said:[/] {safe_markup(HOSTILE)}"))


def test_quarry_ask_live_view_and_summary_show_model_text_literally() -> None:
    view = RunView(question=HOSTILE)
    for event in (
        supervisor_pb2.RunEvent(
            status=supervisor_pb2.ResearchStatusEvent(
                phase=supervisor_pb2.RESEARCH_PHASE_WORKER_DELEGATED, message=HOSTILE, delegation_id="run-1.1.d1"
            )
        ),
        supervisor_pb2.RunEvent(
            status=supervisor_pb2.ResearchStatusEvent(
                phase=supervisor_pb2.RESEARCH_PHASE_WORKER_RESEARCHING,
                message=HOSTILE,
                delegation_id="run-1.1.d1",
                worker_id=HOSTILE,
            )
        ),
        supervisor_pb2.RunEvent(scratchpad=supervisor_pb2.ScratchpadEvent(scratchpad_sequence_no=2, preview=HOSTILE)),
        supervisor_pb2.RunEvent(content=supervisor_pb2.ContentEvent(delta=HOSTILE)),
    ):
        view.apply(event)
    assert_harmless(printed(view.render()))

    completed = supervisor_pb2.RunEvent()
    completed.completed.report.markdown = HOSTILE
    completed.completed.report.citations.add(number=1, url="https://a.example/", title=HOSTILE, excerpt=HOSTILE)
    completed.completed.warnings.add(
        code=supervisor_pb2.RunWarningCode.Value("RUN_WARNING_CODE_UNSPECIFIED"), message=HOSTILE
    )
    failed = supervisor_pb2.RunEvent()
    failed.failed.error.message = HOSTILE
    for event in (completed, failed):
        console = terminal()
        with console.capture() as captured:
            summary(console, event)
        assert_harmless(captured.get())


def test_quarry_lab_tables_watch_and_show_print_model_and_job_text_literally() -> None:
    row = campaign_pb2.LedgerRow(
        cycle=3, verdict=campaign_pb2.LEDGER_VERDICT_DISCARD, hypothesis=HOSTILE, conclusion=HOSTILE, commit=HOSTILE
    )
    assert_harmless(printed(ledger_table([row], "loss")))  # the commit is cut to 10 characters, the rest to 60

    campaign = campaign_pb2.Campaign(campaign_id="camp-1")
    campaign.spec.title = HOSTILE
    campaign.spec.brief.goal = HOSTILE
    campaign.pause_reason = HOSTILE
    view = CampaignView(campaign, status=HOSTILE, log=[HOSTILE], rows=[row], notes=[HOSTILE])
    assert_harmless(printed(view.render()))
    console = terminal()
    with console.capture() as captured:
        _show(console, campaign)
    assert_harmless(captured.get())


@pytest.mark.parametrize("ok", [True, False])
def test_doctor_prints_what_a_service_said_literally(ok: bool) -> None:
    console = terminal()
    with console.capture() as captured:
        print_verdict(console)(Verdict(HOSTILE, ok, HOSTILE, notes=(HOSTILE,)))
    assert_harmless(captured.get())
