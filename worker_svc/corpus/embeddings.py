"""Texts to vectors through the model endpoint's /v1/embeddings.

Any OpenAI-compatible provider serves embeddings (vLLM, Ollama, llama.cpp, hosted APIs);
the deployment names the model. Vectors are unit length, so cosine similarity is a dot
product.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from quarry.agent.model import ModelSettings

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from quarry.config import QuarrySettings, WorkerSettings

# numpy (10 MiB of a worker's memory) is imported by the code that embeds: most workers never do.
Vectors: TypeAlias = "npt.NDArray[np.float32]"


class EmbeddingError(Exception):
    """The embeddings endpoint failed, or answered vectors that cannot be used."""


class UnusableVectors(EmbeddingError):
    """The endpoint answered, with vectors that cannot be used (another size, NaN): asking again will not help."""


@dataclass(frozen=True)
class EmbeddingSettings:
    base_url: str
    model: str
    api_key: str = "unused"
    # Asked for and checked; None takes the model's own size.
    dimensions: int | None = None
    # Texts per request while indexing, and requests in flight at once.
    batch_size: int = 64
    concurrency: int = 4
    # The passages' size, in the model's tokens (estimated), and their overlap.
    passage_tokens: int = 256
    passage_overlap_tokens: int = 32
    request_timeout: float = 120.0
    # The openai SDK's retries (429, 5xx, connection errors), with its backoff.
    max_retries: int = 2

    @classmethod
    def for_worker(cls, settings: WorkerSettings, common: QuarrySettings) -> EmbeddingSettings | None:
        """The worker's embeddings, or None when no embedding model is configured; the endpoint, key and
        timeout fall back to the worker tier's model settings."""
        if not settings.embedding_model:
            return None
        tier = ModelSettings.for_tier(settings, common)
        return cls(
            base_url=settings.embedding_base_url or tier.base_url,
            model=settings.embedding_model,
            api_key=settings.embedding_api_key or tier.api_key,
            dimensions=settings.embedding_dimensions,
            batch_size=settings.embedding_batch_size,
            concurrency=settings.embedding_concurrency,
            passage_tokens=settings.embedding_passage_tokens,
            passage_overlap_tokens=settings.embedding_passage_overlap_tokens,
            request_timeout=tier.request_timeout,
        )


class Embedder:
    """Texts to unit vectors through /v1/embeddings. Blocking and thread-safe: async callers use a thread."""

    def __init__(self, settings: EmbeddingSettings) -> None:
        # Imported here: the SDK takes most of a second to import, and most workers never embed.
        import openai

        self.settings = settings
        self._status_error = openai.APIStatusError
        self._client = openai.OpenAI(
            base_url=settings.base_url,
            api_key=settings.api_key,
            max_retries=settings.max_retries,
            timeout=settings.request_timeout,
        )

    def close(self) -> None:
        self._client.close()

    def embed(self, texts: Sequence[str]) -> Vectors:
        """One request: a row per text, in order, each of unit length (or zero). Raises EmbeddingError."""
        where = f"the embeddings endpoint {self.settings.base_url} (model {self.settings.model!r})"
        request: dict[str, Any] = {"model": self.settings.model, "input": list(texts), "encoding_format": "float"}
        if self.settings.dimensions is not None:
            request["dimensions"] = self.settings.dimensions
        try:
            # Read as plain JSON: the SDK's models cost a Python object per number, more than all else here.
            response = self._client.embeddings.with_raw_response.create(**request).http_response.json()
            rows = [item["embedding"] for item in sorted(response["data"], key=lambda item: item["index"])]
        except self._status_error as error:
            # The SDK's message repeats the status; the body's own says what went wrong.
            detail = error.body.get("message") if isinstance(error.body, dict) else None
            raise EmbeddingError(f"{where} answered HTTP {error.status_code}: {detail or error.message}") from error
        except Exception as error:  # the SDK, httpx or a malformed answer: all are the endpoint failing
            raise EmbeddingError(f"{where} failed: {type(error).__name__}: {error}") from error
        if len(rows) != len(texts):
            raise UnusableVectors(f"{where} answered {len(rows)} vectors for {len(texts)} texts")
        sizes = sorted({len(row) for row in rows})
        if len(sizes) > 1 or not sizes or sizes[0] == 0:
            raise UnusableVectors(f"{where} answered vectors of sizes {sizes}, not one size")
        if self.settings.dimensions is not None and sizes[0] != self.settings.dimensions:
            raise UnusableVectors(
                f"{where} answered {sizes[0]}-dimensional vectors, but embedding_dimensions is "
                f"{self.settings.dimensions}: set it to a size the model gives"
            )
        import numpy as np

        try:
            matrix = np.asarray(rows, dtype=np.float32)
        except (TypeError, ValueError) as error:
            raise UnusableVectors(f"{where} answered vectors that are not numbers: {error}") from error
        if not np.isfinite(matrix).all():
            raise UnusableVectors(f"{where} answered vectors with NaN or infinite values")
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        unit: Vectors = (matrix / np.where(norms == 0, 1, norms)).astype(np.float32)
        return unit
