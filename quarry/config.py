"""Configuration from QUARRY_* environment variables and an optional TOML file.

Precedence, highest first: explicit arguments, environment variables (a credential's also as
VARIABLE_FILE, the file holding it: see quarry.credentials), the file
named by QUARRY_CONFIG_FILE (its [quarry] table for shared settings, and one table
per service, e.g. [scratchpad]), then defaults.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from quarry.credentials import Credential, UnreadableSecret, secrets_from_files

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
    """A ValidationError as one line naming, for each problem, the environment variable and the file key to fix."""
    prefix = settings_class.model_config.get("env_prefix", "")
    table = getattr(settings_class, "config_table", "")
    problems = []
    for problem in error.errors():
        field = ".".join(str(part) for part in problem["loc"])
        problems.append(f"{prefix}{field.upper()} (or [{table}] {field} in {CONFIG_FILE_ENV}): {problem['msg']}")
    return "invalid configuration: " + "; ".join(problems)


class _CredentialFiles(PydanticBaseSettingsSource):
    """Each credential's VARIABLE_FILE: the secret read from that file, so it need not sit in the environment."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads every credential at once

    def __call__(self) -> dict[str, Any]:
        try:
            return secrets_from_files(self.settings_cls, str(self.config.get("env_prefix", "")))
        except UnreadableSecret as error:
            raise ConfigurationError(str(error)) from None


class _Settings(BaseSettings):
    """Base for settings classes: environment first, then the config file's table.

    Each field's docstring says what it means: docs/settings.md is generated from them.
    """

    model_config = SettingsConfigDict(use_attribute_docstrings=True)
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
        return (init_settings, env_settings, _CredentialFiles(settings_cls), file_settings)


class QuarrySettings(_Settings):
    """Settings every process shares."""

    model_config = SettingsConfigDict(env_prefix="QUARRY_", extra="ignore")
    config_table: ClassVar[str] = "quarry"

    data_dir: Path = Field(default_factory=_default_data_dir)
    """Where the default SQLite databases, the corpus index and local job logs live."""
    shutdown_grace_seconds: float = Field(default=5.0, ge=0, le=300)
    """Seconds in-flight RPCs get to finish after SIGTERM before they are cancelled."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    """The least severe log lines written."""
    log_format: Literal["json", "text"] = "json"
    """json: one object per line with trace_id and span_id (for collectors); text: the same, readable.
    Configured API keys and anything after Bearer, Authorization or api_key are masked in both."""
    trace_sql: bool = False
    """With tracing on (OTEL_EXPORTER_OTLP_ENDPOINT), also a span per SQL statement. Off: statements cost
    no spans and take the prepared fast path; a run's trace keeps its RPCs, model calls and tool calls."""
    trace_http: bool = False
    """With tracing on, also a span per HTTP request (httpx's instrumentation: the POST under each model call,
    page and search requests), which carries the trace on to the model server in a traceparent header."""
    model_base_url: str = "http://127.0.0.1:8000/v1"
    """The model endpoint of every tier unless the tier names its own: any OpenAI-compatible endpoint
    (vLLM, Ollama, llama.cpp, OpenAI, ...)."""
    model_name: str = "default"
    """The model every tier asks for unless the tier names its own; the endpoint must serve it."""
    model_api_key: Credential = "unused"
    """The key sent to the model endpoint, for every tier that sets none of its own."""
    model_native_tools: bool = True
    """False for models without native tool calling: tools then go through a text `<tool_call>` protocol."""
    model_request_timeout: float = Field(default=120.0, gt=0)
    """Seconds one model request may take in all, streaming included: a total deadline, which
    keep-alive comments do not extend."""
    model_idle_timeout: float = Field(default=60.0, gt=0)
    """Seconds a model endpoint may stay silent within a request: not a byte (a keep-alive comment is one)."""
    tls_cert_file: str = ""
    """This process's TLS certificate: its server identity, and its client identity under mutual TLS.
    Empty (with the key and CA): plaintext between services."""
    tls_key_file: str = ""
    """The private key of that certificate."""
    tls_ca_file: str = ""
    """The CA that verifies the other side of every connection between services."""
    tls_require_client_cert: bool = True
    """With a CA configured, servers refuse clients without a certificate it signed (mutual TLS)."""
    max_message_bytes: int = Field(default=8 * 1024 * 1024, ge=64 * 1024, le=256 * 1024 * 1024)
    """The largest message any server or client accepts."""
    max_connection_age_seconds: float = Field(default=300.0, ge=1)
    """Servers ask clients to reconnect after this long, so scaled-out replicas (new workers) get new calls."""
    max_connection_age_grace_seconds: float = Field(default=3600.0, ge=0)
    """Calls in flight when a server asks its client to reconnect get this long to finish."""
    keepalive_seconds: float = Field(default=30.0, ge=1)
    """How often an idle connection is pinged, so a dead peer is noticed."""
    mesh_token: Credential = ""
    """The secret this process presents on its calls to the other services (`quarry up` makes one per
    start; `quarry mesh keys` makes them for a deployment)."""
    mesh_peers: str = ""
    """Who may call this process's internal service, comma-separated: "ROLE=sha256:HEX" (the digest of
    that role's mesh token) or "ROLE=cn:NAME" (a client certificate's common name, under mutual TLS)."""
    mesh_insecure: bool = False
    """Lets an internal service start without mesh peers, callable by anyone who can reach it. Without
    peers and without this, it refuses to start."""

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_case_level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value


class ServiceSettings(_Settings):
    """Settings of one service process; subclasses set the prefix and defaults."""

    service_name: ClassVar[str]

    address: str
    """The HOST:PORT the service listens on (port 0 picks a free one)."""
    database_url: Credential = ""
    """The service's database as a SQLAlchemy URL (`sqlite:///PATH` or `postgresql://USER@HOST:PORT/DB`);
    empty: a SQLite file named after the service in the data directory."""
    prometheus_address: str = ""
    """HOST:PORT of a Prometheus scrape endpoint (`/metrics`) for this service's metrics; empty: none."""
    health_address: str = ""
    """HOST:PORT serving only the health service, in plaintext, for probes that cannot speak TLS; empty: none."""

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
    """The HOST:PORT the scratchpad listens on (port 0 picks a free one)."""
    max_content_bytes: int = Field(default=64 * 1024, ge=1, le=16 * 1024 * 1024)
    """The largest entry content, counted in UTF-8 bytes."""
    max_sources: int = Field(default=32, ge=0, le=1000)
    """The most sources one entry may carry."""
    max_batch: int = Field(default=256, ge=1, le=10_000)
    """Appends that queue behind one in-flight transaction commit together, up to this many."""
    watch_poll_seconds: float = Field(default=5.0, gt=0, le=3600)
    """A Watch re-reads after this long without a commit signal (a safety net only)."""


class ModelTier(ServiceSettings):
    """A service that calls a model: its tier's endpoint, falling back field by field to [quarry]'s."""

    model_base_url: str = ""
    """This tier's own model endpoint; empty: QUARRY_MODEL_BASE_URL."""
    model_name: str = ""
    """This tier's own model; empty: QUARRY_MODEL_NAME."""
    model_api_key: Credential = ""
    """This tier's own key for its endpoint; empty: QUARRY_MODEL_API_KEY."""
    model_native_tools: bool | None = None
    """Whether this tier's model calls tools natively; unset: QUARRY_MODEL_NATIVE_TOOLS."""
    model_request_timeout: float | None = Field(default=None, gt=0)
    """Seconds one of this tier's model requests may take; unset: QUARRY_MODEL_REQUEST_TIMEOUT."""
    model_idle_timeout: float | None = Field(default=None, gt=0)
    """Seconds this tier's model endpoint may send nothing within a request; unset: QUARRY_MODEL_IDLE_TIMEOUT."""


LITERATURE_CATALOGUES = ("arxiv", "semantic_scholar")


class WorkerSettings(ModelTier):
    model_config = SettingsConfigDict(env_prefix="QUARRY_WORKER_", extra="ignore")
    config_table: ClassVar[str] = "worker"
    service_name: ClassVar[str] = "worker"

    address: str = "127.0.0.1:7412"
    """The HOST:PORT the worker listens on (port 0 picks a free one)."""
    id: str = Field(default="", max_length=64)
    """How this worker names itself on the delegations it runs (GetDelegation, the run's status events), so
    operators can tell workers apart; empty: the host name and a random suffix, new for each process.
    `quarry up` sets worker-1, worker-2, ..."""
    scratchpad_address: str = "127.0.0.1:7411"
    """The scratchpad this worker promotes findings to (`quarry up` sets it)."""
    monitor_address: str = ""
    """The monitor behind the gpu_status and job_status tools and an engineer's workspace tools (`quarry up`
    sets it); empty: those tools are not offered, and engineer delegations are refused."""
    engineer_command_seconds: float = Field(default=120.0, gt=0, le=3600)
    """The longest an engineer's run_command (a smoke test in its workspace) may run; the monitor stops it
    past its limit. Training goes through launch_experiment, which has its own limit."""
    max_concurrent_delegations: int = Field(default=64, ge=1, le=10_000)
    """Delegations this worker runs at once; beyond it Delegate answers RESOURCE_EXHAUSTED."""
    default_timeout_seconds: float = Field(default=600.0, gt=0)
    """A delegation's deadline when the Delegate request sets none."""
    lease_seconds: float = Field(default=30.0, ge=1, le=3600)
    """A running delegation whose worker stops renewing its lease this long is ended as interrupted by any
    worker over the same database; the same Delegate then goes on with it from its recorded conversation."""
    context_tokens: int = Field(default=96_000, ge=1000)
    """The history budget of each worker model call: older turns are truncated to fit."""
    search_backend: Literal["corpus", "searxng", "tavily", "brave", "arxiv", "semantic_scholar"] = "corpus"
    """Where web_search looks: the local corpus, a SearXNG instance (`searxng_url`), Tavily or Brave
    (`search_api_key`), or the literature: arXiv (`arxiv_url`) or Semantic Scholar (`semantic_scholar_url`)."""
    searxng_url: str = ""
    """The SearXNG instance's base URL, for the searxng backend."""
    search_api_key: Credential = ""
    """The API key of the tavily or brave backend; Semantic Scholar's optional one (a higher rate limit)."""
    arxiv_url: str = "https://export.arxiv.org"
    """arXiv's API, for the arxiv backend and bibliographic verifiers."""
    semantic_scholar_url: str = "https://api.semanticscholar.org"
    """Semantic Scholar's API, for the semantic_scholar backend and bibliographic verifiers."""
    literature_catalogues: str = "arxiv,semantic_scholar"
    """The catalogues a bibliographic verifier looks papers up in, asked in this order, comma-separated (arxiv,
    semantic_scholar), whatever `search_backend` is; empty: none (the role then finds no paper)."""

    @field_validator("literature_catalogues")
    @classmethod
    def _known_catalogues(cls, value: str) -> str:
        unknown = [name.strip() for name in value.split(",") if name.strip() not in ("", *LITERATURE_CATALOGUES)]
        if unknown:
            raise ValueError(f"unknown catalogue(s) {', '.join(unknown)}; known: {', '.join(LITERATURE_CATALOGUES)}")
        return value

    search_seconds: float = Field(default=30.0, gt=0, le=600)
    """All one search may take (connecting, the whole answer); past it the search is an error for the model."""
    corpus_index: str = ""
    """The local corpus index `quarry corpus index` writes; empty: corpus.db in the data directory."""
    embedding_model: str = ""
    """Dense retrieval through the model endpoint's /v1/embeddings: with a model named, the corpus search
    fuses BM25 with vector similarity and web results are reranked by it; empty: BM25 alone."""
    embedding_dimensions: int | None = Field(default=None, ge=1, le=65_536)
    """Sent as the embeddings request's `dimensions` and checked against the answer; empty: the model's own."""
    embedding_base_url: str = ""
    """The embeddings endpoint; empty: the worker tier's model endpoint."""
    embedding_api_key: Credential = ""
    """The embeddings endpoint's key; empty: the worker tier's model key."""
    embedding_batch_size: int = Field(default=64, ge=1, le=2048)
    """Passages sent in one /v1/embeddings request while indexing."""
    embedding_concurrency: int = Field(default=4, ge=1, le=64)
    """/v1/embeddings requests in flight at once while indexing."""
    embedding_passage_tokens: int = Field(default=256, ge=32, le=32_768)
    """The most tokens of one embedded passage, title included: the embedding model's window (256 fits the common
    small ones, all-MiniLM and bge-small; larger models take 512 or more). Tokens are estimated at 3 characters
    each, so that markup and code fit too. A change re-embeds the index at the next `quarry corpus index`."""
    embedding_passage_overlap_tokens: int = Field(default=32, ge=0, le=4096)
    """How many tokens each passage shares with the one before, so a sentence cut between two is whole in one."""
    embedding_rerank_web: bool = True
    """With embeddings configured, web and literature results are reranked by similarity to the query too."""
    corpus_fusion_k: int = Field(default=30, ge=1, le=10_000)
    """The corpus's hybrid search fuses BM25's and the vectors' rankings by weighted reciprocal rank: each
    document scores weight / (k + rank) in each ranking. A larger k flattens the top ranks' advantage."""
    corpus_fusion_lexical_weight: float = Field(default=1.0, ge=0.0, le=100.0)
    """BM25's ranking's weight in the fusion."""
    corpus_fusion_semantic_weight: float = Field(default=3.0, ge=0.0, le=100.0)
    """The vectors' ranking's weight in the fusion: above BM25's, a document the vectors rank first outranks
    one both rank middling. The defaults (30, 1 and 3) were chosen on a benchmark of a real manual and a real
    embedding model; a weak embedding model may do better with less."""
    corpus_fusion_depth: int = Field(default=100, ge=1, le=10_000)
    """How many documents each ranking contributes before fusion."""
    fetch_allow: str = ""
    """Internal addresses page fetching may reach anyway, as HOST:PORT or CIDR, comma-separated; every
    other non-public address is refused."""
    page_chunk_chars: int = Field(default=4000, ge=200, le=100_000)
    """Pages are served to the model in chunks of this many characters."""
    page_fetch_seconds: float = Field(default=20.0, gt=0, le=3600)
    """All one page fetch may take (connecting, redirects, the whole body), however the server paces it."""
    page_extract_workers: int = Field(default=2, ge=1, le=64)
    """Child processes that extract page text (HTML, PDF)."""
    page_extract_seconds: float = Field(default=15.0, gt=0, le=3600)
    """An extraction that takes longer is killed (and its process replaced); the read is an error for the model."""
    page_extract_memory_mb: int = Field(default=1024, ge=256, le=1_048_576)
    """The address space of each extraction process; one that needs more is killed and replaced."""


class SupervisorSettings(ModelTier):
    model_config = SettingsConfigDict(env_prefix="QUARRY_SUPERVISOR_", extra="ignore")
    config_table: ClassVar[str] = "supervisor"
    service_name: ClassVar[str] = "supervisor"

    address: str = "127.0.0.1:7410"
    """The HOST:PORT the supervisor listens on, and where `quarry ask` connects."""
    scratchpad_address: str = "127.0.0.1:7411"
    """The scratchpad the supervisor's runs write to (`quarry up` sets it)."""
    worker_addresses: str = "127.0.0.1:7412"
    """Worker HOST:PORTs (or a `dns:///` name that resolves to all of them), comma-separated; delegations
    go round-robin over those whose health says SERVING, and a refused one is retried once on the next."""
    monitor_address: str = ""
    """The monitor whose workspaces and jobs campaigns use (`quarry up` sets it); empty: this supervisor
    cannot start campaigns (StartCampaign answers UNIMPLEMENTED)."""
    default_run_timeout_seconds: float = Field(default=1800.0, gt=0)
    """A run's limit when StartRun sets none."""
    max_parallel_delegations: int = Field(default=4, ge=1, le=64)
    """Delegations one run may have in flight, when the run does not say."""
    max_active_runs: int = Field(default=32, ge=1, le=10_000)
    """Runs this process executes at once; beyond it StartRun answers RESOURCE_EXHAUSTED."""
    run_lease_seconds: float = Field(default=30.0, ge=1, le=3600)
    """A run or campaign whose supervisor stops renewing its lease this long is taken up by any replica,
    which goes on from what the stopped one recorded."""
    context_tokens: int = Field(default=96_000, ge=1000)
    """The history budget of each supervisor model call: older turns are truncated to fit."""
    auth_token: Credential = ""
    """A static API key of principal "admin" with every role (kept from before API keys had roles); the
    command line sends it when QUARRY_API_KEY is not set."""
    api_keys: str = ""
    """Static API keys, comma-separated: "PRINCIPAL:ROLE+ROLE=sha256:HEX" (the digest of the key; roles:
    reader, researcher, operator, approver). Keys made with `quarry keys add` live in the database."""
    client_certificates: str = ""
    """Principals named by client certificate, under mutual TLS, comma-separated: "cn:NAME=PRINCIPAL:ROLE+ROLE"."""
    open_api: bool = False
    """Runs the public API without authentication: every caller is principal "anonymous" with every role.
    Refused when campaigns can run code (a monitor address is set)."""
    allow_self_approval: bool = False
    """Lets a principal approve a run it started itself (ApproveRun); refused by default."""
    api_key_refresh_seconds: float = Field(default=5.0, gt=0, le=3600)
    """How often the stored API keys are re-read: a revoked key stops working within this long."""
    stream_poll_seconds: float = Field(default=1.0, gt=0, le=3600)
    """A waiting StreamRun re-reads after this long without a wake-up (a safety net: commits wake it,
    on PostgreSQL across replicas too)."""
    verify_runs: bool = True
    """Whether a run verifies its report (blind claim-verifiers, a citation audit, objections revised or
    adjudicated) when its StartRun leaves RunOptions.verification unspecified."""
    verification_reserve: float = Field(default=0.5, ge=0, le=0.9)
    """The share of a verified run's token budget (RunOptions.max_tokens) held back from research for claim
    verification, the report and its review: research ends when only the reserve is left, so the audit
    always has budget to run."""
    paper_hosts: str = (
        "arxiv.org,export.arxiv.org,doi.org,dx.doi.org,www.semanticscholar.org,api.semanticscholar.org,"
        "openreview.net,aclanthology.org,dl.acm.org,link.springer.com,ieeexplore.ieee.org,pubmed.ncbi.nlm.nih.gov"
    )
    """Hosts whose pages are papers, comma-separated: in a verified run, a finding citing one is citable only once a
    bibliographic verifier has found the paper in the literature catalogues as its source names it."""
    approval_wait_seconds: float = Field(default=24 * 3600.0, gt=0, le=30 * 24 * 3600)
    """How long a run started with require_approval waits for ApproveRun or RejectRun; past it the run fails
    with DEADLINE_EXCEEDED. The wait does not count against the run's own time limit."""
    database_wait_seconds: float = Field(default=600.0, ge=0, le=24 * 3600)
    """How long a run waits for the supervisor's database when it becomes unreachable, then goes on from
    what it recorded; past it the run fails with UNAVAILABLE. 0: it fails at once."""

    def worker_targets(self) -> list[str]:
        return [target.strip() for target in self.worker_addresses.split(",") if target.strip()]

    def paper_host_names(self) -> frozenset[str]:
        return frozenset(host.strip().lower() for host in self.paper_hosts.split(",") if host.strip())


class SshHost(BaseModel):
    """A host the monitor reaches over SSH (nvidia-smi, process liveness, log tails, Slurm)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    address: str
    """The host's name or IP address."""
    port: int = Field(default=22, ge=1, le=65535)
    """Its SSH port."""
    user: str
    """The user to log in as."""
    key_path: str = ""
    """A private key file; empty uses none (the server must then accept another method)."""
    known_hosts: str = ""
    """The known_hosts file the host key must be in; empty: ~/.ssh/known_hosts. Never skipped."""
    log_roots: list[str] = Field(default_factory=list)
    """Directories on the host whose files WatchJob may tail; none by default."""
    workspace_roots: list[str] = Field(default_factory=list)
    """Directories on the host under which workspaces may be opened (files over SFTP, git over SSH); none
    by default."""


class MonitorSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="QUARRY_MONITOR_", extra="ignore")
    config_table: ClassVar[str] = "monitor"
    service_name: ClassVar[str] = "monitor"

    address: str = "127.0.0.1:7413"
    """The HOST:PORT the monitor listens on (port 0 picks a free one)."""
    hosts: dict[str, SshHost] = Field(default_factory=dict)
    """SSH hosts by name: JSON, e.g. `{"gpu1": {"address": "10.0.0.5", "user": "me", "key_path":
    "/keys/id_ed25519"}}`, or `[monitor.hosts.NAME]` tables in the config file (fields below)."""
    ssh_command_timeout: float = Field(default=30.0, gt=0, le=600)
    """Seconds one remote command may take."""
    allow_job_submission: bool = False
    """SubmitJob runs commands as the monitor's user: it is refused unless this turns it on."""
    slurm_unknown_polls: int = Field(default=30, ge=1, le=100_000)
    """A Slurm job neither sacct nor squeue knows is given up (UNKNOWN) after this many polls..."""
    slurm_time_limit_buffer_seconds: float = Field(default=600.0, ge=0)
    """...or once its time limit plus this buffer has passed since it was submitted or first seen."""
    jobs_dir: str = ""
    """Logs of local jobs started without a log path; empty: jobs/ in the data directory. In production put it
    on another file system than the data directory's databases, so that no job's output can fill theirs."""
    max_job_log_bytes: int = Field(default=1 << 30, ge=64 * 1024)
    """The most bytes a local job's log holds: past it the middle is cut (the start and the newest output
    are kept, with a line saying how much was cut)."""
    job_log_disk_reserve_bytes: int = Field(default=1 << 30, ge=0)
    """A local job is stopped (FAILED) when the free space of the file system holding its log falls below
    this many bytes."""
    log_roots: list[str] = Field(default_factory=list)
    """Further local directories whose files jobs may log to and WatchJob may tail (the jobs directory
    always); in the environment a JSON list, e.g. `["/data/logs"]`."""
    workspace_roots: list[str] = Field(default_factory=list)
    """Local directories under which workspaces may be opened, their files read and written as the
    monitor's user; none by default, so no workspace opens. A JSON list, e.g. `["/srv/experiments"]`."""
    workspace_git_timeout: float = Field(default=60.0, gt=0, le=600)
    """Seconds one git command in a workspace may take (on this machine and over SSH)."""
    job_poll_seconds: float = Field(default=2.0, gt=0, le=600)
    """How often the monitor looks at the jobs it started: their end, their wall-clock limit, their log
    metrics."""
    job_stop_grace_seconds: float = Field(default=10.0, gt=0, le=3600)
    """A job past its wall-clock limit gets SIGTERM, and SIGKILL this many seconds after."""
    job_sandbox: Literal["bwrap", "none"] = "bwrap"
    """How local jobs are confined: `bwrap` (bubblewrap, the Debian package `bubblewrap`: a read-only
    filesystem but for the job's working tree and a private /tmp, its own process and user namespaces,
    an environment from an allowlist) or `none`. Without a working sandbox local jobs are refused unless
    QUARRY_MONITOR_UNSANDBOXED_JOBS is true."""
    unsandboxed_jobs: bool = False
    """Run local jobs unconfined, as the monitor's user, when no sandbox is available or job_sandbox is
    `none`; otherwise they are refused (FAILED_PRECONDITION SANDBOX_UNAVAILABLE)."""
    job_sandbox_hidden_paths: list[str] = Field(default_factory=list)
    """Further local files or directories a sandboxed job must not see (an empty one in their place),
    beside the data directory, the job logs, ~/.ssh, key files and /run/secrets; a JSON list."""
