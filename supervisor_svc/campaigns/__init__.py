"""Campaigns: the autonomous THINK -> EXECUTE -> REFLECT experiment loop over a code workspace.

This package holds the loop's pure domain, without gRPC or I/O: the typed records a campaign
appends to its scratchpad thread (`records`), the signals code computes from them (`signals`,
`violations`), the compacted memory THINK reads (`memory`), the anti-burn limiter (`limiter`)
and the files a human reads in the workspace (`exports`).
"""
