"""The scratchpad service: the shared research plane of threads and typed entries."""
