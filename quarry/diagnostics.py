"""A running service's account of itself: the settings it works with, and checks it runs from where it runs.

Every server serves DiagnosticsService next to health (quarry.server registers it); each service's
builder supplies its `Diagnostics`. `quarry doctor` asks the services rather than reading the
environment of its own terminal, which may differ from theirs.

The service is open like health, so a report holds nothing secret: no API key, token or password,
URLs without their credentials, a database as its kind and place. And an open RPC must not be a
way to flood what the service depends on: each check is bounded in time, never runs twice at once,
asks for the least that answers the question (a model endpoint's model list, never a completion),
and a report is reused for a few seconds.
"""

from __future__ import annotations

import asyncio
import enum
import importlib.metadata
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic_settings import BaseSettings

from quarry.clients.channels import Dialer
from quarry.config import ModelTier, QuarrySettings, ServiceSettings

if TYPE_CHECKING:
    import httpx

    from quarry.agent.model import ModelSettings

__all__ = [
    "CHECK_SECONDS",
    "REUSE_SECONDS",
    "Check",
    "Diagnoser",
    "Diagnostics",
    "Fact",
    "Finding",
    "Report",
    "Status",
    "database_diagnostics",
    "model_diagnostics",
    "peer_check",
    "public_url",
    "setting_name",
]

log = logging.getLogger(__name__)

# Each check's limit. The checks of a report run at once, so this bounds the whole report too.
CHECK_SECONDS = 3.0
# What a check asks of a dependency is given a little less, so that its own error is what gets reported.
_CALL_SECONDS = CHECK_SECONDS * 0.8
# A report is reused for this long: however often the RPC is called, the checks run at most this often.
REUSE_SECONDS = 5.0


class Status(enum.Enum):
    OK = "ok"
    # Works as far as the service can tell, with something worth knowing.
    WARNING = "warning"
    FAILED = "failed"


@dataclass(frozen=True)
class Finding:
    """What one check found; `setting` names what to change when it is not OK."""

    status: Status
    detail: str
    setting: str = ""


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[], Awaitable[Finding]]


@dataclass(frozen=True)
class Fact:
    """A setting in effect that is not secret, and the setting that decides it."""

    name: str
    value: str
    setting: str = ""


@dataclass(frozen=True)
class Diagnostics:
    """What a service's builder gives its host to report: its name, its facts and its checks."""

    service: str
    facts: Sequence[Fact] = ()
    checks: Sequence[Check] = ()


@dataclass(frozen=True)
class Report:
    service: str
    version: str
    facts: tuple[Fact, ...]
    findings: tuple[tuple[str, Finding], ...]  # (check name, what it found), in the order of the checks
    checked_at: datetime


def _version() -> str:
    try:
        return importlib.metadata.version("quarry")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class Diagnoser:
    """Runs a service's checks, bounded in time, and reuses the report for `reuse_seconds`.

    Callers that come while a report is being made wait for it. A check still running from an
    earlier report (one that overran its limit) is waited on again, never started a second time.
    """

    def __init__(
        self,
        diagnostics: Diagnostics,
        *,
        check_seconds: float = CHECK_SECONDS,
        reuse_seconds: float = REUSE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._diagnostics = diagnostics
        self._check_seconds = check_seconds
        self._reuse_seconds = reuse_seconds
        self._clock = clock
        self._version = _version()
        self._lock = asyncio.Lock()
        self._running: dict[int, asyncio.Task[Finding]] = {}
        self._last: Report | None = None
        self._made_at = 0.0

    async def report(self) -> Report:
        async with self._lock:
            if self._last is None or self._clock() - self._made_at >= self._reuse_seconds:
                checks = self._diagnostics.checks
                findings = await asyncio.gather(*(self._finding(index, check) for index, check in enumerate(checks)))
                self._last = Report(
                    service=self._diagnostics.service,
                    version=self._version,
                    facts=tuple(self._diagnostics.facts),
                    findings=tuple((check.name, finding) for check, finding in zip(checks, findings, strict=True)),
                    checked_at=datetime.now(UTC),
                )
                self._made_at = self._clock()
            return self._last

    async def _finding(self, index: int, check: Check) -> Finding:
        task = self._running.get(index)
        if task is None or task.done():
            task = asyncio.create_task(_run(check), name=f"diagnostics: {check.name}")
            self._running[index] = task
        try:
            # Shielded: a check that overruns keeps running (a thread cannot be stopped anyway), and the
            # next report waits on it instead of starting another.
            return await asyncio.wait_for(asyncio.shield(task), self._check_seconds)
        except TimeoutError:
            return Finding(Status.FAILED, f"no answer within {self._check_seconds:g} s")


async def _run(check: Check) -> Finding:
    try:
        return await check.run()
    except Exception as error:
        # A check that breaks is a failed check, not a failed RPC; the message may hold what must not be shown.
        log.exception("diagnostics check %r failed", check.name)
        return Finding(Status.FAILED, f"the check itself failed ({type(error).__name__}); see the service's log")


def setting_name(settings: BaseSettings, field: str) -> str:
    """The environment variable of one field, e.g. QUARRY_WORKER_SEARCH_BACKEND."""
    return f"{settings.model_config.get('env_prefix', '')}{field.upper()}"


def public_url(url: str) -> str:
    """The URL without what may be secret in it: user, password, query and fragment."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return "(not a valid URL)"
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    netloc = f"{host}:{port}" if port is not None else host
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _masked(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def _reason(error: BaseException, secrets: Sequence[str]) -> str:
    """An error as a short reason, its first line only, without any of `secrets`."""
    lines = str(error).strip().splitlines()
    return _masked(f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__, secrets)


# --- the model endpoint ---------------------------------------------------------------------------


def _either(tiers: Sequence[ModelTier], common: QuarrySettings, field: str) -> str:
    """The variables that set `field` for a model, first to last: e.g. "A, B or QUARRY_MODEL_NAME"."""
    return f"{', '.join(setting_name(tier, field) for tier in tiers)} or {setting_name(common, field)}"


def model_diagnostics(
    tier: ModelTier, common: QuarrySettings, *, fallback: ModelTier | None = None, label: str = ""
) -> tuple[list[Fact], Check]:
    """The model a tier calls (endpoint and name), and a check that the endpoint serves that model.

    `fallback` stands in for the settings `tier` leaves unset, as in `ModelSettings.for_tier`; `label`
    tells the tier apart where a service calls more than one (its facts and check end in "(label)").
    """
    # Imported here: the HTTP stack is for services that call a model, not for every process that
    # imports diagnostics (the scratchpad, the command line).
    from quarry.agent.model import ModelSettings

    settings = ModelSettings.for_tier(tier, common, fallback=fallback)
    tiers = (tier,) if fallback is None else (tier, fallback)
    base_url, model, api_key = (_either(tiers, common, f) for f in ("model_base_url", "model_name", "model_api_key"))
    suffix = f" ({label})" if label else ""
    facts = [
        Fact(f"model base URL{suffix}", public_url(settings.base_url), base_url),
        Fact(f"model name{suffix}", settings.model, model),
    ]

    async def run() -> Finding:
        return await _model_endpoint(settings, base_url=base_url, model=model, api_key=api_key)

    return facts, Check(f"model endpoint{suffix}", run)


async def _model_endpoint(settings: ModelSettings, *, base_url: str, model: str, api_key: str) -> Finding:
    import httpx

    from quarry.agent.model import v1_hint

    shown = public_url(settings.base_url)
    secrets = [settings.api_key, urllib.parse.urlsplit(settings.base_url).password or ""]
    try:
        async with httpx.AsyncClient(timeout=_CALL_SECONDS) as http:
            response = await http.get(
                settings.base_url.rstrip("/") + "/models", headers={"authorization": f"Bearer {settings.api_key}"}
            )
    except (httpx.HTTPError, httpx.InvalidURL) as error:
        return Finding(Status.FAILED, f"{shown} is not reachable: {_reason(error, secrets)}", base_url)
    code = response.status_code
    if code in (401, 403):
        return Finding(Status.FAILED, f"{shown} refused the API key (HTTP {code})", api_key)
    if code == 404 and (hint := v1_hint(settings.base_url)):
        return Finding(Status.FAILED, f"{shown} has no /models (HTTP 404): {hint}", base_url)
    if code == 404:
        # Some OpenAI-compatible servers have no model list; the endpoint answers all the same.
        return Finding(Status.WARNING, f"{shown} answers but lists no models (HTTP 404); the name is unchecked")
    if not response.is_success:
        return Finding(Status.FAILED, f"{shown} answered HTTP {code}", base_url)
    served = _model_ids(response)
    if served is None:
        return Finding(Status.WARNING, f"{shown} answers, but not with a model list; the name is unchecked")
    if settings.model not in served:
        listed = ", ".join(served[:10]) or "none"
        return Finding(Status.FAILED, f"{settings.model!r} is not served at {shown}; it serves: {listed}", model)
    return Finding(Status.OK, f"{shown} serves {settings.model!r}")


def _model_ids(response: httpx.Response) -> list[str] | None:
    """The ids of an OpenAI-shaped model list; None for any other answer."""
    try:
        data: Any = response.json()
    except ValueError:
        return None
    models = data.get("data") if isinstance(data, dict) else None
    if not isinstance(models, list):
        return None
    return [str(entry["id"]) for entry in models if isinstance(entry, dict) and "id" in entry]


# --- other services and the database --------------------------------------------------------------


def peer_check(name: str, address: str, dial: Dialer, setting: str) -> Check:
    """Whether a service this one calls answers its health check, reached the way this one reaches it."""

    async def run() -> Finding:
        async with dial.channel(address) as channel:
            try:
                response = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=_CALL_SECONDS
                )
            except grpc.aio.AioRpcError as error:
                return Finding(Status.FAILED, f"{error.code().name} at {address} ({error.details()})", setting)
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
        if response.status != health_pb2.HealthCheckResponse.SERVING:
            return Finding(Status.FAILED, f"{status} at {address}", setting)
        return Finding(Status.OK, f"{status} at {address}")

    return Check(name, run)


def database_diagnostics(
    settings: ServiceSettings, common: QuarrySettings, migrations: Path, version_table: str
) -> tuple[Fact, Check]:
    """The service's database (its kind and place, never its URL) and a check that it is reachable and
    at the revision this code has."""
    # Loaded here: the client commands read diagnostics' types, and SQLAlchemy costs them a third of a second.
    from sqlalchemy.engine import make_url

    from quarry.migrations import schema_revisions

    url = settings.resolved_database_url(common.data_dir)
    setting = setting_name(settings, "database_url")
    parsed = make_url(url)
    kind = parsed.get_backend_name()
    place = parsed.database if kind == "sqlite" else f"{parsed.host}:{parsed.port or 5432}/{parsed.database}"

    async def run() -> Finding:
        try:
            current, head = await asyncio.to_thread(schema_revisions, url, migrations, version_table)
        except Exception as error:  # any driver error is the finding
            return Finding(Status.FAILED, f"cannot read it: {_reason(error, [parsed.password or ''])}", setting)
        if current != head:
            return Finding(
                Status.FAILED,
                f"at revision {current or 'none'}, while this service's code has {head}: it changed under the "
                "running service; restart it (a database a newer release upgraded needs that release)",
                setting,
            )
        return Finding(Status.OK, f"reachable, at the newest revision ({head})")

    return Fact("database", f"{kind} ({place})", setting), Check("database", run)
