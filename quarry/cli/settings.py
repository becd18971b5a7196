"""Settings as the command line loads them: an invalid value is a ConfigurationError that names it."""

from __future__ import annotations

import re
from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsError

from quarry.config import ConfigurationError, describe_invalid

SettingsT = TypeVar("SettingsT", bound=BaseSettings)


def load_settings(settings_type: type[SettingsT], **overrides: Any) -> SettingsT:
    try:
        return settings_type(**overrides)
    except ValidationError as error:
        raise ConfigurationError(describe_invalid(settings_type, error)) from None
    except SettingsError as error:
        # A structured value (JSON) in the environment that does not parse: pydantic-settings names only the field.
        field = re.search(r'field "(\w+)"', str(error))
        prefix = settings_type.model_config.get("env_prefix", "")
        where = f"{prefix}{field.group(1).upper()}" if field else settings_type.__name__
        raise ConfigurationError(f"invalid configuration: {where} cannot be read: {error.__cause__ or error}") from None
