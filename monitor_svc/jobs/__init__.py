"""Jobs the monitor starts and watches: local processes, processes on SSH hosts, and Slurm jobs. No model is involved.

Each kind of job has its executor behind one protocol (executor.py: local.py, ssh.py, slurm.py,
chosen by JobKind in registry.py); what every job shares is written once: its submission and
records (service.py) and its supervision (supervision.py).
"""

from monitor_svc.jobs.local import LogLimits
from monitor_svc.jobs.records import JobRecord, JobRecords
from monitor_svc.jobs.service import Jobs
from monitor_svc.jobs.slurm import SlurmLimits
from monitor_svc.jobs.spec import BatchScript, Command, JobKind, JobObservation, JobOptions, JobRequest
from monitor_svc.jobs.supervision import Supervision

__all__ = [
    "BatchScript",
    "Command",
    "JobKind",
    "JobObservation",
    "JobOptions",
    "JobRecord",
    "JobRecords",
    "JobRequest",
    "Jobs",
    "LogLimits",
    "SlurmLimits",
    "Supervision",
]
