"""The supervisor service: plans, delegates to workers, and writes the cited report."""
