"""The bounded tool loop shared by the supervisor and the worker.

Nothing here knows which service runs it: messages, truncation, the tool
registry and the model client are the same for both.
"""
