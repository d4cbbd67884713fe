"""An LLM judge for search answers over any OpenAI-compatible endpoint (`[domain.judge]`).

The paper's SearchQA verifier asks an LLM judge whether the answer inside `<answer>` means a
reference answer, with exact match as the fallback. Here the judge's rules come from a text file
(`domain.judge.rules`, default `judge_rules.md` beside this module), the judge must reply
CORRECT or INCORRECT, and anything else (an unreachable endpoint, an HTTP error, another reply)
falls back to normalised exact match; every episode records both verdicts, and the reward says
which one it came from. Repeated (question, answer) pairs are judged once.

The judge runs in the engine process only: harness code never sees it, its key or its verdicts
(an episode ends when it answers, so no verdict reaches the model). Calls, tokens and fallbacks
are counted in `METER`, which the run's ledger folds in each time it is written.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from whale_lab.domains.errors import DataError

if TYPE_CHECKING:
    from whale_lab.config import JudgeConfig

log = logging.getLogger("whale_lab.domains.judge")
DEFAULT_RULES = Path(__file__).with_name("judge_rules.md")
CORRECT, INCORRECT, FALLBACK = "correct", "incorrect", "fallback"
_CACHE_LIMIT = 50_000


@dataclass
class JudgeUsage:
    calls: int = 0  # requests answered by the endpoint
    prompt_tokens: int = 0
    completion_tokens: int = 0
    fallbacks: int = 0  # verdicts that fell back to exact match
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class JudgeMeter:
    """Process-wide judge usage since it was last taken (the ledger takes it when it writes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._usage = JudgeUsage()

    def add(self, **kw: float) -> None:
        with self._lock:
            for k, v in kw.items():
                setattr(self._usage, k, getattr(self._usage, k) + v)

    def take(self) -> JudgeUsage:
        with self._lock:
            out, self._usage = self._usage, JudgeUsage()
        return out


METER = JudgeMeter()


def read_rules(path: str) -> str:
    where = Path(path).expanduser() if path.strip() else DEFAULT_RULES
    try:
        text = where.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"domain.judge.rules: cannot read {where} ({exc})") from None
    if not text:
        raise DataError(f"domain.judge.rules: {where} is empty")
    return text


class Judge:
    """CORRECT / INCORRECT from an endpoint, or None (the caller falls back to exact match)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        rules: str,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 60.0,
        max_retries: int = 2,
        max_tokens: int = 16,
        meter: JudgeMeter = METER,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise DataError(
                f"domain.judge.base_url must start with http:// or https://, got {base_url!r}"
            )
        if not model:
            raise DataError("domain.judge.model: the judge endpoint's model name is not set")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.rules = rules
        self.max_retries = max_retries
        self.max_tokens = max_tokens
        self.meter = meter
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(api_key_env, "") if api_key_env else ""
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(headers=headers, timeout=timeout_s)
        self._cache: dict[tuple[str, str], bool] = {}
        self._lock = threading.Lock()
        self.last_error = ""
        self._warned = False

    @classmethod
    def from_config(cls, jc: JudgeConfig) -> Judge:
        return cls(
            jc.base_url,
            jc.model,
            read_rules(jc.rules),
            api_key_env=jc.api_key_env,
            timeout_s=jc.request_timeout_s,
            max_retries=jc.max_retries,
            max_tokens=jc.max_tokens,
        )

    def messages(self, question: str, golds: Sequence[str], answer: str) -> list[dict[str, str]]:
        refs = "\n".join(f"- {g}" for g in golds)
        user = f"Question: {question}\nReference answers:\n{refs}\nPredicted answer: {answer}"
        return [{"role": "system", "content": self.rules}, {"role": "user", "content": user}]

    def verdict(self, question: str, golds: Sequence[str], answer: str) -> bool | None:
        key = (question, answer.strip())
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        decided = self._ask(question, golds, answer)
        if decided is None:
            self.meter.add(fallbacks=1)
            if not self._warned:  # once: the ledger counts the rest
                self._warned = True
                log.warning(
                    "the judge at %s gave no verdict (%s): exact match decides instead",
                    self.url,
                    self.last_error,
                )
            return None
        with self._lock:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = decided
        return decided

    def _ask(self, question: str, golds: Sequence[str], answer: str) -> bool | None:
        body = {
            "model": self.model,
            "messages": self.messages(question, golds, answer),
            "temperature": 0.0,
            "max_tokens": self.max_tokens,
        }
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(min(4.0, 0.25 * 2**attempt))
            t0 = time.perf_counter()
            try:
                resp = self._client.post(self.url, json=body)
            except httpx.HTTPError as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                continue
            finally:
                self.meter.add(seconds=time.perf_counter() - t0)
            if resp.status_code >= 500 or resp.status_code == 429:
                self.last_error = f"HTTP {resp.status_code}"
                continue
            if resp.status_code >= 300:
                self.last_error = f"HTTP {resp.status_code}: {resp.text[:200]}"
                return None
            return self._read(resp)
        return None

    def _read(self, resp: httpx.Response) -> bool | None:
        try:
            data = resp.json()
            text = str(data["choices"][0]["message"]["content"] or "")
        except (ValueError, KeyError, IndexError, TypeError):
            self.last_error = "the judge's answer is not a chat completion"
            return None
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        self.meter.add(
            calls=1,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
        )
        word = text.strip().split()[0].strip(".:!*`'\"").upper() if text.strip() else ""
        if word in ("CORRECT", "INCORRECT"):
            return word == "CORRECT"
        self.last_error = f"the judge replied {text.strip()[:60]!r}, not CORRECT or INCORRECT"
        return None

    def close(self) -> None:
        self._client.close()
