"""Configuration from QUARRY_* environment variables and an optional TOML file.

Precedence, highest first: explicit arguments, environment variables, the file
named by QUARRY_CONFIG_FILE (its [quarry] table for shared settings, and one table
per service, e.g. [scratchpad]), then defaults.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

__all__ = [
    "ConfigurationError",
    "ModelTier",
    "MonitorSettings",
    "QuarrySettings",
    "ScratchpadSettings",
    "ServiceSettings",
    "SshHost",
    "SupervisorSettings",
    "WorkerSettings",
    "describe_invalid",
]

CONFIG_FILE_ENV = "QUARRY_CONFIG_FILE"


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "quarry"


class ConfigurationError(ValueError):
    """Settings that cannot be used, said in the words a user configures them with."""


# The config file's tables: one per settings class that names one (see _Settings).
_TABLES: set[str] = set()


def _config_table(table: str, known: set[str]) -> dict[str, Any]:
    path = os.environ.get(CONFIG_FILE_ENV)
    if not path:
        return {}
    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
    except OSError as error:
        raise ConfigurationError(f"cannot read {CONFIG_FILE_ENV}={path}: {error.strerror}") from error
    except tomllib.TOMLDecodeError as error:
        raise ConfigurationError(f"{path} is not valid TOML: {error}") from error
    unknown_tables = sorted(set(document) - _TABLES)
    if unknown_tables:
        # A misspelt table would otherwise be ignored silently, like a misspelt key.
        raise ConfigurationError(
            f"{path}: unknown table(s) {', '.join(f'[{name}]' for name in unknown_tables)}; "
            f"known: {', '.join(f'[{name}]' for name in sorted(_TABLES))}"
        )
    section = document.get(table, {})
    if not isinstance(section, dict):
        raise ConfigurationError(f"{path}: [{table}] must be a table")
    unknown = sorted(set(section) - known)
    if unknown:
        # A misspelt key would otherwise be ignored silently.
        raise ConfigurationError(
            f"{path}: unknown key(s) in [{table}]: {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    return section


def describe_invalid(settings_class: type[BaseSettings], error: ValidationError) -> str:
    """A ValidationError as lines naming the environment variable and the file key to fix."""
    prefix = settings_class.model_config.get("env_prefix", "")
    table = getattr(settings_class, "config_table", "")
    lines = []
    for problem in error.errors():
        field = ".".join(str(part) for part in problem["loc"])
        lines.append(f"  {prefix}{field.upper()} (or [{table}] {field} in {CONFIG_FILE_ENV}): {problem['msg']}")
    return "invalid configuration:\n" + "\n".join(lines)


class _Settings(BaseSettings):
    """Base for settings classes: environment first, then the config file's table."""

    config_table: ClassVar[str]

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if "config_table" in cls.__dict__:
            _TABLES.add(cls.config_table)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        known = set(settings_cls.model_fields)
        file_settings = InitSettingsSource(settings_cls, init_kwargs=_config_table(cls.config_table, known))
        return (init_settings, env_settings, file_settings)


class QuarrySettings(_Settings):
    """Settings every process shares."""

    model_config = SettingsConfigDict(env_prefix="QUARRY_", extra="ignore")
    config_table: ClassVar[str] = "quarry"

    data_dir: Path = Field(default_factory=_default_data_dir)
    # Seconds in-flight RPCs get to finish after SIGTERM before they are cancelled.
    shutdown_grace_seconds: float = Field(default=5.0, ge=0, le=300)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    # json: one object per line with trace_id/span_id (for collectors); text: the same, readable.
    log_format: Literal["json", "text"] = "json"
    # The model endpoint every tier uses unless its own settings name another
    # (any OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 for vLLM).
    model_base_url: str = "http://127.0.0.1:8000/v1"
    model_name: str = "default"
    model_api_key: str = "unused"
    # False for models without native tool calling: tools go through a text protocol.
    model_native_tools: bool = True
    model_request_timeout: float = Field(default=120.0, gt=0)
    # TLS between services: this process's certificate and key (its server identity, and its client
    # identity under mutual TLS), and the CA that verifies the other side. Empty: plaintext.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_ca_file: str = ""
    # With a CA configured, servers refuse clients without a certificate it signed (mutual TLS).
    tls_require_client_cert: bool = True
    max_message_bytes: int = Field(default=8 * 1024 * 1024, ge=64 * 1024, le=256 * 1024 * 1024)
    # Servers ask clients to reconnect after this long, so scaled-out replicas get new calls.
    max_connection_age_seconds: float = Field(default=300.0, ge=1)
    # Calls in flight when that happens get this long to finish.
    max_connection_age_grace_seconds: float = Field(default=3600.0, ge=0)
    keepalive_seconds: float = Field(default=30.0, ge=1)
    # Authentication between Quarry's own services. mesh_token: the secret this process presents on
    # its calls to the others. mesh_peers: who may call this process's internal service, as
    # "ROLE=sha256:HEX" (the digest of that role's token) or "ROLE=cn:NAME" (a client certificate's
    # common name under mutual TLS), comma-separated. An internal service refuses to start without
    # peers unless mesh_insecure says, explicitly, that anyone who can reach it may call it.
    mesh_token: str = ""
    mesh_peers: str = ""
    mesh_insecure: bool = False

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_case_level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value


class ServiceSettings(_Settings):
    """Settings of one service process; subclasses set the prefix and defaults."""

    service_name: ClassVar[str]

    address: str
    # SQLAlchemy URL; empty means a SQLite file under the data directory.
    database_url: str = ""
    # HOST:PORT for a Prometheus scrape endpoint of this service's metrics; empty: none.
    prometheus_address: str = ""
    # HOST:PORT serving only the health service in plaintext, for probes when TLS is on; empty: none.
    health_address: str = ""

    @field_validator("address")
    @classmethod
    def _address_has_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"address must be HOST:PORT, got {value!r}")
        return value

    def resolved_database_url(self, data_dir: Path) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{data_dir / f'{self.service_name}.db'}"


class ScratchpadSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="QUARRY_SCRATCHPAD_", extra="ignore")
    config_table: ClassVar[str] = "scratchpad"
    service_name: ClassVar[str] = "scratchpad"

    address: str = "127.0.0.1:7411"
    max_content_bytes: int = Field(default=64 * 1024, ge=1, le=16 * 1024 * 1024)
    max_sources: int = Field(default=32, ge=0, le=1000)
    # Appends that queue behind one in-flight transaction commit together.
    max_batch: int = Field(default=256, ge=1, le=10_000)
    # Watchers re-read after this long without a commit signal (a safety net only).
    watch_poll_seconds: float = Field(default=5.0, gt=0, le=3600)


class ModelTier(ServiceSettings):
    """A service that calls a model: its tier's endpoint, falling back field by field to [quarry]'s."""

    model_base_url: str = ""
    model_name: str = ""
    model_api_key: str = ""
    model_native_tools: bool | None = None
    model_request_timeout: float | None = Field(default=None, gt=0)


class WorkerSettings(ModelTier):
    model_config = SettingsConfigDict(env_prefix="QUARRY_WORKER_", extra="ignore")
    config_table: ClassVar[str] = "worker"
    service_name: ClassVar[str] = "worker"

    address: str = "127.0.0.1:7412"
    # The scratchpad this worker promotes findings to.
    scratchpad_address: str = "127.0.0.1:7411"
    # The monitor behind the gpu_status and job_status tools; empty: those tools are not offered.
    monitor_address: str = ""
    max_concurrent_delegations: int = Field(default=64, ge=1, le=10_000)
    # Used when a Delegate request sets no timeout.
    default_timeout_seconds: float = Field(default=600.0, gt=0)
    context_tokens: int = Field(default=96_000, ge=1000)
    # corpus, searxng, tavily or brave
    search_backend: Literal["corpus", "searxng", "tavily", "brave"] = "corpus"
    searxng_url: str = ""
    search_api_key: str = ""
    # The local corpus index (`quarry corpus index`); empty means corpus.db in the data directory.
    corpus_index: str = ""
    # Dense retrieval through the model endpoint's /v1/embeddings: with a model named, the corpus
    # search fuses BM25 with vector similarity and web results are reranked by it; empty: BM25 alone.
    embedding_model: str = ""
    # Sent as the request's `dimensions` and checked against the answer; None: the model's own.
    embedding_dimensions: int | None = Field(default=None, ge=1, le=65_536)
    # Empty: the worker tier's model endpoint and key.
    embedding_base_url: str = ""
    embedding_api_key: str = ""
    # Passages sent in one /v1/embeddings request while indexing.
    embedding_batch_size: int = Field(default=64, ge=1, le=2048)
    embedding_rerank_web: bool = True
    # Internal addresses page fetching may reach anyway: "HOST:PORT" or CIDR, comma-separated.
    fetch_allow: str = ""
    page_chunk_chars: int = Field(default=4000, ge=200, le=100_000)
    # All one page fetch may take (connecting, redirects, the whole body), however the server paces it.
    page_fetch_seconds: float = Field(default=20.0, gt=0, le=3600)
    # Page text is extracted (HTML, PDF) in this many child processes; one that takes longer than
    # page_extract_seconds or more memory than page_extract_memory_mb is killed and replaced.
    page_extract_workers: int = Field(default=2, ge=1, le=64)
    page_extract_seconds: float = Field(default=15.0, gt=0, le=3600)
    page_extract_memory_mb: int = Field(default=1024, ge=256, le=1_048_576)


class SupervisorSettings(ModelTier):
    model_config = SettingsConfigDict(env_prefix="QUARRY_SUPERVISOR_", extra="ignore")
    config_table: ClassVar[str] = "supervisor"
    service_name: ClassVar[str] = "supervisor"

    address: str = "127.0.0.1:7410"
    scratchpad_address: str = "127.0.0.1:7411"
    # Worker processes, comma-separated HOST:PORT; delegations go round-robin over them.
    worker_addresses: str = "127.0.0.1:7412"
    # Used when a run sets no timeout.
    default_run_timeout_seconds: float = Field(default=1800.0, gt=0)
    # Delegations one run may have in flight, when the run does not say.
    max_parallel_delegations: int = Field(default=4, ge=1, le=64)
    # Runs this process executes at once; StartRun beyond it is RESOURCE_EXHAUSTED.
    max_active_runs: int = Field(default=32, ge=1, le=10_000)
    # A run whose supervisor stops renewing its lease this long is ended as failed.
    run_lease_seconds: float = Field(default=30.0, ge=1, le=3600)
    context_tokens: int = Field(default=96_000, ge=1000)
    # When set, SupervisorService calls need `authorization: Bearer <token>` (health and reflection stay open).
    auth_token: str = ""
    # A waiting StreamRun re-reads after this long without a wake-up (a safety net: commits wake it,
    # on PostgreSQL across replicas too).
    stream_poll_seconds: float = Field(default=1.0, gt=0, le=3600)

    def worker_targets(self) -> list[str]:
        return [target.strip() for target in self.worker_addresses.split(",") if target.strip()]


class SshHost(BaseModel):
    """A host the monitor reaches over SSH (nvidia-smi, process liveness, log tails, Slurm)."""

    model_config = ConfigDict(extra="forbid")

    address: str
    port: int = Field(default=22, ge=1, le=65535)
    user: str
    # Private key file; empty uses none (the server must then accept another method).
    key_path: str = ""
    # known_hosts file the host key must be in; empty means ~/.ssh/known_hosts. Never skipped.
    known_hosts: str = ""
    # Directories on the host whose files WatchJob may tail; none by default.
    log_roots: list[str] = Field(default_factory=list)


class MonitorSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="QUARRY_MONITOR_", extra="ignore")
    config_table: ClassVar[str] = "monitor"
    service_name: ClassVar[str] = "monitor"

    address: str = "127.0.0.1:7413"
    # Hosts by name: JSON in QUARRY_MONITOR_HOSTS, or [monitor.hosts.NAME] tables in the config file.
    hosts: dict[str, SshHost] = Field(default_factory=dict)
    ssh_command_timeout: float = Field(default=30.0, gt=0, le=600)
    # SubmitJob runs commands as the monitor's user: refused unless a deployment turns it on.
    allow_job_submission: bool = False
    # A Slurm job neither sacct nor squeue knows is given up (UNKNOWN) after this many polls...
    slurm_unknown_polls: int = Field(default=30, ge=1, le=100_000)
    # ...or once its time limit plus this buffer has passed since it was submitted or first seen.
    slurm_time_limit_buffer_seconds: float = Field(default=600.0, ge=0)
    # Logs of local jobs started without a log_path; empty means jobs/ in the data directory.
    jobs_dir: str = ""
    # Further local directories whose files jobs may log to and WatchJob may tail (the jobs dir always).
    log_roots: list[str] = Field(default_factory=list)
