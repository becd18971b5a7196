"""A campaign that asks for its experiments' network to be isolated: kept in its spec, sent with each job."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from quarry.errors import InvalidArgument
from supervisor_svc.campaigns.experiment import experiment_of
from supervisor_svc.campaigns.servicer import spec_from_proto, spec_to_proto
from supervisor_svc.campaigns.spec import validate_spec
from tests.supervisor_svc.campaign_loops import campaign_spec


def test_the_campaign_keeps_isolate_network_and_each_experiment_asks_the_monitor_for_it() -> None:
    message = campaign_spec()
    message.experiment.isolate_network = True
    spec = validate_spec(spec_from_proto(message), datetime.now(UTC))
    assert spec_to_proto(spec).experiment.isolate_network, "as GetCampaign shows it"
    assert experiment_of(spec).isolate_network, "what quarry/workspace.py puts in the job's options"
    assert not experiment_of(validate_spec(spec_from_proto(campaign_spec()), datetime.now(UTC))).isolate_network


def test_isolate_network_is_refused_for_a_workspace_on_an_ssh_host() -> None:
    message = campaign_spec()
    message.experiment.isolate_network = True
    message.workspace.host = "gpu1"
    with pytest.raises(InvalidArgument) as caught:
        validate_spec(spec_from_proto(message), datetime.now(UTC))
    assert [v.field for v in caught.value.violations] == ["spec.experiment.isolate_network"]
