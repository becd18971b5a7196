"""Folders to index, and the helpers the corpus tests share."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from tests.fakes.documents import tiny_pdf
from tests.fakes.openai_server import ScriptedModel
from worker_svc.corpus import Corpus, Embedder, EmbeddingSettings

SYNONYMS = {"vessel": "ship", "vessels": "ship", "crossing": "voyage", "crossings": "voyage"}
DOCUMENTS = {
    "ships.md": "# Ships\n\nA ship makes a voyage across the sea from the harbour.",
    "harbours.md": "# Harbours\n\nThe harbour has cranes, quays and a harbour master; the harbour opens at dawn.",
    "trains.md": "# Trains\n\nA locomotive pulls wagons along the rail to the harbour.",
    "logbooks.md": "# Logbooks\n\nEvery voyage is written in the logbook by the captain.",
}
MODEL = "scripted-embedder"


def write_folder(folder: Path) -> None:
    (folder / "notes").mkdir(parents=True)
    (folder / "eiffel.md").write_text("# The Eiffel Tower\n\nThe tower is 330 metres tall and stands in Paris.\n")
    (folder / "notes" / "louvre.html").write_text(
        "<html><head><title>The Louvre</title></head><body><article><p>The Louvre is the world's most-visited "
        "museum, in Paris. It holds the Mona Lisa and thousands of other works.</p></article></body></html>"
    )
    (folder / "bridges.txt").write_text("Paris has 37 bridges across the Seine. The tower is not a bridge.")
    (folder / "report.pdf").write_bytes(tiny_pdf(["Gustave Eiffel's company built the tower."], "Tower report"))
    (folder / "image.png").write_bytes(b"\x89PNG not indexed")


def write_second_folder(folder: Path) -> None:
    (folder / "eiffel.md").parent.mkdir(parents=True)
    (folder / "eiffel.md").write_text("# Eiffel's bridges\n\nGustave Eiffel also built the Garabit viaduct.\n")
    (folder / "rome.txt").write_text("The Colosseum in Rome held fifty thousand spectators.")


def embedder_for(
    server: ScriptedModel, dimensions: int | None = None, batch_size: int = 2, concurrency: int = 1
) -> Embedder:
    """One request at a time unless told: the scripted faults then meet the requests in the documents' order."""
    settings = EmbeddingSettings(
        base_url=server.base_url,
        model=MODEL,
        dimensions=dimensions,
        batch_size=batch_size,
        max_retries=0,
        concurrency=concurrency,
    )
    return Embedder(settings)


def write_documents(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in DOCUMENTS.items():
        (folder / name).write_text(text)
    return folder


async def urls(corpus: Corpus, query: str, limit: int = 10) -> list[str]:
    """The search's URLs, searched in a thread: the embeddings server answers on this event loop."""
    return [hit.result.url for hit in (await asyncio.to_thread(corpus.retrieve, query, limit)).hits]


def embedded_texts(server: ScriptedModel) -> list[str]:
    return [text for request in server.embedding_requests for text in request["input"]]


def vector_count(index: Path) -> int:
    with sqlite3.connect(index) as connection:
        (count,) = connection.execute("SELECT count(*) FROM vectors").fetchone()
    connection.close()
    return int(count)
