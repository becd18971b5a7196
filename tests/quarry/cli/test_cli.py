"""`quarry ask`, `runs`, `doctor` and `corpus` as a user runs them: real processes, against a real mesh."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from monitor_svc.service import build_host as build_monitor
from quarry.cli import main
from quarry.config import MonitorSettings, QuarrySettings
from quarry.v1 import supervisor_pb2
from tests.conftest import APPROVER_API_KEY, reusable_port
from tests.fakes.choreography import REPORT, SUPERVISOR
from tests.fakes.openai_server import Call, HttpError, Reply, ScriptedModel, Stall
from tests.fakes.web_server import FixtureWeb
from tests.supervisor_svc.conftest import Mesh, worker_settings
from worker_svc.service import build_host as build_worker


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    """The command line is what is tested here; the stores run on both databases elsewhere."""
    return f"sqlite:///{tmp_path / 'supervisor.db'}"


async def quarry(*args: str, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "quarry",
        *args,
        env={**os.environ, "COLUMNS": "160", **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )


async def finish(process: asyncio.subprocess.Process) -> tuple[int, str]:
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, output.decode()


async def test_ask_json_prints_one_event_per_line_and_runs_list_show_export_and_replay_find_the_run(
    mesh: Mesh, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mesh.script.add(SUPERVISOR, Reply(content="Nothing to delegate."))
    mesh.script.add(REPORT, Reply(content="The answer is **42**."))
    code, output = await finish(
        await quarry("ask", "--json", "What is the answer?", "--address", mesh.supervisor.address)
    )
    assert code == 0, output
    events = [json.loads(line) for line in output.splitlines()]
    assert [int(event["sequenceNo"]) for event in events] == list(range(1, len(events) + 1))
    assert events[-1]["completed"]["report"]["markdown"] == "The answer is **42**."
    run_id = events[0]["runId"]
    code, listed = await finish(await quarry("runs", "list", "--address", mesh.supervisor.address))
    assert code == 0 and run_id in listed and "succeeded" in listed
    code, shown = await finish(await quarry("runs", "show", run_id, "--address", mesh.supervisor.address))
    assert code == 0 and "The answer is 42." in shown
    code, missing = await finish(await quarry("runs", "show", "run-" + "0" * 32, "--address", mesh.supervisor.address))
    assert code == 1 and "NOT_FOUND" in missing and "Traceback" not in missing
    # Exported to a file, the run replays exactly, with no model: the scripted one has nothing left to say.
    code, exported = await finish(await quarry("runs", "export", run_id, "--address", mesh.supervisor.address))
    assert code == 0 and exported.startswith('{"record":"header","format":"quarry-run","version":1'), exported[:200]
    recording = tmp_path / "run.qrun"
    recording.write_text(exported)
    # `quarry runs replay` in this process (a replay is a mesh of its own: a second process adds only its start).
    code = await asyncio.to_thread(main, ["runs", "replay", str(recording)])
    assert code == 0 and f"replayed {run_id} exactly" in capsys.readouterr().out
    code = await asyncio.to_thread(main, ["runs", "replay", str(tmp_path / "missing.qrun")])
    unreadable = capsys.readouterr().err
    assert code == 2 and "cannot read" in unreadable and "Traceback" not in unreadable


async def test_ask_and_runs_show_say_when_a_report_rests_on_no_source(mesh: Mesh) -> None:
    mesh.script.add(SUPERVISOR, Reply(content="I know this already."))
    mesh.script.add(REPORT, Reply(content="The answer is 42."))
    code, output = await finish(await quarry("ask", "What is the answer?", "--address", mesh.supervisor.address))
    assert code == 0, output  # the run succeeded: the text is delivered, with the warning
    assert "The answer is 42." in output and "0 sources: the model never searched" in output
    [run] = (await mesh.client.list_runs()).runs
    code, shown = await finish(await quarry("runs", "show", run.run_id, "--address", mesh.supervisor.address))
    assert code == 0 and "0 sources: the model never searched" in shown
    mesh.script.add("Look it up", Reply(content="Found nothing."))
    mesh.script.add(
        SUPERVISOR,
        Reply(calls=(Call("delegate_research", {"objective": "Look it up"}, "d1"),)),
        Reply(content="Write it up."),
    )
    mesh.script.add(REPORT, Reply(content="Nobody knows."))
    code, output = await finish(await quarry("ask", "What is the question?", "--address", mesh.supervisor.address))
    assert code == 0 and "0 sources: no verified finding was cited" in output, output


async def test_ask_shows_progress_and_ctrl_c_cancels_the_run(mesh: Mesh) -> None:
    mesh.script.add("Research forever", Stall(60))
    mesh.script.add(SUPERVISOR, Reply(calls=(Call("delegate_research", {"objective": "Research forever"}, "d1"),)))
    process = await quarry("ask", "Will this be cancelled?", "--address", mesh.supervisor.address)
    for _ in range(400):
        if "Research forever" in mesh.script.requests:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the worker never asked the model")
    process.send_signal(signal.SIGINT)
    code, output = await finish(process)
    assert code == 130, output
    assert "run cancelled" in output and "Ctrl-C" in output
    [run] = (await mesh.client.list_runs()).runs
    assert run.state == supervisor_pb2.RUN_STATE_CANCELLED


async def test_ask_ends_with_the_tokens_of_each_tier(mesh: Mesh) -> None:
    delegate = Call("delegate_research", {"objective": "Measure the tower"}, "d1")
    mesh.script.add(
        SUPERVISOR,
        Reply(calls=(delegate,), input_tokens=100, output_tokens=10),
        Reply(content="Measured.", input_tokens=200, output_tokens=20),
    )
    mesh.script.add("Measure the tower", Reply(content="It is tall.", input_tokens=300, output_tokens=30))
    mesh.script.add(REPORT, Reply(content="The tower is tall.", input_tokens=400, output_tokens=40))
    code, output = await finish(await quarry("ask", "How tall is the tower?", "--address", mesh.supervisor.address))
    assert code == 0, output
    assert output.splitlines()[-1] == "tokens: supervisor 770 in 3 calls, workers 330 in 1 call, total 1100 in 4 calls"


async def test_ask_ends_with_why_delegations_failed(mesh: Mesh, model: ScriptedModel) -> None:
    delegate = Call("delegate_research", {"objective": "Weigh the tower"}, "d1")
    mesh.script.add(SUPERVISOR, Reply(calls=(delegate,)), Reply(content="No weight found."))
    mesh.script.add("Weigh the tower", HttpError(401, message="bad key"))
    mesh.script.add(REPORT, Reply(content="Unknown."))
    code, output = await finish(await quarry("ask", "How heavy is the tower?", "--address", mesh.supervisor.address))
    assert code == 0, output
    said = " ".join(output.split())  # as one line, however the terminal wrapped it
    assert f"1 delegation(s) failed: model request failed: {model.base_url} answered HTTP 401" in said
    assert "check QUARRY_WORKER_MODEL_API_KEY (or QUARRY_MODEL_API_KEY for every tier)" in said


async def test_a_supervisor_whose_model_endpoint_is_down_fails_the_run_naming_the_url_and_its_setting(
    mesh: Mesh, model: ScriptedModel
) -> None:
    await model.stop()
    code, output = await finish(await quarry("ask", "Is the model up?", "--address", mesh.supervisor.address))
    assert code == 1, output
    said = " ".join(output.split())
    assert f"run failed (provider error): model request failed: cannot reach {model.base_url}" in said
    assert "set QUARRY_SUPERVISOR_MODEL_BASE_URL (or QUARRY_MODEL_BASE_URL for every tier)" in said


async def test_doctor_reports_what_the_services_use_not_what_its_terminal_is_set_to(
    mesh: Mesh, model: ScriptedModel, site: FixtureWeb, tmp_path: Path
) -> None:
    closed = f"http://127.0.0.1:{reusable_port()}/v1"  # nothing listens there
    monitor = await build_monitor(MonitorSettings(address="127.0.0.1:0"), QuarrySettings(data_dir=tmp_path))
    # The worker this terminal knows nothing of: its model endpoint is set where the worker runs.
    lost = await build_worker(
        worker_settings("127.0.0.1:0", tmp_path / "lost.db", mesh.scratchpad_address, model, site).model_copy(
            update={"model_base_url": closed}
        ),
        QuarrySettings(data_dir=tmp_path),
    )
    env = {
        "QUARRY_DATA_DIR": str(tmp_path),
        "QUARRY_SUPERVISOR_ADDRESS": mesh.supervisor.address,
        "QUARRY_SUPERVISOR_WORKER_ADDRESSES": ",".join(mesh.worker_addresses),
        "QUARRY_SCRATCHPAD_ADDRESS": mesh.scratchpad_address,
        # This terminal's model is not the services': they answer for themselves.
        "QUARRY_MODEL_BASE_URL": closed,
    }
    async with monitor, lost:
        env["QUARRY_MONITOR_ADDRESS"] = monitor.address
        code, output = await finish(await quarry("doctor", env=env))
        assert code == 0, output
        lines = output.splitlines()
        for check in ("supervisor service", "scratchpad service", "monitor service", "supervisor model endpoint"):
            assert any(line.startswith(" ok ") and check in line for line in lines), (check, output)
        for worker in mesh.worker_addresses:
            for check in ("service", "model endpoint", "search (searxng)", "scratchpad", "database"):
                assert any(line.startswith(" ok ") and f"worker {worker} {check}" in line for line in lines), output
        assert f"model base URL: {model.base_url}  (QUARRY_WORKER_MODEL_BASE_URL or QUARRY_MODEL_BASE_URL)" in output
        assert closed not in output

        code, output = await finish(
            await quarry(
                "doctor",
                env={
                    **env,
                    "QUARRY_MODEL_BASE_URL": model.base_url,
                    "QUARRY_SUPERVISOR_WORKER_ADDRESSES": lost.address,
                },
            )
        )
        assert code == 1, output
        [failed] = [line for line in output.splitlines() if line.startswith("FAIL")]
        assert failed.startswith(f"FAIL  worker model endpoint: {closed} is not reachable"), output
        assert "QUARRY_WORKER_MODEL_BASE_URL or QUARRY_MODEL_BASE_URL" in failed
    code, output = await finish(await quarry("doctor", env=env))
    assert code == 1 and any(line.startswith("FAIL") and "monitor service" in line for line in output.splitlines())


async def test_corpus_search_prints_ranked_hits_from_every_folder(tmp_path: Path) -> None:
    for folder, name, text in [
        ("papers", "iron.md", "# Wrought iron\n\nWrought-iron towers are limited by wind load."),
        ("notes", "stone.txt", "Stone towers are limited by the crushing strength of their base."),
    ]:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / name).write_text(text)
    index = ("--index", str(tmp_path / "corpus.db"))
    for folder in ("papers", "notes"):
        code, output = await finish(await quarry("corpus", "index", str(tmp_path / folder), *index))
        assert code == 0 and "1 added" in output, output
    code, output = await finish(await quarry("corpus", "search", "wind load towers", *index))
    assert code == 0, output
    lines = output.splitlines()
    assert lines[:4] == [
        "BM25 search (no embedding model configured)",
        "1. Wrought iron",
        f"   corpus://papers/iron.md  ({(tmp_path / 'papers' / 'iron.md').resolve()})",
        "   # Wrought iron Wrought-iron towers are limited by wind load.",
    ]
    assert lines[4].startswith("2. ") and "corpus://notes/stone.txt" in lines[5]
    code, output = await finish(await quarry("corpus", "search", "towers", "--limit", "1", *index))
    assert code == 0 and len(output.splitlines()) == 4
    code, output = await finish(await quarry("corpus", "search", "aqueduct", *index))
    assert code == 1 and "no document" in output


def test_the_live_view_shows_the_worker_serving_each_delegation() -> None:
    from rich.console import Console

    from quarry.cli.ask import RunView

    view = RunView("Who?")
    for phase, message, worker_id in [
        (supervisor_pb2.RESEARCH_PHASE_WORKER_DELEGATED, "Find it", ""),
        (supervisor_pb2.RESEARCH_PHASE_WORKER_RESEARCHING, "turn 1 of 8", "worker-2"),
    ]:
        status = supervisor_pb2.ResearchStatusEvent(
            phase=phase, message=message, delegation_id="run-x.1.call", worker_id=worker_id
        )
        view.apply(supervisor_pb2.RunEvent(status=status))
    console = Console(record=True, width=160)
    console.print(view.render())
    [row] = [line for line in console.export_text().splitlines() if "Find it" in line]
    assert "worker-2" in row and "turn 1 of 8" in row


async def test_a_run_awaiting_approval_is_shown_and_approved_from_the_command_line(mesh: Mesh) -> None:
    mesh.script.add(SUPERVISOR, Reply(content="Nothing to delegate."))
    mesh.script.add(REPORT, Reply(content="Approved answer."))
    address = ("--address", mesh.supervisor.address)
    asking = await quarry("ask", "--json", "--require-approval", "--verification", "off", "Approve?", *address)
    for _ in range(200):
        runs = (await mesh.client.list_runs(state=supervisor_pb2.RUN_STATE_AWAITING_APPROVAL)).runs
        if runs:
            break
        await asyncio.sleep(0.1)
    [run] = runs
    code, shown = await finish(await quarry("runs", "show", run.run_id, *address))
    assert code == 0 and "awaiting approval" in shown and f"quarry runs approve {run.run_id}" in shown
    # The command line sends QUARRY_API_KEY: the approver's, another principal than the one who asked.
    approving = await quarry(
        "runs", "approve", run.run_id, "--comment", "fine", *address, env={"QUARRY_API_KEY": APPROVER_API_KEY}
    )
    code, decided = await finish(approving)
    assert code == 0 and f"{run.run_id}: succeeded" in decided and "decided by approver" in decided, decided
    code, output = await finish(asking)
    assert code == 0 and json.loads(output.splitlines()[-1])["completed"]["report"]["markdown"] == "Approved answer."
    code, refused = await finish(await quarry("runs", "reject", run.run_id, "--reason", "late", *address))
    assert code == 1 and "FAILED_PRECONDITION" in refused


async def test_ask_and_runs_show_and_list_print_what_a_model_wrote_literally(mesh: Mesh) -> None:
    """The question and the report come from a person and a model: markup in them is text, escape sequences
    never reach the terminal, and nothing crashes on a stray "[/]"."""
    hostile = "[bold]b[/] [/] [link=https://e.x]l[/link] \x1b[38;5;196mred\x1b[0m\x1b]0;title\x07 end"
    mesh.script.add(SUPERVISOR, Reply(content="Nothing to delegate."))
    mesh.script.add(REPORT, Reply(content=f"The report says {hostile}"))
    address = ("--address", mesh.supervisor.address)
    code, asked = await finish(await quarry("ask", f"Is {hostile}?", *address))
    [run] = (await mesh.client.list_runs()).runs
    code_show, shown_run = await finish(await quarry("runs", "show", run.run_id, *address))
    code_list, listed = await finish(await quarry("runs", "list", *address))
    for status, output in ((code, asked), (code_show, shown_run), (code_list, listed)):
        assert status == 0 and "Traceback" not in output, output
        assert "[bold]b[/] [/]" in output, output
        assert not any(sequence in output for sequence in ("\x1b[38;5;196m", "\x1b]0;", "\x07")), repr(output)
    assert "[link=https://e.x]l[/link]" in asked and "red" in shown_run


async def test_a_command_without_an_api_key_says_how_to_give_one(mesh: Mesh, tmp_path: Path) -> None:
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    listing = await quarry(
        "runs", "list", "--address", mesh.supervisor.address, env={"QUARRY_API_KEY": "", "QUARRY_DATA_DIR": str(empty)}
    )
    code, said = await finish(listing)
    assert code == 1 and "UNAUTHENTICATED" in said and "Traceback" not in said, said
    assert "set QUARRY_API_KEY" in said and "`quarry keys add`" in said and "`quarry doctor`" in said
