"""Who may call the supervisor's public API: its stored API keys (`keys.py`), the authentication it serves
with (`guard.py`) and the `quarry keys` command (`command.py`). The rules themselves are quarry.api_auth."""
