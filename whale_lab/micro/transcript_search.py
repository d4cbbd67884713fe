"""Search pre-training dialogues: questions from encyclopedias disjoint from evaluation.

The policy answers only from the passage text the harness lets it see, so truncation or a
single passage decides what it can answer; two-hop questions need a second search.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence
from typing import Any

from whale_lab.domains.base import Task
from whale_lab.micro.styles import Style, sample_style
from whale_lab.micro.transcript_episode import Policy, RuntimeCache, Transcript, run_episode

PRETRAIN_CORPUS_SEEDS = (4242, 4243, 4244)


_SPAN = re.compile(r"\b(?:[A-Z][a-z]+(?: [A-Z][a-z]+)*|\d{3,4})\b")


def _visible(messages: list[dict[str, str]]) -> str:
    return messages[-1]["content"] if messages else ""


class SearchPolicy(Policy):
    def __init__(self, question: Any, style: Style, rng: random.Random) -> None:
        self.q = question
        self.style = style
        self.rng = rng
        self.hop = 0  # which hop's search comes next
        self.retried = False
        self.format_slip = rng.random() < 0.04
        self.wrong = rng.random() < 0.08
        self.used: set[str] = set()

    def _search(self, query: str) -> str:
        self.used.add(query)
        so, sc, _, _ = self.style.get("tags")
        return f"{so}{query}{sc}"

    def _answer(self, text: str) -> str:
        _, _, ao, ac = self.style.get("tags")
        return f"{ao}{text}{ac}"

    def _query(self, hop: int) -> str:
        canonical = self.q.queries[hop]
        r = self.rng.random()
        if hop == 0 and r < 0.15:
            return self.q.question.rstrip("?")
        if r < 0.25:
            return canonical.split(" ")[0] if " " in canonical else canonical
        return canonical

    def _guess(self, visible: str) -> str:
        spans = [s for s in _SPAN.findall(visible) if s not in self.q.question]
        spans = [s for s in spans if s not in ("Doc", "Title", "Results", "No")]
        if spans:
            return self.rng.choice(spans)
        words = [w for w in re.findall(r"[A-Z][a-z]+", self.q.question)]
        return self.rng.choice(words) if words else "unknown"

    def _found(self, visible: str, golds: Iterable[str]) -> str | None:
        from whale_lab.domains.text import contains_answer

        for g in golds:
            if contains_answer(visible, [g]):
                return g
        return None

    def respond(self, messages: list[dict[str, str]], history: list[dict[str, Any]]) -> str:
        last = history[-1]
        max_turns = int(self.style.get("max_turns", 2))
        turn = sum(1 for h in history if h["type"] == "response") + 1
        if last["type"] == "feedback":
            if self.hop == 0:
                return self._search(self._query(0))
            return self._answer(self._guess(_visible(messages)))
        obs = last.get("observation")
        if not obs:  # first turn
            if self.format_slip:
                self.format_slip = False
                return f"I will search for {self.q.queries[0]}."
            self.hop = 1
            return self._search(self._query(0))
        visible = _visible(messages)
        if self.q.hops == 2 and self.hop == 1:
            bridge = self._found(visible, [self.q.bridge])
            if bridge:
                self.hop = 2
                return self._search(self._query(1))
            if turn < max_turns and not self.retried:
                self.retried = True
                return self._search(self._other_query_first_hop())
            return self._answer(self._guess(visible))
        found = self._found(visible, self.q.answers)
        if found and not self.wrong:
            return self._answer(found)
        if not found and turn < max_turns and not self.retried:
            self.retried = True
            return self._search(self._other_query())
        return self._answer(self._guess(visible))

    def _other_query_first_hop(self) -> str:
        options = [self.q.question.rstrip("?"), self.q.queries[0]]
        fresh = [o for o in options if o not in self.used]
        return self.rng.choice(fresh) if fresh else self.q.queries[0]

    def _other_query(self) -> str:
        """A different query from the ones already tried: the question itself, or the entity."""
        canonical = self.q.queries[-1]
        options = [self.q.question.rstrip("?"), canonical, canonical.split(" ")[0]]
        fresh = [o for o in options if o not in self.used]
        return self.rng.choice(fresh) if fresh else canonical


def pretrain_encyclopedias(seeds: Sequence[int] = PRETRAIN_CORPUS_SEEDS) -> list[Any]:
    """Worlds disjoint from the evaluation encyclopedia (and from each other) in every name."""
    from whale_lab.domains.encyclopedia import build_encyclopedia, default_encyclopedia

    avoid = set(default_encyclopedia().name_words)
    worlds = []
    for s in seeds:
        world = build_encyclopedia(s, avoid=avoid)
        avoid |= set(world.name_words)
        worlds.append(world)
    return worlds


def search_transcripts(
    n: int, rng: random.Random, cache: RuntimeCache | None = None
) -> list[Transcript]:
    from whale_lab.domains.search import BM25Retriever, SearchEnv, normalise_search_action

    cache = cache or RuntimeCache()
    worlds = pretrain_encyclopedias()
    pools = []
    for w in worlds:
        retriever = BM25Retriever(w.passage_dicts())
        qs = list(w.questions)
        rng.shuffle(qs)
        pools.append((retriever, qs))
    out = []
    for i in range(n):
        retriever, qs = pools[i % len(pools)]
        q = qs[(i // len(pools)) % len(qs)]
        task = Task(
            id=f"micro-search-{i:05d}",
            domain="search",
            fields={"question": q.question},
            answer=list(q.answers),
            meta={"hops": q.hops},
        )
        style = sample_style("search", rng)
        env = SearchEnv(task, retriever)
        out.append(
            run_episode(
                task,
                env,
                normalise_search_action,
                cache.get(style),
                style,
                SearchPolicy(q, style, rng),
            )
        )
    return out
