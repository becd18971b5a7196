"""An OpenAI-compatible /v1/embeddings endpoint serving a real small embedding model, for benchmarks.

    python3 bench/embeddings_server.py [--port 0] [--window 256]

Prints `listening on http://127.0.0.1:PORT/v1` once it accepts requests.
The model is WordLlama's l2_supercat at 256 dimensions: token embeddings distilled from a large
language model's, mean-pooled over the text's tokens, as WordLlama's own inference pools them. Its
weights and tokenizer are files inside the `wordllama` wheel on PyPI (the bench extra) and are read
from the installed package: nothing is downloaded, ever. Each input is cut to `window` tokens, as a
transformer embedder's window cuts it (256 is the window of the common small sentence embedders);
GET /stats says how many tokens the inputs had and how many of them the window cut.
  - POST /v1/embeddings: `input` a string or a list of strings; `encoding_format` float (the
    default here) or base64; `dimensions` 256 or absent. Vectors are unit length.
  - GET /v1/models, GET /stats.
Bad requests get 400 with an OpenAI-style error body.
"""

from __future__ import annotations

import argparse
import base64
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import wordllama
from safetensors import safe_open
from tokenizers import Tokenizer

MODEL = "wordllama-l2-supercat-256"
DIMENSIONS = 256
_PACKAGE = Path(wordllama.__file__).parent
WEIGHTS = _PACKAGE / "weights" / "l2_supercat_256.safetensors"
TOKENIZER = _PACKAGE / "tokenizers" / "l2_supercat_tokenizer_config.json"
MAX_INPUTS = 2048  # per request, as OpenAI's API allows


class Model:
    """The model's weights and tokenizer, read from the installed package; thread-safe."""

    def __init__(self, window: int) -> None:
        if not WEIGHTS.is_file() or not TOKENIZER.is_file():
            raise SystemExit(f"the wordllama package lacks its model files ({WEIGHTS}, {TOKENIZER})")
        with safe_open(str(WEIGHTS), framework="np") as weights:
            self._table = np.ascontiguousarray(weights.get_tensor("embedding.weight"), dtype=np.float32)
        self._tokenizer = Tokenizer.from_file(str(TOKENIZER))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(window)
        self._lock = threading.Lock()
        self.tokens = 0
        self.cut = 0
        self.inputs = 0

    def embed(self, texts: list[str]) -> tuple[np.ndarray, int]:
        """Unit vectors for the texts, and how many tokens they were given as."""
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=False)
        vectors = np.zeros((len(texts), self._table.shape[1]), dtype=np.float32)
        kept = cut = 0
        for row, encoding in enumerate(encodings):
            ids = np.clip(np.asarray(encoding.ids, dtype=np.int64), 0, len(self._table) - 1)
            if len(ids):
                vectors[row] = self._table[ids].mean(axis=0)
            kept += len(ids)
            cut += sum(len(piece.ids) for piece in encoding.overflowing)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors /= np.where(norms == 0, 1, norms)
        with self._lock:
            self.inputs += len(texts)
            self.tokens += kept + cut
            self.cut += cut
        return vectors, kept


class BadRequest(Exception):
    pass


def _inputs(body: Any) -> list[str]:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    given = body.get("input")
    texts = [given] if isinstance(given, str) else given
    if not isinstance(texts, list) or not texts or not all(isinstance(text, str) for text in texts):
        raise BadRequest("input must be a string or a non-empty list of strings")
    if len(texts) > MAX_INPUTS:
        raise BadRequest(f"at most {MAX_INPUTS} inputs per request")
    if body.get("dimensions") not in (None, DIMENSIONS):
        raise BadRequest(f"dimensions must be {DIMENSIONS}")
    if body.get("encoding_format", "float") not in ("float", "base64"):
        raise BadRequest("encoding_format must be float or base64")
    return texts


def handler(model: Model) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # Headers and body go out in two writes: without this, Nagle's algorithm holds the body back
            # until the client's delayed ACK, 40 ms a request.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "bench"}]})
            elif self.path == "/stats":
                self._send(200, {"inputs": model.inputs, "tokens": model.tokens, "cut": model.cut})
            else:
                self._send(404, {"error": {"message": f"no {self.path}", "type": "not_found"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if self.path != "/v1/embeddings":
                self._send(404, {"error": {"message": f"no {self.path}", "type": "not_found"}})
                return
            try:
                body = json.loads(raw)
                texts = _inputs(body)
            except (ValueError, BadRequest) as error:
                self._send(400, {"error": {"message": str(error), "type": "invalid_request_error"}})
                return
            vectors, tokens = model.embed(texts)
            as_base64 = body.get("encoding_format") == "base64"
            data = [
                {
                    "object": "embedding",
                    "index": index,
                    "embedding": base64.b64encode(vector.astype("<f4").tobytes()).decode()
                    if as_base64
                    else vector.tolist(),
                }
                for index, vector in enumerate(vectors)
            ]
            usage = {"prompt_tokens": tokens, "total_tokens": tokens}
            self._send(200, {"object": "list", "data": data, "model": MODEL, "usage": usage})

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--window", type=int, default=256, help="tokens of each input the model reads")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler(Model(args.window)))
    server.daemon_threads = True
    print(f"listening on http://127.0.0.1:{server.server_address[1]}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
