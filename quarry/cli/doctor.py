"""`quarry doctor`: is this installation able to answer a question? One verdict per line.

Checks each service's gRPC health, the model endpoint of each tier (reachable,
the model known to it, one tiny completion), the workers' search backend, and
each service database's migration state. Reads only: nothing is created or
upgraded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import openai
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rich.console import Console

from quarry.agent.model import ModelSettings
from quarry.cli.registry import SERVICES, databases
from quarry.cli.settings import load_settings
from quarry.client import open_channel
from quarry.config import QuarrySettings, SupervisorSettings, WorkerSettings
from quarry.db import schema_revisions
from quarry.security import Tls
from worker_svc.web.search import SearchError, http_backend

TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class Verdict:
    check: str
    ok: bool
    detail: str
    # A warning: worth knowing, not a reason the installation cannot work.
    warning: bool = False


async def service_health(name: str, address: str, tls: Tls | None) -> Verdict:
    async with open_channel(address, tls=tls) as channel:
        try:
            response = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=TIMEOUT_SECONDS / 2
            )
        except grpc.aio.AioRpcError as error:
            return Verdict(f"{name} service", False, f"{address}: {error.code().name} ({error.details()})")
    serving = response.status == health_pb2.HealthCheckResponse.SERVING
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    return Verdict(f"{name} service", serving, f"{address}: {status}")


async def model_endpoint(tier: str, settings: ModelSettings) -> list[Verdict]:
    name = f"{tier} model"
    client = openai.AsyncOpenAI(
        base_url=settings.base_url, api_key=settings.api_key, timeout=TIMEOUT_SECONDS, max_retries=0
    )
    try:
        try:
            served = [model.id async for model in client.models.list()]
        except openai.APIError as error:
            return [
                Verdict(
                    name,
                    False,
                    f"{settings.base_url} is not reachable: {error}; set {settings.setting('MODEL_BASE_URL')} "
                    "to the URL that serves the model",
                )
            ]
        verdicts = [Verdict(f"{name} endpoint", True, f"{settings.base_url} answers")]
        if settings.model not in served:
            listed = ", ".join(served[:10]) or "none"
            verdicts.append(Verdict(f"{name} name", False, f"{settings.model!r} is not served there; served: {listed}"))
            return verdicts
        verdicts.append(Verdict(f"{name} name", True, f"{settings.model!r} is served"))
        try:
            reply = await client.chat.completions.create(
                model=settings.model, messages=[{"role": "user", "content": "Reply with the word OK."}], max_tokens=4
            )
        except openai.APIError as error:
            verdicts.append(Verdict(f"{name} completion", False, f"a one-line completion failed: {error}"))
            return verdicts
        text = (reply.choices[0].message.content or "").strip() if reply.choices else ""
        verdicts.append(Verdict(f"{name} completion", True, f"answered {text[:40]!r}"))
        return verdicts
    finally:
        await client.close()


async def search_backend(settings: WorkerSettings, common: QuarrySettings) -> Verdict:
    backend = settings.search_backend
    if backend == "corpus":
        index = Path(settings.corpus_index) if settings.corpus_index else common.data_dir / "corpus.db"
        if not index.exists():
            return Verdict("search (corpus)", False, f"no index at {index}; run `quarry corpus index FOLDER`")
        try:
            with sqlite3.connect(f"file:{index}?mode=ro", uri=True) as connection:
                (documents,) = connection.execute("SELECT count(*) FROM documents").fetchone()
        except sqlite3.Error as error:
            return Verdict("search (corpus)", False, f"{index} is not a corpus index: {error}")
        return Verdict("search (corpus)", documents > 0, f"{index}: {documents} documents")
    if backend == "searxng":
        try:
            async with httpx.AsyncClient(timeout=TIMEOUT_SECONDS) as http:
                response = await http.get(
                    f"{settings.searxng_url.rstrip('/')}/search", params={"q": "test", "format": "json"}
                )
                response.raise_for_status()
                results = response.json().get("results", [])
        except (httpx.HTTPError, ValueError) as error:
            return Verdict("search (searxng)", False, f"{settings.searxng_url}: {error}")
        return Verdict("search (searxng)", True, f"{settings.searxng_url} answers ({len(results)} results for 'test')")
    if backend in ("arxiv", "semantic_scholar"):
        return await _literature(settings)
    if not settings.search_api_key:
        return Verdict(f"search ({backend})", False, "QUARRY_WORKER_SEARCH_API_KEY is not set")
    return Verdict(f"search ({backend})", True, "an API key is set (not called: it would spend quota)", warning=True)


async def _literature(settings: WorkerSettings) -> Verdict:
    """One small search, as the workers would run it: these services are free to ask."""
    check = f"search ({settings.search_backend})"
    url = settings.arxiv_url if settings.search_backend == "arxiv" else settings.semantic_scholar_url
    async with httpx.AsyncClient(timeout=TIMEOUT_SECONDS) as http:
        backend = http_backend(settings.model_copy(update={"search_seconds": TIMEOUT_SECONDS}), http)
        assert backend is not None
        try:
            results = await backend.search("test", 1)
        except SearchError as error:
            return Verdict(check, False, f"{url}: {error}")
    return Verdict(check, True, f"{url} answers ({len(results)} results for 'test')")


def database_state(name: str, url: str, migrations: Path, version_table: str) -> Verdict:
    check = f"{name} database"
    try:
        current, head = schema_revisions(url, migrations, version_table)
    except Exception as error:  # any driver error is the verdict
        return Verdict(check, False, f"cannot read it: {type(error).__name__}: {error}")
    if current is None:
        return Verdict(check, True, "not created yet; the service creates it on start", warning=True)
    if current != head:
        return Verdict(check, False, f"at revision {current}, the code needs {head}; restart the service to upgrade")
    return Verdict(check, True, f"at the newest revision ({head})")


def _health_checks(addresses: Mapping[str, Sequence[str]], tls: Tls | None) -> list[Awaitable[Verdict]]:
    """One per service process, at its address (the workers: maybe several).

    The front door first, then what it depends on (the reverse of the start order).
    """
    checks: list[Awaitable[Verdict]] = []
    for name in reversed(SERVICES):
        checks.extend(service_health(name, address, tls) for address in addresses[name])
    return checks


def _database_checks(common: QuarrySettings) -> list[Awaitable[Verdict]]:
    checks: list[Awaitable[Verdict]] = []
    for spec, migrations in databases():
        url = spec.load_settings().resolved_database_url(common.data_dir)
        scripts, table = migrations.scripts_path(), migrations.version_table_name()
        checks.append(asyncio.to_thread(database_state, spec.name, url, scripts, table))
    return checks


async def diagnose(
    common: QuarrySettings, report: Callable[[Verdict], None], addresses: Mapping[str, Sequence[str]]
) -> list[Verdict]:
    """`addresses`: where each service is (the command line finds them)."""
    supervisor, worker = load_settings(SupervisorSettings), load_settings(WorkerSettings)
    checks: list[Awaitable[Verdict | list[Verdict]]] = [*_health_checks(addresses, Tls.from_settings(common))]
    tiers = {"supervisor": ModelSettings.for_tier(supervisor, common), "worker": ModelSettings.for_tier(worker, common)}
    # One endpoint for both tiers is checked once, and its errors name the shared settings.
    shared = dataclasses.replace(tiers["supervisor"], tier="shared", env_prefix="")
    if shared == dataclasses.replace(tiers["worker"], tier="shared", env_prefix=""):
        checks.append(model_endpoint("shared", shared))
    else:
        checks.extend(model_endpoint(tier, settings) for tier, settings in tiers.items())
    checks.append(search_backend(worker, common))
    checks.extend(_database_checks(common))
    verdicts: list[Verdict] = []
    for result in await asyncio.gather(*checks):
        for verdict in result if isinstance(result, list) else [result]:
            verdicts.append(verdict)
            report(verdict)
    return verdicts


def print_verdict(console: Console) -> Callable[[Verdict], None]:
    def report(verdict: Verdict) -> None:
        mark = "[yellow]warn[/]" if verdict.warning else "[green] ok [/]" if verdict.ok else "[red]FAIL[/]"
        console.print(f"{mark}  {verdict.check}: {verdict.detail}", highlight=False)

    return report


def doctor(common: QuarrySettings, addresses: Mapping[str, Sequence[str]]) -> int:
    console = Console()
    verdicts = asyncio.run(diagnose(common, print_verdict(console), addresses))
    failed = [v for v in verdicts if not v.ok]
    console.print(f"{len(failed)} problem(s) found" if failed else "everything needed to answer a question is in place")
    return 1 if failed else 0
