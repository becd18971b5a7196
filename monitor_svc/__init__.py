"""MonitorService: observation of compute at zero model cost."""
