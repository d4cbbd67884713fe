"""Client for a Search-R1 style retrieval server (e5 + FAISS over Wikipedia, or any compatible one).

Protocol: POST {url}/retrieve with {"queries": [...], "topk": k, "return_scores": true}; the reply is
{"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]}, one list per query. The
title is the first line of "contents". A server that is down or answers nonsense is an
infrastructure problem the user must fix, so it raises `RetrieverError` with the URL and the cause.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from whale_lab.domains.loaders import split_contents
from whale_lab.errors import WhaleLabError


class RetrieverError(WhaleLabError, RuntimeError):
    """The retrieval server could not be reached or answered something unusable."""


class RetrieverClient:
    """Batched search against `{base_url}/retrieve`."""

    def __init__(self, base_url: str, timeout_s: float = 30.0, retries: int = 2) -> None:
        import httpx

        url = base_url.strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise RetrieverError(
                f"domain.retriever_url must start with http:// or https://, got {base_url!r}"
            )
        self.url = url if url.endswith("/retrieve") else url + "/retrieve"
        self.retries = retries
        self._client = httpx.Client(timeout=timeout_s)

    def search_many(self, queries: Sequence[str], topk: int) -> list[list[dict[str, Any]]]:
        """Passages {"id","title","text","score"} for each query, best first."""
        import httpx

        payload = {"queries": list(queries), "topk": int(topk), "return_scores": True}
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                response = self._client.post(self.url, json=payload)
            except httpx.TimeoutException as exc:
                last = exc
                reason = "timed out"
            except httpx.HTTPError as exc:
                last = exc
                reason = f"unreachable ({type(exc).__name__}: {exc})"
            else:
                if response.status_code >= 500 and attempt < self.retries:
                    time.sleep(0.2 * (attempt + 1))
                    continue
                if response.status_code != 200:
                    raise RetrieverError(
                        f"retriever at {self.url} answered HTTP "
                        f"{response.status_code}: {response.text[:200]}"
                    )
                return self._parse(response, len(queries))
            if attempt < self.retries:
                time.sleep(0.2 * (attempt + 1))
        raise RetrieverError(f"retriever at {self.url} {reason}; is the server running?") from last

    def search(self, query: str, topk: int) -> list[dict[str, Any]]:
        return self.search_many([query], topk)[0]

    def _parse(self, response: Any, n_queries: int) -> list[list[dict[str, Any]]]:
        try:
            data = response.json()
        except ValueError:
            raise RetrieverError(
                f"retriever at {self.url} answered malformed JSON: {response.text[:200]!r}"
            ) from None
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list) or len(result) != n_queries:
            raise RetrieverError(
                f"retriever at {self.url} answered an unexpected shape: expected "
                f'{{"result": [...]}} with {n_queries} list(s), got '
                f"{str(data)[:200]}"
            )
        out: list[list[dict[str, Any]]] = []
        for hits in result:
            if not isinstance(hits, list):
                raise RetrieverError(f"retriever at {self.url}: each result must be a list of hits")
            passages = []
            for hit in hits:
                doc = hit.get("document") if isinstance(hit, dict) else None
                if isinstance(hit, dict) and doc is None and "contents" in hit:
                    doc = hit  # servers run without return_scores send bare documents
                if not isinstance(doc, dict) or not isinstance(doc.get("contents"), str):
                    raise RetrieverError(
                        f"retriever at {self.url}: a hit has no document.contents: {str(hit)[:200]}"
                    )
                title, text = split_contents(doc["contents"])
                score = hit.get("score", 0.0)
                passages.append(
                    {
                        "id": str(doc.get("id", "")),
                        "title": title,
                        "text": text,
                        "score": round(float(score), 4) if isinstance(score, (int, float)) else 0.0,
                    }
                )
            out.append(passages)
        return out

    def close(self) -> None:
        self._client.close()
