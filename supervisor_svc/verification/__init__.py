"""Verified research: blind claim verification, citation audit, objections, revision and adjudication."""
