"""`quarry doctor`: is this installation able to answer a question? One verdict per line.

Asks each running service what it works with and what it finds when it checks, from where it
runs (DiagnosticsService): its model endpoint and model, its search backend, the services it
calls, its database. The terminal's own settings only say where the services are (and are checked
for validity): what a service uses may differ from them, and its own answer is what counts.
Reads only: nothing is created or upgraded.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rich.console import Console

from quarry.cli.credentials import Credential
from quarry.cli.registry import SERVICES
from quarry.cli.terminal import safe_markup, shown
from quarry.clients.channels import open_channel
from quarry.config import CONFIG_FILE_ENV, ConfigurationError, QuarrySettings
from quarry.security import Tls
from quarry.v1 import diagnostics_pb2, diagnostics_pb2_grpc

# A service's checks take a few seconds at most (quarry.diagnostics.CHECK_SECONDS); this leaves room.
TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class Verdict:
    check: str
    ok: bool
    detail: str
    # A warning: worth knowing, not a reason the installation cannot work.
    warning: bool = False
    # Printed under the verdict: what the service works with.
    notes: tuple[str, ...] = ()


def targets(found: Mapping[str, Sequence[str]]) -> list[tuple[str, str]]:
    """(service, address) for each service where the command line found it (`quarry.cli.commands.
    service_addresses`: this terminal's settings, or the state file of a running `quarry up`); the workers
    maybe several. The front door first, then what it depends on."""
    return [(name, address) for name in reversed(SERVICES) for address in found[name]]


def _address_setting(name: str) -> str:
    return "QUARRY_SUPERVISOR_WORKER_ADDRESSES" if name == "worker" else f"QUARRY_{name.upper()}_ADDRESS"


def configuration() -> Verdict:
    """This terminal's settings, valid for every service; a ConfigurationError (one line, status 2) when not,
    as for every command."""
    problems = []
    for spec in SERVICES.values():
        try:
            spec.load_settings()
        except ConfigurationError as error:
            problems.append(f"{spec.name}: {error}")
    if problems:
        raise ConfigurationError("; ".join(problems))
    source = os.environ.get(CONFIG_FILE_ENV) or "the environment only"
    return Verdict("configuration", True, f"valid here ({source}); used only to find the services")


def _check_verdict(label: str, check: diagnostics_pb2.DiagnosticCheck) -> Verdict:
    warning = check.status == diagnostics_pb2.DIAGNOSTIC_STATUS_WARNING
    # A status this build does not know counts as a failure: nothing vouches for it.
    ok = warning or check.status == diagnostics_pb2.DIAGNOSTIC_STATUS_OK
    detail = check.detail
    if check.setting and check.status != diagnostics_pb2.DIAGNOSTIC_STATUS_OK:
        detail += f" (set by {check.setting} where the {label} runs)"
    return Verdict(f"{label} {check.name}", ok, detail, warning=warning)


def _fact_note(fact: diagnostics_pb2.DiagnosticFact) -> str:
    return f"{fact.name}: {fact.value}" + (f"  ({fact.setting})" if fact.setting else "")


async def ask_service(name: str, label: str, address: str, tls: Tls | None) -> list[Verdict]:
    """The service's health, what it works with, and each of its own checks."""
    service = f"{label} service"
    async with open_channel(address, tls=tls) as channel:
        try:
            health = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=TIMEOUT_SECONDS
            )
            report = await diagnostics_pb2_grpc.DiagnosticsServiceStub(channel).GetDiagnostics(
                diagnostics_pb2.GetDiagnosticsRequest(), timeout=TIMEOUT_SECONDS
            )
        except grpc.aio.AioRpcError as error:
            hint = f"is it running? This terminal looks for it at {_address_setting(name)}"
            return [Verdict(service, False, f"{address}: {error.code().name} ({error.details()}); {hint}")]
    if report.service != name:
        found = report.service or "an unnamed service"
        return [Verdict(service, False, f"{address} is {found}, not the {name}; check {_address_setting(name)}")]
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(health.status)
    serving = health.status == health_pb2.HealthCheckResponse.SERVING
    notes = tuple(map(_fact_note, report.facts))
    verdicts = [Verdict(service, serving, f"{address}: {status}, quarry {report.version}", notes=notes)]
    return verdicts + [_check_verdict(label, check) for check in report.checks]


def api_key(credential: Credential) -> Verdict:
    """Which API key the client commands send (never the key): a warning when none, as the API refuses them."""
    if credential.source:
        return Verdict("API key", True, f"the client commands send the key from {credential.source}")
    return Verdict(
        "API key",
        True,
        "none found: the supervisor refuses the client commands; set QUARRY_API_KEY (a key made with "
        "`quarry keys add`), or run them where `quarry up` wrote its key",
        warning=True,
    )


async def diagnose(
    common: QuarrySettings,
    report: Callable[[Verdict], None],
    found: Mapping[str, Sequence[str]],
    credential: Credential,
) -> list[Verdict]:
    verdicts = [configuration(), api_key(credential)]
    for verdict in verdicts:
        report(verdict)
    addresses = targets(found)
    tls = Tls.from_settings(common)
    several = Counter(name for name, _ in addresses)
    labels = [name if several[name] == 1 else f"{name} {address}" for name, address in addresses]
    answers = await asyncio.gather(
        *(ask_service(name, label, address, tls) for (name, address), label in zip(addresses, labels, strict=True))
    )
    for answer in answers:
        for verdict in answer:
            verdicts.append(verdict)
            report(verdict)
    return verdicts


def print_verdict(console: Console) -> Callable[[Verdict], None]:
    def report(verdict: Verdict) -> None:
        mark = "[yellow]warn[/]" if verdict.warning else "[green] ok [/]" if verdict.ok else "[red]FAIL[/]"
        check, detail = safe_markup(verdict.check), safe_markup(verdict.detail)
        console.print(f"{mark}  {check}: {detail}", highlight=False, soft_wrap=True)
        for note in verdict.notes:
            console.print(shown(f"        {note}", "dim"), highlight=False, soft_wrap=True)

    return report


def doctor(common: QuarrySettings, found: Mapping[str, Sequence[str]], credential: Credential) -> int:
    console = Console()
    verdicts = asyncio.run(diagnose(common, print_verdict(console), found, credential))
    failed = [v for v in verdicts if not v.ok]
    console.print(f"{len(failed)} problem(s) found" if failed else "everything needed to answer a question is in place")
    return 1 if failed else 0
