"""Credential settings: marked where they are declared, readable from a file only their owner may read.

A credential (the model key, the search key, the API token, the mesh token, a database URL that
may hold a password) can be given as VARIABLE_FILE, the path of a file holding it, instead of
VARIABLE, so the secret is not in the process's environment. `quarry up` hands each credential
only to the processes that use it (quarry.cli.environment).
"""

from __future__ import annotations

import logging
import os
import stat
import sys
from typing import Annotated

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

__all__ = ["FILE_SUFFIX", "Credential", "UnreadableSecret", "credentials", "read_secret_file", "secrets_from_files"]


class _CredentialMarker:
    """Marks a setting that is a credential (see Credential)."""


Credential = Annotated[str, _CredentialMarker()]
"""A string setting that is a secret."""

FILE_SUFFIX = "_FILE"


class UnreadableSecret(ValueError):
    """A credential's file that cannot be used: missing, open to others, not text."""


def credentials(settings_class: type[BaseSettings]) -> list[str]:
    """The names of the class's credential settings."""
    return [name for name, field in settings_class.model_fields.items() if _is_credential(field)]


def _is_credential(field: FieldInfo) -> bool:
    return any(isinstance(item, _CredentialMarker) for item in field.metadata)


def read_secret_file(variable: str, path: str) -> str:
    """The secret in `path` (named by `variable`), a file only its owner may read; one trailing newline is
    not part of it."""
    try:
        with open(path, "rb") as handle:  # symlinks followed: Kubernetes mounts Secret files through them
            status = os.fstat(handle.fileno())
            if not stat.S_ISREG(status.st_mode):
                raise UnreadableSecret(f"{variable}={path} is not a regular file")
            if status.st_mode & 0o077:
                raise UnreadableSecret(
                    f"{variable}={path} is open to group or others (mode {stat.S_IMODE(status.st_mode):04o}); "
                    f"a secret's file must be 0600 or 0400: chmod 600 {path}"
                )
            data = handle.read()
    except OSError as error:
        raise UnreadableSecret(f"cannot read {variable}={path}: {error.strerror}") from error
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise UnreadableSecret(f"{variable}={path} is not UTF-8 text") from None
    return text.removesuffix("\n").removesuffix("\r") if text.endswith("\n") else text


def secrets_from_files(settings_class: type[BaseSettings], prefix: str) -> dict[str, str]:
    """Each credential of `settings_class` whose VARIABLE_FILE is set, read from that file."""
    values = {}
    for name in credentials(settings_class):
        variable = f"{prefix}{name.upper()}"
        path = os.environ.get(variable + FILE_SUFFIX)
        if not path:
            continue
        if variable in os.environ:
            raise UnreadableSecret(f"both {variable} and {variable}{FILE_SUFFIX} are set: set one of them")
        values[name] = read_secret_file(variable + FILE_SUFFIX, path)
    return values


def keep_private() -> None:
    """What the service writes (databases, logs) is its user's alone (umask 077), and no other process of
    that user may read its memory or /proc/PID/environ, where its credentials are: on Linux it is not
    dumpable (no core dumps either), so only a process with CAP_SYS_PTRACE can."""
    os.umask(0o077)
    if sys.platform != "linux":
        return
    import ctypes

    pr_set_dumpable = 4
    if ctypes.CDLL(None, use_errno=True).prctl(pr_set_dumpable, 0, 0, 0, 0) != 0:
        logging.getLogger(__name__).warning(
            "cannot make this process non-dumpable: %s", os.strerror(ctypes.get_errno())
        )
