"""The search domain: questions answered with a `search` tool over a passage corpus.

The default is the built-in fictional encyclopedia with a BM25 index (built once, on first use);
a user's corpus JSONL works the same way, and a Search-R1 retrieval server replaces BM25 when
`domain.retriever_url` is set. The verifier is normalised exact match, or with `[domain.judge]`
an LLM judge with exact match as its fallback (`judge.py`; both verdicts recorded per episode);
token F1 and whether any retrieved passage contained the answer are recorded for diagnostics.
"""

from __future__ import annotations

import random
import re
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from whale_lab.config import split_seed
from whale_lab.domains.actions import normalise_answer_or_tool
from whale_lab.domains.base import SPLITS, Action, Domain, Env, Split, StepOutcome, Task
from whale_lab.domains.bm25 import BM25Index
from whale_lab.domains.encyclopedia import Encyclopedia, Question, default_encyclopedia
from whale_lab.domains.judge import CORRECT, FALLBACK, INCORRECT, Judge
from whale_lab.domains.loaders import (
    SPLIT_ORDER,
    DataError,
    fit_split_sizes,
    load_corpus_file,
    load_questions_file,
    split_indices,
)
from whale_lab.domains.text import contains_answer, exact_match, token_f1

if TYPE_CHECKING:
    from whale_lab.config import Config

TOOLS = ("search",)
DEFAULT_TOPK = 3
MAX_TOPK = 10
TWO_HOP_SHARE = 0.4  # share of two-hop questions in every split of the built-in data


class Retriever(Protocol):
    def search(self, query: str, topk: int) -> list[dict[str, Any]]:
        """Passages {"id","title","text","score"}, best first."""
        ...

    def close(self) -> None: ...


class BM25Retriever:
    """BM25 over titled passages; the index is built on the first query, once, thread-safely."""

    def __init__(self, passages: Sequence[Mapping[str, str]]) -> None:
        self.passages = [dict(p) for p in passages]
        self._index: BM25Index | None = None
        self._lock = threading.Lock()

    @property
    def index(self) -> BM25Index:
        if self._index is None:
            with self._lock:
                if self._index is None:
                    self._index = BM25Index([f"{p['title']} {p['text']}" for p in self.passages])
        return self._index

    def search(self, query: str, topk: int) -> list[dict[str, Any]]:
        return [
            {**self.passages[i], "score": round(score, 4)}
            for i, score in self.index.search(query, topk)
        ]

    def close(self) -> None:
        pass


class RemoteRetriever:
    """A Search-R1 retrieval server (see retriever_client.py)."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        from whale_lab.domains.retriever_client import RetrieverClient

        self.client = RetrieverClient(url, timeout_s=timeout_s)

    def search(self, query: str, topk: int) -> list[dict[str, Any]]:
        return self.client.search(query, topk)

    def close(self) -> None:
        self.client.close()


# ------------------------------------------------------------------ verifier


def extract_answer_text(prediction: str) -> str:
    """The inside of the last <answer>...</answer> when a harness left the tags in."""
    found = re.findall(r"<answer>(.*?)</answer>", str(prediction), flags=re.S | re.I)
    return found[-1].strip() if found else str(prediction).strip()


def verify_search(prediction: str, golds: Sequence[str]) -> tuple[bool, float]:
    """(normalised exact match, best token F1) of an answer against the gold answers."""
    text = extract_answer_text(prediction)
    return exact_match(text, golds), token_f1(text, golds)


def _golds(answer: Any) -> list[str]:
    if isinstance(answer, str):
        return [answer]
    return [str(a) for a in answer]


# ------------------------------------------------------------------ actions


def normalise_search_action(raw: Any) -> Action:
    """parse_action's return value -> Action; topk defaults to 3 and is clipped to 1..10."""

    def read_tool(name: str, args: Mapping[str, Any]) -> Action:
        query = args.get("query")
        if not isinstance(query, str) or not query.strip():
            return Action(kind="invalid", reason="search call without a query")
        topk_raw = args.get("topk", DEFAULT_TOPK)
        if topk_raw is None:
            topk_raw = DEFAULT_TOPK
        if isinstance(topk_raw, str) and topk_raw.strip().isdigit():
            topk_raw = int(topk_raw.strip())
        if isinstance(topk_raw, bool) or not isinstance(topk_raw, (int, float)):
            return Action(kind="invalid", reason=f"topk must be an integer, got {topk_raw!r}")
        topk = max(1, min(MAX_TOPK, int(topk_raw)))
        return Action(kind="tool", tool="search", args={"query": query.strip(), "topk": topk})

    return normalise_answer_or_tool(raw, TOOLS, read_tool, domain="search", default_arg="query")


# ------------------------------------------------------------------ environment


class SearchEnv(Env):
    """One question: searches give observations; the first answer ends the episode."""

    def __init__(self, task: Task, retriever: Retriever, judge: Judge | None = None) -> None:
        self.task = task
        self.retriever = retriever
        self.judge = judge
        self.verdict: str | None = None  # the judge's: correct | incorrect | fallback
        self.golds = _golds(task.answer)
        self.searches = 0
        self.recall = False
        self.answer: str | None = None
        self.em = False
        self.f1 = 0.0

    def initial_observation(self) -> Any:
        return None

    def context(self) -> dict[str, Any]:
        return {}

    def step(self, action: Action) -> StepOutcome:
        if action.kind == "answer":
            self.answer = action.value
            self.em, self.f1 = verify_search(action.value, self.golds)
            correct = self.em
            info: dict[str, Any] = {"em": self.em, "f1": self.f1, "answer": action.value}
            if self.judge is not None:
                said = self.judge.verdict(
                    str(self.task.fields.get("question", "")),
                    self.golds,
                    extract_answer_text(action.value),
                )
                self.verdict = FALLBACK if said is None else CORRECT if said else INCORRECT
                correct = self.em if said is None else said
                info["judge"] = self.verdict
            return StepOutcome(
                done=True,
                reward=1.0 if correct else 0.0,
                stop_reason="answered",
                info=info,
            )
        if action.kind == "tool" and action.tool == "search":
            query = str(action.args.get("query", ""))
            topk = max(1, min(MAX_TOPK, int(action.args.get("topk", DEFAULT_TOPK))))
            passages = self.retriever.search(query, topk)
            self.searches += 1
            hit = any(contains_answer(f"{p['title']} {p['text']}", self.golds) for p in passages)
            self.recall = self.recall or hit
            return StepOutcome(
                observation={"query": query, "passages": passages}, info={"answer_in_results": hit}
            )
        detail = action.reason or f"unsupported action {action.kind!r} {action.tool!r}".strip()
        return StepOutcome(feedback_kind="format", feedback_detail=detail)

    def final_info(self) -> dict[str, Any]:
        return {
            "em": self.em,
            "f1": self.f1,
            "retrieval_recall": self.recall,
            "searches": self.searches,
            "answered": self.answer is not None,
            "hops": self.task.meta.get("hops"),
            **({"judge": self.verdict} if self.judge is not None else {}),
        }


# ------------------------------------------------------------------ domain


def _stratified_splits(
    questions: Sequence[Question], sizes: Mapping[str, int], seed: int
) -> dict[str, list[Question]]:
    """Seeded disjoint splits with the same one-hop / two-hop mix in each (test drawn first),
    sized by the one rule for too-small data (`loaders.fit_split_sizes`)."""
    sizes, _note = fit_split_sizes(
        len(questions), sizes, f"the built-in encyclopedia has {len(questions)} questions", "search"
    )
    rng = random.Random(f"whale-search-split:{seed}")
    pools = {h: [q for q in questions if q.hops == h] for h in (1, 2)}
    for pool in pools.values():
        rng.shuffle(pool)
    out: dict[str, list[Question]] = {}
    for split in SPLIT_ORDER:
        n = sizes[split]
        k2 = min(round(n * TWO_HOP_SHARE), len(pools[2]))
        k1 = min(n - k2, len(pools[1]))
        k2 = min(n - k1, len(pools[2]))
        chosen = pools[1][:k1] + pools[2][:k2]
        pools[1], pools[2] = pools[1][k1:], pools[2][k2:]
        rng.shuffle(chosen)
        out[split] = chosen
    return out


class SearchDomain(Domain):
    name = "search"

    def __init__(
        self, splits: Mapping[str, list[Task]], retriever: Retriever, judge: Judge | None = None
    ) -> None:
        missing = [s for s in SPLITS if s not in splits]
        if missing:
            raise ValueError(f"missing splits: {missing}")
        self._splits = {s: list(splits[s]) for s in SPLITS}
        self.retriever = retriever
        self.judge = judge

    @staticmethod
    def builtin_tasks(
        seed: int, sizes: Mapping[str, int], encyclopedia: Encyclopedia | None = None
    ) -> dict[str, list[Task]]:
        enc = encyclopedia or default_encyclopedia()
        chosen = _stratified_splits(enc.questions, sizes, seed)
        return {
            split: [
                Task(
                    id=f"search-{split}-{i:05d}",
                    domain="search",
                    fields={"question": q.question},
                    answer=list(q.answers),
                    meta={**q.meta(), "source": f"builtin:{q.id}"},
                )
                for i, q in enumerate(qs)
            ]
            for split, qs in chosen.items()
        }

    @staticmethod
    def file_tasks(path: str, seed: int, sizes: Mapping[str, int]) -> dict[str, list[Task]]:
        records = load_questions_file(path)
        index = split_indices([r.question for r in records], sizes, seed, "search", path)
        return {
            split: [
                Task(
                    id=f"search-{split}-{i:05d}",
                    domain="search",
                    fields={"question": records[j].question},
                    answer=list(records[j].answers),
                    meta={"answers": list(records[j].answers), "source": records[j].where},
                )
                for i, j in enumerate(idxs)
            ]
            for split, idxs in index.items()
        }

    @classmethod
    def builtin(cls, seed: int, sizes: Mapping[str, int]) -> SearchDomain:
        """Built-in questions over the built-in encyclopedia with BM25."""
        enc = default_encyclopedia()
        return cls(cls.builtin_tasks(seed, sizes, enc), BM25Retriever(enc.passage_dicts()))

    @classmethod
    def from_config(cls, cfg: Config) -> SearchDomain:
        d = cfg.domain
        sizes = {s: getattr(d.splits, s) for s in SPLITS}
        source = d.source.strip() or "builtin"
        retriever: Retriever
        if d.retriever_url.strip():
            retriever = RemoteRetriever(d.retriever_url)
        elif d.corpus.strip():
            retriever = BM25Retriever(load_corpus_file(d.corpus.strip()))
        elif source == "builtin":
            retriever = BM25Retriever(default_encyclopedia().passage_dicts())
        else:
            raise DataError(
                f"domain.source is a question file ({source}) but neither "
                f"domain.corpus nor domain.retriever_url is set, so its answers could "
                f"not be searched; set one of them"
            )
        if source == "builtin":
            splits = cls.builtin_tasks(split_seed(cfg), sizes)
        else:
            splits = cls.file_tasks(source, split_seed(cfg), sizes)
        judge = Judge.from_config(d.judge) if d.judge.enabled else None
        return cls(splits, retriever, judge)

    def tasks(self, split: Split) -> list[Task]:
        if split not in self._splits:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        return list(self._splits[split])

    def make_env(self, task: Task) -> SearchEnv:
        return SearchEnv(task, self.retriever, self.judge)

    def normalise_action(self, raw: Any) -> Action:
        return normalise_search_action(raw)

    def close(self) -> None:
        self.retriever.close()
        if self.judge is not None:
            self.judge.close()
