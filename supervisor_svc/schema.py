"""The supervisor's tables: runs and campaigns, their public event logs, campaign directives, and the agent
kernel's conversation tables."""

from __future__ import annotations

import sqlalchemy as sa

from quarry.agent.conversation import metadata_with_conversations
from quarry.db import UTCDateTime, json_type
from quarry.recording import add_recording_tables

metadata = metadata_with_conversations()
add_recording_tables(metadata)

runs = sa.Table(
    "supervisor_runs",
    metadata,
    sa.Column("run_id", sa.String(64), primary_key=True),
    # The StartRun idempotency key, and a digest of what it asked for (a reused key must ask the same).
    sa.Column("request_id", sa.String(256), nullable=True, unique=True),
    sa.Column("request_digest", sa.String(64), nullable=False),
    sa.Column("question", sa.Text, nullable=False),
    sa.Column("options", json_type(), nullable=False),
    sa.Column("labels", json_type(), nullable=False),
    sa.Column("scratchpad_thread_id", sa.String(63), nullable=False),
    # queued, running, awaiting (approval), succeeded, failed, cancelled
    sa.Column("state", sa.String(16), nullable=False),
    # Set once the run succeeded: markdown, citations, removed_citations, budget flags.
    sa.Column("report", json_type(), nullable=True),
    # Set once the run succeeded: what its report lacks (RunWarning values); NULL means none, and is
    # also what an earlier release writes, since it does not know the column.
    sa.Column("warnings", json_type(), nullable=True),
    # How its report is verified (quarry.records.verification.Verification as JSON), kept current
    # from the moment verification begins; NULL for a run that has not verified (or does not).
    sa.Column("verification", json_type(), nullable=True),
    # The decision ApproveRun or RejectRun took on a run awaiting approval ("approved", "rejected"), and
    # the approver's comment or the rejection's reason. Set by whichever replica took the call; the owner
    # acts on it at once, or on its next lease renewal. Kept after the run ends, so a repeat is answered.
    sa.Column("approval", sa.String(16), nullable=True),
    sa.Column("approval_note", sa.Text, nullable=True),
    # The principals who started the run and who took the approval decision (empty before API keys).
    sa.Column("created_by", sa.String(128), nullable=True),
    sa.Column("decided_by", sa.String(128), nullable=True),
    sa.Column("error_code", sa.String(32), nullable=False),
    sa.Column("last_error", sa.Text, nullable=False),
    # Token usage by tier, kept current while the run goes on.
    sa.Column("usage", json_type(), nullable=False),
    # The event counter: the newest event's sequence number.
    sa.Column("last_sequence_no", sa.BigInteger, nullable=False),
    # The process executing the run, and when it last said so (a lease: a run whose owner stops
    # renewing it is ended as failed by whichever supervisor notices).
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("heartbeat_time", UTCDateTime, nullable=False),
    # Set by CancelRun; the owner sees it on its next heartbeat when another replica took the call.
    sa.Column("cancel_reason", sa.Text, nullable=True),
    sa.Column("create_time", UTCDateTime, nullable=False),
    sa.Column("start_time", UTCDateTime, nullable=True),
    sa.Column("end_time", UTCDateTime, nullable=True),
    sa.Index("supervisor_runs_by_time", "create_time", "run_id"),
    sa.Index("supervisor_runs_by_state", "state", "heartbeat_time"),
)

run_events = sa.Table(
    "supervisor_run_events",
    metadata,
    sa.Column("run_id", sa.String(64), sa.ForeignKey("supervisor_runs.run_id", ondelete="CASCADE"), primary_key=True),
    sa.Column("sequence_no", sa.BigInteger, primary_key=True),
    # The serialized quarry.v1.RunEvent: the public contract is also the storage format, so a
    # re-attaching client gets byte-for-byte what a live one got.
    sa.Column("payload", sa.LargeBinary, nullable=False),
    sa.Column("terminal", sa.Boolean, nullable=False),
    sa.Column("create_time", UTCDateTime, nullable=False),
)

campaigns = sa.Table(
    "supervisor_campaigns",
    metadata,
    sa.Column("campaign_id", sa.String(64), primary_key=True),
    # The StartCampaign idempotency key, and a digest of the spec it asked for.
    sa.Column("request_id", sa.String(256), nullable=True, unique=True),
    sa.Column("request_digest", sa.String(64), nullable=False),
    # The validated spec (supervisor_svc.campaigns.spec.CampaignSpec as JSON).
    sa.Column("spec", json_type(), nullable=False),
    # queued, running, sleeping, paused, stopped, completed, failed
    sa.Column("state", sa.String(16), nullable=False),
    # baseline, think, execute, waiting, reflect, idle
    sa.Column("phase", sa.String(16), nullable=False),
    sa.Column("cycle", sa.Integer, nullable=False),
    sa.Column("best_value", sa.Double, nullable=True),
    sa.Column("noise_floor", sa.Double, nullable=True),
    sa.Column("tokens", sa.BigInteger, nullable=False),
    # Tokens by minute over the last hour: [[minute, tokens], ...].
    sa.Column("usage_window", json_type(), nullable=False),
    sa.Column("cycles", sa.Integer, nullable=False),
    sa.Column("branch", sa.String(128), nullable=False),
    sa.Column("scratchpad_thread_id", sa.String(63), nullable=False),
    sa.Column("pause_reason", sa.Text, nullable=False),
    sa.Column("end_reason", sa.Text, nullable=False),
    sa.Column("pending_directives", sa.Integer, nullable=False),
    # The event counter: the newest event's sequence number.
    sa.Column("last_sequence_no", sa.BigInteger, nullable=False),
    sa.Column("sleep_until", UTCDateTime, nullable=True),
    sa.Column("sleep_reason", sa.Text, nullable=False),
    sa.Column("resume_time", UTCDateTime, nullable=True),
    # The process driving a live campaign (queued, running, sleeping) and when it last said so: a lease,
    # as runs have, except that a campaign whose owner stopped renewing is taken over, not failed.
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("heartbeat_time", UTCDateTime, nullable=False),
    sa.Column("create_time", UTCDateTime, nullable=False),
    sa.Column("update_time", UTCDateTime, nullable=False),
    sa.Column("end_time", UTCDateTime, nullable=True),
    sa.Column("created_by", sa.String(128), nullable=True),
    sa.Index("supervisor_campaigns_by_time", "create_time", "campaign_id"),
    sa.Index("supervisor_campaigns_by_state", "state", "heartbeat_time"),
)

campaign_events = sa.Table(
    "supervisor_campaign_events",
    metadata,
    sa.Column(
        "campaign_id",
        sa.String(64),
        sa.ForeignKey("supervisor_campaigns.campaign_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("sequence_no", sa.BigInteger, primary_key=True),
    # The serialized quarry.v1.CampaignEvent, sent as it is.
    sa.Column("payload", sa.LargeBinary, nullable=False),
    sa.Column("terminal", sa.Boolean, nullable=False),
    # Set by a writer that may repeat itself (a loop redoing a cycle after a restart): an event with a key
    # is stored once.
    sa.Column("dedupe_key", sa.String(128), nullable=True),
    sa.Column("create_time", UTCDateTime, nullable=False),
    sa.UniqueConstraint("campaign_id", "dedupe_key", name="supervisor_campaign_events_dedupe"),
)

campaign_directives = sa.Table(
    "supervisor_campaign_directives",
    metadata,
    sa.Column(
        "campaign_id",
        sa.String(64),
        sa.ForeignKey("supervisor_campaigns.campaign_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("request_id", sa.String(256), primary_key=True),
    sa.Column("text", sa.Text, nullable=False),
    # pending, consumed
    sa.Column("state", sa.String(16), nullable=False),
    # The sequence number of its directive_received event: directives are given in the order they came.
    sa.Column("position", sa.BigInteger, nullable=False),
    sa.Column("consumed_cycle", sa.Integer, nullable=False),
    sa.Column("create_time", UTCDateTime, nullable=False),
    sa.Column("consume_time", UTCDateTime, nullable=True),
    sa.Column("sent_by", sa.String(128), nullable=True),
)

# API keys made with `quarry keys add`: only their SHA-256 digests are kept.
api_keys = sa.Table(
    "supervisor_api_keys",
    metadata,
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("principal", sa.String(128), nullable=False),
    # The roles, "+"-joined (reader+operator).
    sa.Column("roles", sa.String(128), nullable=False),
    sa.Column("digest", sa.LargeBinary(32), nullable=False, unique=True),
    sa.Column("create_time", UTCDateTime, nullable=False),
    sa.Column("revoke_time", UTCDateTime, nullable=True),
)
