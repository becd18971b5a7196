"""The docs' terminal capture of `quarry ask`, regenerated from a real run so that it never goes stale.

    python3 scripts/capture_terminal.py     # writes docs/images/quarry-ask.svg

Starts a mesh of `quarry serve` processes (scratchpad, two workers, supervisor; SQLite in a temporary
directory) against the tests' scripted model and fixture web, asks it a question with `quarry ask --json`,
and renders the events that command printed with the code its live view and its summary use (RunView,
the summary) into a console that records, which rich exports as SVG. The answer is scripted; everything
between the question and the report is the real mesh.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' fakes: the scripted model, the fixture web, the process mesh

from google.protobuf import json_format  # noqa: E402
from rich.console import Console  # noqa: E402

from quarry.api_auth import ALL_ROLES, new_api_key, static_key_entry  # noqa: E402
from quarry.cli.ask import RunView, summary  # noqa: E402
from quarry.v1 import supervisor_pb2  # noqa: E402
from tests.fakes.choreography import REPORT, SUPERVISOR, Choreography, append_finding  # noqa: E402
from tests.fakes.loopback import served_in_thread  # noqa: E402
from tests.fakes.openai_server import Call, Reply, ScriptedModel  # noqa: E402
from tests.fakes.web_server import FixtureWeb  # noqa: E402
from tests.supervisor_svc.conftest import processes  # noqa: E402

QUESTION = "How tall is the Eiffel Tower?"
PAGE = (
    "<html><head><title>The Eiffel Tower</title></head><body><h1>The Eiffel Tower</h1>"
    "<p>Built for the 1889 World's Fair, the tower is 330 metres tall since its last antenna was fitted.</p>"
    "</body></html>"
)
OUTPUT = ROOT / "docs" / "images" / "quarry-ask.svg"


def script(model: ScriptedModel, site: FixtureWeb) -> None:
    choreography = Choreography()
    model.default = choreography
    page = site.add("/eiffel.html", PAGE)
    choreography.add(
        SUPERVISOR,
        Reply(calls=(Call("delegate_research", {"objective": "Find the tower's height, with a source"}, "d1"),)),
        Reply(content="One verified finding answers the question."),
    )
    choreography.add(
        "Find the tower's height, with a source",
        Reply(calls=(Call("read_web_page", {"url": page}, "r1"),)),
        Reply(calls=(append_finding("f1", "The Eiffel Tower is 330 m tall.", page, "the tower is 330 metres tall"),)),
        Reply(content="Promoted one finding: the tower's height, quoted from the page."),
    )
    choreography.add(REPORT, Reply(content="The Eiffel Tower is 330 m tall, antennas included [1]."))


def main() -> None:
    key = new_api_key()
    os.environ["QUARRY_API_KEY"] = key
    os.environ["QUARRY_SUPERVISOR_API_KEYS"] = static_key_entry("docs", ALL_ROLES, key)
    with (
        tempfile.TemporaryDirectory() as workdir,
        served_in_thread(ScriptedModel()) as model,
        served_in_thread(FixtureWeb()) as site,
    ):
        script(model, site)
        with processes(Path(workdir), model, site) as mesh:
            done = subprocess.run(
                [sys.executable, "-m", "quarry", "ask", "--json", "--address", mesh.supervisor.address, QUESTION],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
    if done.returncode != 0:
        raise SystemExit(f"quarry ask failed ({done.returncode}): {done.stderr}")
    events = [json_format.ParseDict(json.loads(line), supervisor_pb2.RunEvent()) for line in done.stdout.splitlines()]
    console = Console(record=True, width=100, force_terminal=True, color_system="truecolor")
    view = RunView(QUESTION, run_id="run-…")
    for event in events:
        view.apply(event)
    console.print(f'[bold]$ quarry ask "{QUESTION}"[/]')
    console.print(view.render())
    summary(console, events[-1])
    OUTPUT.write_text(console.export_svg(title="quarry ask"))
    print(f"wrote {OUTPUT.relative_to(ROOT)} ({len(events)} events)")


if __name__ == "__main__":
    main()
