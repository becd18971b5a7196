"""`quarry lab watch` through a supervisor that goes away and comes back elsewhere, and at 80 columns."""

from __future__ import annotations

import contextlib
import io
from collections.abc import AsyncIterator

import grpc
import pytest
from rich.console import Console

from quarry.cli.ask import Supervisor
from quarry.cli.lab.view import CampaignView, ledger_table, watch
from quarry.errors import Unavailable
from quarry.v1 import campaign_pb2


class Away(grpc.aio.AioRpcError):
    def __init__(self) -> None:
        super().__init__(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "gone")


def event(sequence_no: int, **payload: object) -> campaign_pb2.CampaignEvent:
    return campaign_pb2.CampaignEvent(sequence_no=sequence_no, **payload)  # type: ignore[arg-type]


def row(cycle: int) -> campaign_pb2.LedgerRow:
    return campaign_pb2.LedgerRow(
        cycle=cycle, verdict=campaign_pb2.LEDGER_VERDICT_DISCARD, hypothesis=f"hypothesis {cycle} " + "x" * 80
    )


EVENTS = [event(n, ledger_recorded=row(n)) for n in (1, 2, 3)] + [
    event(4, ended=campaign_pb2.CampaignEndedEvent(state=campaign_pb2.CAMPAIGN_STATE_COMPLETED, reason="done"))
]


class FakeCampaigns:
    """One supervisor address's campaign API: it streams `events` after what it is asked for, then fails."""

    def __init__(self, events: list[campaign_pb2.CampaignEvent], *, fails_after: bool) -> None:
        self.events, self.fails_after = events, fails_after
        self.asked_after: list[int] = []

    async def get_campaign(self, campaign_id: str) -> campaign_pb2.Campaign:
        return campaign_pb2.Campaign(campaign_id=campaign_id)

    async def stream_campaign(
        self, campaign_id: str, *, after_sequence_no: int = 0, max_reconnects: int = 100
    ) -> AsyncIterator[campaign_pb2.CampaignEvent]:
        self.asked_after.append(after_sequence_no)
        for item in self.events:
            if item.sequence_no > after_sequence_no:
                yield item
        if self.fails_after:
            raise Away()


class Mesh:
    """Where the supervisor is: first at one address, then nowhere once, then at another."""

    def __init__(self) -> None:
        self.first = FakeCampaigns(EVENTS[:2], fails_after=True)
        self.second = FakeCampaigns(EVENTS, fails_after=False)
        self.finds = 0

    def supervisor(self, address: str, campaigns: FakeCampaigns | None) -> Supervisor:
        @contextlib.asynccontextmanager
        async def open_campaigns() -> AsyncIterator[FakeCampaigns]:
            if campaigns is None:
                raise Unavailable(f"no supervisor answers at {address}")
            yield campaigns

        found = Supervisor(address, lambda: None, find_again=self.find)  # type: ignore[arg-type, return-value]
        object.__setattr__(found, "campaigns", open_campaigns)
        return found

    def find(self) -> Supervisor:
        """Each look for the supervisor: where it was, then gone, then on a new port."""
        self.finds += 1
        if self.finds == 1:
            return self.supervisor("127.0.0.1:7410", self.first)
        if self.finds == 2:
            return self.supervisor("nowhere", None)
        return self.supervisor("127.0.0.1:9999", self.second)


async def test_watch_waits_for_a_supervisor_that_went_away_and_goes_on_where_it_now_is() -> None:
    mesh = Mesh()
    console = Console(file=io.StringIO(), width=80)
    code = await watch(mesh.supervisor("127.0.0.1:7410", mesh.first), "camp-1", console=console, retry_seconds=0)

    assert code == 0
    # It re-attached after the last event it showed: every ledger row once, in order, then the end.
    assert mesh.first.asked_after == [0] and mesh.second.asked_after == [2]
    assert mesh.finds == 3


async def test_watch_gives_up_after_its_bound_with_the_way_to_go_on() -> None:
    mesh = Mesh()
    gone = mesh.supervisor("nowhere", None)
    object.__setattr__(gone, "find_again", lambda: mesh.supervisor("nowhere", None))
    reachable = mesh.supervisor("127.0.0.1:7410", FakeCampaigns(EVENTS[:1], fails_after=True))
    object.__setattr__(reachable, "find_again", lambda: gone)
    with pytest.raises(Unavailable, match="go on watching with quarry lab watch camp-1"):
        await watch(
            reachable, "camp-1", console=Console(file=io.StringIO(), width=80), away_seconds=0.05, retry_seconds=0.01
        )


def test_at_80_columns_the_view_shows_what_a_person_reads_first_without_wrapping_rows() -> None:
    view = CampaignView(campaign_pb2.Campaign(campaign_id="camp-1"), rows=[row(1), row(2)])
    console = Console(file=io.StringIO(), width=80)
    console.print(view.render(80))
    lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert all(len(line) <= 80 for line in lines)
    header = next(line for line in lines if "verdict" in line)
    assert "verdict" in header and "hypothesis" in header and "commit" not in header and "tokens" not in header
    assert sum("hypothesis 1" in line for line in lines) == 1  # one line per row: cut, not wrapped
    wide = Console(file=io.StringIO(), width=160)
    wide.print(ledger_table([row(1)], "loss", 160))
    assert "commit" in wide.file.getvalue() and "tokens" in wide.file.getvalue()  # type: ignore[attr-defined]
