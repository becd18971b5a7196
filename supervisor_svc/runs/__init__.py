"""Research runs, one tenant of the host (supervisor_svc.hosting): `service.py` owns the runs of one process,
`run.py` sequences one run over its parts (budget, delegating, ledger, publishing, synthesis, tools), `store.py`
keeps them, `servicer.py` is SupervisorService, `worker_client.py` the WorkerService edge, and `domain.py`
their types and request checks."""
