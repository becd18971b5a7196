"""Typed async clients for Quarry's services, one module per service, with the retry rules they expect.

`channels` opens the channels (TLS, limits, tracing, the bearer token) every client shares, `retry`
says which calls are retried and how; `runs` (the public research API), `campaigns`, `scratchpad`
and `monitor` each hold one service's client. The worker's delegation client is the supervisor's
own (`supervisor_svc/worker_client.py`): nothing outside the supervisor calls the worker.
"""
