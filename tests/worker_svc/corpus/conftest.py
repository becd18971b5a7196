"""The corpus tests' fixtures: a folder of documents with its index, and the scripted embeddings server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.fakes.openai_server import ScriptedModel
from tests.worker_svc.corpus.documents import SYNONYMS, write_folder
from worker_svc.corpus import Corpus


@pytest.fixture
def corpus(tmp_path: Path) -> Corpus:
    write_folder(tmp_path / "docs")
    return Corpus(tmp_path / "index" / "corpus.db")


@pytest.fixture
async def embeddings() -> AsyncIterator[ScriptedModel]:
    async with ScriptedModel(synonyms=SYNONYMS) as server:
        yield server
