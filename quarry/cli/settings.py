"""Settings as the command line loads them: an invalid value is a ConfigurationError that names it."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings

from quarry.config import ConfigurationError, describe_invalid

SettingsT = TypeVar("SettingsT", bound=BaseSettings)


def load_settings(settings_type: type[SettingsT], **overrides: Any) -> SettingsT:
    try:
        return settings_type(**overrides)
    except ValidationError as error:
        raise ConfigurationError(describe_invalid(settings_type, error)) from None
