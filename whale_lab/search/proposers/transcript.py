"""A proposer session's transcript: what was asked, answered and run, kept beside its candidates.

The transcript is how a reviewer learns why a candidate looks the way it does, and what makes a
session replayable (`proposer.replay`). Every text in it (message contents, tool arguments, tool
results) is cut to `FIELD_CHARS`, a reply keeps at most `MAX_CALLS_PER_REPLY` of its tool calls,
and once `MAX_TOTAL_CHARS` are recorded later entries are only counted, so a hostile endpoint
cannot fill the disk through it. The candidates themselves are kept whole (the archive caps their
size), since a replay must reproduce them exactly.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from whale_lab.search.proposers.base import ProposedCandidate, ProposerUsageRecord

FORMAT = "whale-lab proposer transcript"
VERSION = 1
FIELD_CHARS = 8_000
MAX_CALLS_PER_REPLY = 64
MAX_TOTAL_CHARS = 2_000_000


def cut(text: Any, cap: int = FIELD_CHARS) -> str:
    """`text` as a string of at most about `cap` characters, saying how much was cut."""
    s = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False, default=str)
    if len(s) <= cap:
        return s
    return s[:cap] + f"\n[... cut: {len(s) - cap:,} of {len(s):,} characters not kept]"


def candidate_record(c: ProposedCandidate) -> dict[str, Any]:
    return {
        "code": c.code,
        "hypothesis": c.hypothesis,
        "parent_id": c.parent_id,
        "surface": c.surface,
        "mechanism": c.mechanism,
        "cited_traces": list(c.cited_traces),
    }


def candidate_from_record(rec: dict[str, Any]) -> ProposedCandidate:
    cited = rec.get("cited_traces") or []
    return ProposedCandidate(
        code=str(rec.get("code", "")),
        hypothesis=str(rec.get("hypothesis", "")),
        parent_id=str(rec.get("parent_id", "")),
        surface=str(rec.get("surface", "")),
        mechanism=str(rec.get("mechanism", "")),
        cited_traces=tuple(str(x) for x in cited) if isinstance(cited, list) else (),
    )


class Transcript:
    """Entries of one session in order, within the caps; `to_dict` is the file's content."""

    def __init__(self, proposer: str, **header: Any) -> None:
        self.header: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "session_id": uuid.uuid4().hex[:12],
            "proposer": proposer,
            "started": time.time(),
            **header,
        }
        self.entries: list[dict[str, Any]] = []
        self.dropped = 0
        self._chars = 0
        self._sent = 0  # messages already recorded in an earlier request entry

    def add(self, kind: str, **fields: Any) -> None:
        entry = {"kind": kind, "t": round(time.time() - self.header["started"], 3), **fields}
        size = len(json.dumps(entry, ensure_ascii=False, default=str))
        if self._chars + size > MAX_TOTAL_CHARS:
            self.dropped += 1
            return
        self._chars += size
        self.entries.append(entry)

    def request(self, index: int, payload: dict[str, Any], size: int) -> None:
        """A request: its settings and the messages new since the previous one."""
        messages = payload.get("messages") or []
        new = messages[self._sent :]
        self._sent = len(messages)
        self.add(
            "request",
            index=index,
            bytes=size,
            max_tokens=payload.get("max_tokens"),
            messages_total=len(messages),
            messages=[
                {"role": str(m.get("role", "")), "content": cut(m.get("content") or "")}
                for m in new
                # replies and tool results have entries of their own
                if isinstance(m, dict) and m.get("role") not in ("assistant", "tool")
            ],
        )

    def reply(self, index: int, data: dict[str, Any], message: dict[str, Any]) -> None:
        calls = message.get("tool_calls") or []
        calls = calls if isinstance(calls, list) else []
        kept = []
        for call in calls[:MAX_CALLS_PER_REPLY]:
            fn = call.get("function") if isinstance(call, dict) else None
            fn = fn if isinstance(fn, dict) else {}
            kept.append(
                {
                    "id": cut(call.get("id", "") if isinstance(call, dict) else "", 200),
                    "name": cut(fn.get("name", ""), 200),
                    "arguments": cut(fn.get("arguments", "")),
                }
            )
        choice = data.get("choices", [{}])[0] if isinstance(data.get("choices"), list) else {}
        self.add(
            "reply",
            index=index,
            content=cut(message.get("content") or ""),
            tool_calls=kept,
            tool_calls_total=len(calls),
            finish_reason=choice.get("finish_reason") if isinstance(choice, dict) else None,
            usage=data.get("usage") if isinstance(data.get("usage"), dict) else None,
        )

    def tool(self, index: int, call: Any, result: str) -> None:
        fn = call.get("function") if isinstance(call, dict) else None
        fn = fn if isinstance(fn, dict) else {}
        self.add(
            "tool",
            request=index,
            id=cut(call.get("id", "") if isinstance(call, dict) else "", 200),
            name=cut(fn.get("name", ""), 200),
            arguments=cut(fn.get("arguments", "")),
            result=cut(result),
        )

    def to_dict(
        self,
        *,
        candidates: tuple[ProposedCandidate, ...],
        usage: ProposerUsageRecord,
        note: str,
        error: str,
    ) -> dict[str, Any]:
        return {
            **self.header,
            "seconds": round(usage.seconds, 3),
            "entries": self.entries,
            "entries_dropped": self.dropped,
            "candidates": [candidate_record(c) for c in candidates],
            "usage": {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "cost": usage.cost,
                "tool_calls": usage.tool_calls,
                "requests": usage.requests,
            },
            "note": note,
            "error": error,
        }


def is_transcript(data: Any) -> bool:
    return isinstance(data, dict) and data.get("format") == FORMAT


def load_transcript(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if is_transcript(data) else None
