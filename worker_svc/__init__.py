"""The worker service: bounded research agents behind WorkerService.Delegate."""
