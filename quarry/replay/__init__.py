"""Exact replay of a recorded run: the .qrun file, the answers it gives, and the mesh that re-executes it."""
