"""Modules that moved keep their old import paths for one release, as re-exports of the new ones."""

from __future__ import annotations

import quarry.client
import quarry.mesh
import quarry.mesh_auth
import quarry.research_records
from quarry.clients.campaigns import CampaignsClient
from quarry.clients.runs import RunsClient
from quarry.records import base, research


def test_the_clients_keep_their_old_names() -> None:
    assert quarry.client.QuarryClient is RunsClient
    assert quarry.client.CampaignClient is CampaignsClient
    for name in quarry.client.__all__:
        assert getattr(quarry.client, name) is not None


def test_the_research_records_and_mesh_authentication_are_re_exported() -> None:
    moved_to_base = {"SCHEMA_VERSION", "RecordError", "record_problems"}
    assert set(quarry.research_records.__all__) == {*research.__all__, *moved_to_base}
    assert quarry.research_records.ClaimVerdict is research.ClaimVerdict
    assert quarry.research_records.RecordError is base.RecordError
    assert quarry.mesh.__all__ == quarry.mesh_auth.__all__
    assert all(getattr(quarry.mesh, name) is getattr(quarry.mesh_auth, name) for name in quarry.mesh_auth.__all__)
