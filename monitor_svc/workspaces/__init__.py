"""Workspaces: directories on this machine or an SSH host whose files the monitor reads and edits.

Kept free of imports: the search matcher runs as `python -m monitor_svc.workspaces.grep`.
"""
