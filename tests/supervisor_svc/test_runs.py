"""Research runs through the public API, on a mesh in this process."""

from __future__ import annotations

from quarry.v1 import supervisor_pb2
from tests.fakes.choreography import REPORT, SUPERVISOR
from tests.fakes.openai_server import Call, Reply
from tests.supervisor_svc.conftest import Mesh


def finding(url: str, content: str, excerpt: str, call_id: str) -> Call:
    return Call(
        "append_scratchpad",
        {"kind": "finding", "content": content, "sources": [{"url": url, "excerpt": excerpt}]},
        call_id,
    )


def researcher(mesh: Mesh, objective: str, page: str, content: str, excerpt: str) -> None:
    url = f"{mesh.site.base_url}{page}"
    mesh.script.add(
        objective,
        Reply(calls=(Call("read_web_page", {"url": url}, "read"),)),
        Reply(calls=(finding(url, content, excerpt, "promote"),)),
        Reply(content=f"Promoted: {content}"),
    )


async def test_a_run_delegates_and_reports_with_verified_citations(mesh: Mesh) -> None:
    researcher(mesh, "Find the height", "/article.html", "The tower is 330 m tall.", "The tower is 330 metres tall")
    mesh.script.add(
        SUPERVISOR,
        Reply(content="Delegating.", calls=(Call("delegate_research", {"objective": "Find the height"}, "d1"),)),
        Reply(calls=(Call("read_scratchpad", {}, "r1"),)),
        Reply(content="The height is known."),
    )
    mesh.script.add(REPORT, Reply(content="The tower is 330 metres tall [1]. It is blue [4].", chunks=6))
    run = await mesh.client.start_run("How tall is the Eiffel Tower?")
    events = await mesh.events(run.run_id)
    kinds = [event.WhichOneof("payload") for event in events]
    assert kinds[-1] == "completed", events[-1]
    assert [event.sequence_no for event in events] == list(range(1, len(events) + 1))
    completed = events[-1].completed
    assert completed.report.markdown == "The tower is 330 metres tall [1]. It is blue ."
    assert completed.removed_citations == 1
    [citation] = completed.report.citations
    assert citation.number == 1 and citation.url.endswith("/article.html")
    assert citation.excerpt == "The tower is 330 metres tall"
    assert "".join(e.content.delta for e in events if e.HasField("content")) == completed.report.markdown
    stored = await mesh.client.get_run(run.run_id)
    assert stored.state == supervisor_pb2.RUN_STATE_SUCCEEDED
    assert stored.report == completed.report
    assert stored.last_event_sequence_no == events[-1].sequence_no
