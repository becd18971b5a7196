"""The cost of authenticating the public API: the check itself, and a unary RPC with and without it.

    python3 bench/api_auth.py [--checks 20000] [--calls 2000] [--rounds 5] [--stored-keys 1000]

The check: ApiAuthentication's per-call work (read the bearer key, SHA-256 it, look the digest up in
the key cache, compare the roles with the method's, set the principal), timed call by call over
`checks` calls split over `rounds` rounds, a static key and a key from the database's cache
(`stored-keys` keys loaded; the cache fresh, as in the steady state).
The round trip: GetRun on a SupervisorService stand-in that answers at once, served on 127.0.0.1 by
quarry.server.create_server with the supervisor's access table and without any authentication, each
server taking `calls` sequential calls a round. Every round times both keys and both servers, in an
order that rotates between rounds (bench/rounds.py), so drift on a shared machine hits all alike;
the authenticated / open round trip ratio and difference are taken within a round. Prints the median
(range over rounds) of each round's p50 and p99 of the check, and of each round's median round trip.
Figures only (target: the check <= 0.1 ms = 100 µs).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import grpc
from harness import arguments, percentile
from rounds import MIN_ROUNDS, Rounds

from quarry.api_auth import ALL_ROLES, ApiAuthentication, ApiKeys, ApiPrincipal, api_key_digest, new_api_key
from quarry.clients.channels import open_channel
from quarry.identity import ApiRole
from quarry.server import ServiceRegistration, create_server
from quarry.v1 import supervisor_pb2, supervisor_pb2_grpc
from supervisor_svc.access.guard import SUPERVISOR_ACCESS
from supervisor_svc.service import SERVICE_NAME


class _Context:
    """What the check reads of a call: its metadata and (empty) TLS auth context."""

    def __init__(self, key: str) -> None:
        self._metadata = (("authorization", f"Bearer {key}"),)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}


class _Runs(supervisor_pb2_grpc.SupervisorServiceServicer):
    async def GetRun(self, request: supervisor_pb2.GetRunRequest, context: Any) -> supervisor_pb2.GetRunResponse:
        return supervisor_pb2.GetRunResponse(run=supervisor_pb2.Run(run_id=request.run_id))


def _guard(static_key: str, stored_keys: int) -> tuple[ApiAuthentication, str]:
    stored = {
        api_key_digest(new_api_key()): ApiPrincipal(f"p{n}", frozenset({ApiRole.READER})) for n in range(stored_keys)
    }
    stored_key = new_api_key()
    stored[api_key_digest(stored_key)] = ApiPrincipal("stored", frozenset({ApiRole.RESEARCHER}))

    async def load() -> dict[bytes, ApiPrincipal]:
        return stored

    keys = ApiKeys({api_key_digest(static_key): ApiPrincipal("bench", ALL_ROLES)}, load, refresh_seconds=3600)
    return ApiAuthentication({SERVICE_NAME: SUPERVISOR_ACCESS}, keys), stored_key


async def _check_costs(guard: ApiAuthentication, key: str, calls: int) -> list[float]:
    check = guard.checker("GetRun", SUPERVISOR_ACCESS["GetRun"])
    context = _Context(key)
    await check(context)  # loads the cache
    values = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        await check(context)
        values.append((time.perf_counter_ns() - start) / 1e6)
    return values


async def _round_trips(address: str, key: str, calls: int) -> float:
    async with open_channel(address, token=key) as channel:
        stub = supervisor_pb2_grpc.SupervisorServiceStub(channel)
        request = supervisor_pb2.GetRunRequest(run_id="run-" + "0" * 32)
        for _ in range(50):  # warm-up: the connection, the handler caches
            await stub.GetRun(request)
        values = []
        for _ in range(calls):
            start = time.perf_counter_ns()
            await stub.GetRun(request)
            values.append((time.perf_counter_ns() - start) / 1e6)
    return statistics.median(values)


async def main_async(checks: int, calls: int, count: int, stored_keys: int) -> None:
    if count < 1 or checks < count:
        raise SystemExit("--rounds must be at least 1, and --checks at least --rounds")
    key = new_api_key()
    guard, stored_key = _guard(key, stored_keys)
    keys = {"static key": key, f"stored key ({stored_keys + 1} in the cache)": stored_key}

    def register(server: grpc.aio.Server) -> None:
        # The generated stubs mark every method abstract; the stand-in answers GetRun alone (the rest: UNIMPLEMENTED).
        supervisor_pb2_grpc.add_SupervisorServiceServicer_to_server(_Runs(), server)  # type: ignore[abstract]

    servers = {}
    for label, api in (("without authentication", None), ("with authentication", guard)):
        bound, port = create_server("127.0.0.1:0", [ServiceRegistration(SERVICE_NAME, register)], api=api)
        await bound.server.start()
        servers[label] = (bound, f"127.0.0.1:{port}")
    rounds = Rounds("api_auth", count)
    try:
        for index in rounds:
            for label in rounds.order(list(keys), index):
                values = await _check_costs(guard, keys[label], checks // count)
                # In microseconds: the table prints two decimals, and the check takes a few thousandths of a ms.
                rounds.record(f"check p50, {label}", percentile(values, 0.5) * 1000, "µs")
                rounds.record(f"check p99, {label}", percentile(values, 0.99) * 1000, "µs")
            trips = {}
            for label in rounds.order(list(servers), index):
                trips[label] = await _round_trips(servers[label][1], key, calls)
            for label, median in trips.items():
                rounds.record(f"GetRun round trip {label}", median, "ms")
            rounds.record(
                "round trip added by authentication",
                trips["with authentication"] - trips["without authentication"],
                "ms",
            )
    finally:
        for bound, _ in servers.values():
            await bound.server.stop(None)
    rounds.ratio(
        "round trip with / without authentication",
        "GetRun round trip with authentication",
        "GetRun round trip without authentication",
    )
    print(f"{checks // count} checks a key and {calls} sequential GetRun calls a server, each round")
    rounds.report()


def main() -> None:
    args = arguments(__doc__ or "", checks=20000, calls=2000, rounds=MIN_ROUNDS, stored_keys=1000)
    asyncio.run(main_async(args.checks, args.calls, args.rounds, args.stored_keys))


if __name__ == "__main__":
    main()
