"""What a worker reports about itself (DiagnosticsService): its model, its search backend, the services
it calls and its database, each checked from where the worker runs."""

from __future__ import annotations

import asyncio
from pathlib import Path

from quarry.agent.model import ModelSettings
from quarry.clients.channels import Dialer
from quarry.config import ModelTier, QuarrySettings, WorkerSettings
from quarry.diagnostics import (
    Check,
    Diagnostics,
    Fact,
    Finding,
    Status,
    database_diagnostics,
    model_diagnostics,
    peer_check,
    public_url,
    setting_name,
)
from worker_svc.corpus import Corpus, CorpusError
from worker_svc.web.search import SearchBackend, SearchError

# The backends a search costs nothing on, by the setting that says where they are.
_FREE_BACKENDS = {"searxng": "searxng_url", "arxiv": "arxiv_url", "semantic_scholar": "semantic_scholar_url"}


def search_check(settings: WorkerSettings, corpus: Corpus, search: SearchBackend) -> Check:
    """Whether the search backend the worker uses can answer; a paid API is not called (that spends quota)."""
    backend = settings.search_backend

    async def run() -> Finding:
        if backend == "corpus":
            return await _corpus(corpus, setting_name(settings, "corpus_index"))
        if backend in _FREE_BACKENDS:
            setting = setting_name(settings, _FREE_BACKENDS[backend])
            shown = public_url(getattr(settings, _FREE_BACKENDS[backend]))
            try:
                results = await search.search("test", 3)
            except SearchError as error:
                return Finding(Status.FAILED, f"{shown}: {error}", setting)
            return Finding(Status.OK, f"{shown} answers ({len(results)} results for 'test')")
        setting = setting_name(settings, "search_api_key")
        if not settings.search_api_key:
            return Finding(Status.FAILED, f"{backend} needs an API key and none is set", setting)
        return Finding(Status.WARNING, f"{backend}: an API key is set; not called, since a search spends quota")

    return Check(f"search ({backend})", run)


async def _corpus(corpus: Corpus, setting: str) -> Finding:
    try:
        documents = await asyncio.to_thread(corpus.document_count)
    except CorpusError as error:
        return Finding(Status.FAILED, f"{error}; run `quarry corpus index FOLDER`, or point {setting} at one", setting)
    if not documents:
        return Finding(Status.FAILED, f"{corpus.index_path} holds no documents; run `quarry corpus index FOLDER`")
    return Finding(Status.OK, f"{corpus.index_path}: {documents} document{'' if documents == 1 else 's'}")


def model_tiers_diagnostics(
    settings: WorkerSettings, common: QuarrySettings, supervisor_tier: ModelTier
) -> tuple[list[Fact], list[Check]]:
    """The worker tier's model and the supervisor tier's (which the citation auditor and adjudicator run
    on by default, and any delegation that asks for it), the latter as the worker resolves it: each
    setting it leaves unset falls back to the worker tier's."""
    facts, check = model_diagnostics(settings, common)
    label = "supervisor tier"
    worker_model = ModelSettings.for_tier(settings, common)
    supervisor_model = ModelSettings.for_tier(supervisor_tier, common, fallback=settings)
    if _called_with(supervisor_model) == _called_with(worker_model):
        # A second check would ask the same endpoint the same question with the same key.
        same = "the worker tier's endpoint and model: the model endpoint check covers both"
        return [*facts, Fact(f"model ({label})", same, setting_name(supervisor_tier, "model_*"))], [check]
    supervisor_facts, supervisor_check = model_diagnostics(supervisor_tier, common, fallback=settings, label=label)
    return [*facts, *supervisor_facts], [check, supervisor_check]


def _called_with(model: ModelSettings) -> tuple[str, str, str]:
    return model.base_url, model.model, model.api_key


def diagnostics(
    settings: WorkerSettings,
    common: QuarrySettings,
    *,
    supervisor_tier: ModelTier,
    corpus: Corpus,
    search: SearchBackend,
    dial: Dialer,
    migrations: Path,
    version_table: str,
) -> Diagnostics:
    model_facts, model_checks = model_tiers_diagnostics(settings, common, supervisor_tier)
    database_fact, database_check = database_diagnostics(settings, common, migrations, version_table)
    scratchpad, monitor = setting_name(settings, "scratchpad_address"), setting_name(settings, "monitor_address")
    backend = settings.search_backend
    where = {
        "corpus": Fact("corpus index", str(corpus.index_path), setting_name(settings, "corpus_index")),
        **{
            name: Fact(f"{name} URL", public_url(getattr(settings, url)), setting_name(settings, url))
            for name, url in _FREE_BACKENDS.items()
        },
    }
    facts = [
        *model_facts,
        Fact("search backend", backend, setting_name(settings, "search_backend")),
        *([where[backend]] if backend in where else []),
        Fact("scratchpad", settings.scratchpad_address, scratchpad),
        Fact("monitor", settings.monitor_address or "none: gpu_status and job_status are not offered", monitor),
        database_fact,
    ]
    checks = [
        *model_checks,
        search_check(settings, corpus, search),
        peer_check("scratchpad", settings.scratchpad_address, dial, scratchpad),
        *([peer_check("monitor", settings.monitor_address, dial, monitor)] if settings.monitor_address else []),
        database_check,
    ]
    return Diagnostics("worker", facts=facts, checks=checks)
