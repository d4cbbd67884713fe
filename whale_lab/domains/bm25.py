"""A small BM25 (Okapi) index: built once, queried many times, no dependency beyond the stdlib.

Titles are indexed with the text, so an entity's name finds its passages. Scores are plain
floats; ties break by corpus order so results are deterministic.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import Counter
from collections.abc import Sequence

_TOKEN = re.compile(r"[a-z0-9]+")
STOPWORDS = frozenset(
    "a an and are as at be by did do does for from had has have he her his in into is it its of on "
    "or she that the their them they this to was were what when where which who whom whose why "
    "with".split()
)


def tokenize(text: str) -> list[str]:
    """Lowercase alphanumeric tokens without common stopwords."""
    return [t for t in _TOKEN.findall(text.lower()) if t not in STOPWORDS]


class BM25Index:
    """Inverted index over documents; `search` returns (doc index, score), best first."""

    def __init__(self, documents: Sequence[str], k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.n_docs = len(documents)
        self._postings: dict[str, list[tuple[int, int]]] = {}
        self._doc_len: list[int] = []
        for i, doc in enumerate(documents):
            counts = Counter(tokenize(doc))
            self._doc_len.append(sum(counts.values()))
            for term, tf in counts.items():
                self._postings.setdefault(term, []).append((i, tf))
        self._avg_len = (sum(self._doc_len) / self.n_docs) if self.n_docs else 0.0
        self._idf = {
            term: math.log(1.0 + (self.n_docs - len(p) + 0.5) / (len(p) + 0.5))
            for term, p in self._postings.items()
        }
        # Per-document length normalisation, precomputed once.
        avg = self._avg_len or 1.0
        self._norm = [k1 * (1.0 - b + b * n / avg) for n in self._doc_len]

    def search(self, query: str, topk: int = 3) -> list[tuple[int, float]]:
        if topk <= 0 or not self.n_docs:
            return []
        scores: dict[int, float] = {}
        for term, qtf in Counter(tokenize(query)).items():
            postings = self._postings.get(term)
            if not postings:
                continue
            idf = self._idf[term]
            k1 = self.k1
            norm = self._norm
            for doc, tf in postings:
                scores[doc] = scores.get(doc, 0.0) + qtf * idf * tf * (k1 + 1.0) / (tf + norm[doc])
        best = heapq.nsmallest(topk, scores.items(), key=lambda kv: (-kv[1], kv[0]))
        return [(doc, score) for doc, score in best]
