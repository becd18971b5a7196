"""Records the replay fixtures: `python3 -m tests.replays.record` (from the repository root).

Each scenario runs once in an in-process mesh over the scripted model and the fixture web, and its export
is written to tests/replays/NAME.qrun.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

from tests.conftest import TEST_API_KEY, TEST_API_KEYS
from tests.fakes.openai_server import ScriptedModel
from tests.fakes.web_server import FixtureWeb
from tests.replays.scenarios import SCENARIOS, Scenario
from tests.supervisor_svc.conftest import in_process_mesh

FIXTURES = Path(__file__).parent


async def record(scenario: Scenario, workdir: Path) -> bytes:
    async with ScriptedModel() as model, FixtureWeb() as site:
        script = scenario.script(site)
        database = f"sqlite:///{workdir / 'supervisor.db'}"
        async with in_process_mesh(workdir, model, site, database, {}, script) as mesh:
            run = await mesh.client.start_run(scenario.question, options=scenario.options)
            events = await mesh.events(run.run_id)
            if not events[-1].HasField("completed"):
                raise SystemExit(f"{scenario.name}: the run did not complete: {events[-1]}")
            return b"".join([piece async for piece in mesh.client.export_run(run.run_id)])


def main() -> int:
    # The settings the test suite runs its meshes with (tests/conftest.py).
    for name in [name for name in os.environ if name.startswith("QUARRY_")]:
        del os.environ[name]
    os.environ.update(
        {"QUARRY_MESH_INSECURE": "true", "QUARRY_SUPERVISOR_API_KEYS": TEST_API_KEYS, "QUARRY_API_KEY": TEST_API_KEY}
    )
    for scenario in SCENARIOS:
        with tempfile.TemporaryDirectory() as workdir:
            data = asyncio.run(record(scenario, Path(workdir)))
        path = FIXTURES / f"{scenario.name}.qrun"
        path.write_bytes(data)
        print(f"{path}: {len(data)} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
