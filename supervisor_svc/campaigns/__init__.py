"""Campaigns: the autonomous THINK -> EXECUTE -> REFLECT experiment loop over a code workspace.

The loop's pure domain, without gRPC or I/O: the typed records a campaign appends to its
scratchpad thread (`records`), the signals code computes from them (`signals`, `violations`),
the compacted memory THINK reads (`memory`), the anti-burn limiter (`limiter`), the files a human
reads in the workspace (`exports`) and the campaign's spec and state (`model`).

Around it, the public API: the campaign's events (`events`), its durable state (`store`), the
state machine, leases and the pluggable loop (`service`), CampaignService (`servicer`), and the
loop itself (`loop`): the agent kernel, the monitor and the workers put to work on those rules.
"""
