"""The host for durable work, which runs (supervisor_svc.runs.service) and campaigns (supervisor_svc.campaigns)
are the two tenants of.

- `host.py`: the work live in this process by id, starts de-duplicated by request id, admission, leases
  (renewal, sweep, take-over), stop and close.
- `store.py`: the SQL both tenants' stores share, parameterised by their tables: leases, the numbered
  event log's reads, start by request id, newest-first pages.
- `following.py`: a stream that follows one event log to its end, and the writer that wakes it.
"""
