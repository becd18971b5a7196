"""The bounded tool loop shared by every agent: a run's supervisor, a worker, a campaign's THINK.

Nothing here knows which service runs it: messages, truncation, the tool
registry and the model client are the same for all of them.
"""
