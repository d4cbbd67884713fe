"""Failure statistics read from a candidate's raw traces: the evidence proposers cite.

Everything here is computed from what the archive holds (prompts, raw outputs, parsed actions,
observations, feedback, stop reasons, rewards); nothing needs the reference answers.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from whale_lab.search.archive import trace_id

_NON_WORD = re.compile(r"[^0-9a-z]+")


def _norm(text: str) -> str:
    """Lower-case words only, so formatting (colons, tags, '...') does not hide a match."""
    return _NON_WORD.sub(" ", str(text).lower()).strip()


def passage_texts(observation: Any) -> list[str]:
    """The text pieces of a tool observation (passages, a result string), for coverage checks."""
    if observation is None:
        return []
    if isinstance(observation, str):
        return [observation] if observation.strip() else []
    if isinstance(observation, dict):
        for key in ("passages", "results", "documents", "docs", "hits", "items", "contexts"):
            if isinstance(observation.get(key), list):
                return passage_texts(observation[key])
        for key in ("text", "content", "contents", "passage", "output", "stdout", "result"):
            if isinstance(observation.get(key), str):
                return passage_texts(observation[key])
        return []
    if isinstance(observation, (list, tuple)):
        out: list[str] = []
        for item in observation:
            if isinstance(item, str):
                out.extend(passage_texts(item))
            elif isinstance(item, dict):
                for k in ("text", "content", "contents", "passage", "title"):
                    if isinstance(item.get(k), str) and item[k].strip():
                        out.append(item[k])
                        break
        return out
    return [str(observation)]


def _shown_after(turns: list[dict[str, Any]], i: int) -> str | None:
    """Text of the messages the model saw on the turn after turn i (None when there was none)."""
    if i + 1 >= len(turns):
        return None
    prompt = turns[i + 1].get("prompt") or []
    return "\n".join(str(m.get("content", "")) for m in prompt if m.get("role") != "assistant")


@dataclass
class FailureStats:
    """Counts over one candidate's episodes, with example trace ids for each kind."""

    candidate_id: str
    episodes: int = 0
    successes: int = 0
    turns_total: int = 0
    stop_reasons: Counter = field(default_factory=Counter)
    # unparseable replies: (trace id, response, finish_reason)
    invalid_turns: list[tuple[str, str, str]] = field(default_factory=list)
    format_failure_eps: list[str] = field(default_factory=list)
    tool_error_eps: list[str] = field(default_factory=list)
    tool_error_details: list[str] = field(default_factory=list)
    tool_error_args: list[dict[str, Any]] = field(default_factory=list)
    turn_cap_eps: list[str] = field(default_factory=list)
    illegal_eps: list[str] = field(default_factory=list)
    illegal_turns: int = 0
    wrong_eps: list[str] = field(default_factory=list)
    wrong_few_tools_eps: list[str] = field(default_factory=list)  # wrong after <= 1 tool call
    wrong_no_tool_eps: list[str] = field(default_factory=list)
    # wrong although a retrieved passage held the answer (the domain's retrieval_recall flag)
    recall_wrong_eps: list[str] = field(default_factory=list)
    length_cut_turns: list[str] = field(default_factory=list)  # generation hit max_new_tokens
    context_cap_eps: list[str] = field(default_factory=list)  # prompt outgrew the context
    harness_error_eps: list[str] = field(default_factory=list)
    harness_errors: list[str] = field(default_factory=list)
    # tool observations whose passages were cut (head shown, tail not) or hidden (not shown)
    observations: int = 0
    truncated_obs: list[str] = field(default_factory=list)
    passages_seen: int = 0
    passages_truncated: int = 0
    passages_hidden: int = 0
    passage_lengths: list[int] = field(default_factory=list)
    passages_per_obs: list[int] = field(default_factory=list)
    # what valid replies looked like: tool names with their argument keys, tags used
    tool_usage: Counter = field(default_factory=Counter)
    tool_tags: Counter = field(default_factory=Counter)
    answer_tags: Counter = field(default_factory=Counter)
    tool_calls_total: int = 0
    tool_topk: Counter = field(default_factory=Counter)

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0

    @property
    def mean_turns(self) -> float:
        return self.turns_total / self.episodes if self.episodes else 0.0

    def main_tool(self) -> tuple[str, str] | None:
        """(tool name, first argument key) of the most used tool, if any was called."""
        if not self.tool_usage:
            return None
        return self.tool_usage.most_common(1)[0][0]


_TAG = re.compile(r"<\s*([A-Za-z_][\w-]*)\s*>")


def _kind(action: Any) -> str:
    if isinstance(action, dict):
        return str(action.get("kind") or action.get("type") or "")
    return ""


def failure_stats(candidate_id: str, traces: Iterable[dict[str, Any]]) -> FailureStats:
    st = FailureStats(candidate_id)
    for tr in traces:
        tid = trace_id(candidate_id, tr)
        turns = list(tr.get("turns") or [])
        reward = float(tr.get("reward") or 0.0)
        stop = str(tr.get("stop_reason") or "")
        st.episodes += 1
        st.turns_total += len(turns)
        st.stop_reasons[stop] += 1
        if reward > 0.5:
            st.successes += 1
        tool_calls = int(tr.get("tool_calls") or 0)
        st.tool_calls_total += tool_calls
        if stop == "format_failure":
            st.format_failure_eps.append(tid)
        elif stop == "turn_cap":
            st.turn_cap_eps.append(tid)
        elif stop == "token_cap":
            st.context_cap_eps.append(tid)
        elif stop == "harness_error":
            st.harness_error_eps.append(tid)
            if tr.get("error"):
                st.harness_errors.append(str(tr["error"]))
        elif stop == "illegal_moves":
            st.illegal_eps.append(tid)
        if reward <= 0.5 and stop in ("answered", "wrong_move"):
            st.wrong_eps.append(tid)
            if tool_calls <= 1:
                st.wrong_few_tools_eps.append(tid)
            if tool_calls == 0:
                st.wrong_no_tool_eps.append(tid)
        info = tr.get("info") or {}
        if reward <= 0.5 and isinstance(info, dict) and info.get("retrieval_recall") is True:
            st.recall_wrong_eps.append(tid)
        if int(tr.get("tool_errors") or 0) > 0:
            st.tool_error_eps.append(tid)
        if int(tr.get("illegal_moves") or 0) > 0 and tid not in st.illegal_eps:
            st.illegal_eps.append(tid)
        st.illegal_turns += int(tr.get("illegal_moves") or 0)
        for i, turn in enumerate(turns):
            _turn_stats(st, tid, turns, i, turn)
    return st


def _turn_stats(
    st: FailureStats, tid: str, turns: list[dict[str, Any]], i: int, turn: dict[str, Any]
) -> None:
    response = str(turn.get("response") or "")
    finish = str(turn.get("finish_reason") or "")
    action = turn.get("action")
    kind = _kind(action)
    if finish == "length":
        st.length_cut_turns.append(tid)
    tags = [t.lower() for t in _TAG.findall(response)]
    if kind == "invalid" or (
        action is None
        and turn.get("feedback", {})
        and (turn.get("feedback") or {}).get("kind") == "format"
    ):
        st.invalid_turns.append((tid, response, finish))
    elif kind == "tool" and isinstance(action, dict):
        args = action.get("args") or action.get("arguments") or {}
        key = next(iter(args), "") if isinstance(args, dict) else ""
        st.tool_usage[(str(action.get("tool") or action.get("name") or ""), str(key))] += 1
        if isinstance(args, dict) and isinstance(args.get("topk"), int):
            st.tool_topk[int(args["topk"])] += 1
        for t in tags:
            st.tool_tags[t] += 1
    elif kind in ("answer", "move"):
        for t in tags:
            st.answer_tags[t] += 1
    fb = turn.get("feedback") or {}
    obs = turn.get("observation")
    obs_error = obs.get("error") if isinstance(obs, dict) and kind == "tool" else None
    tool_error = bool(turn.get("tool_error")) or fb.get("kind") == "tool_error" or bool(obs_error)
    if tool_error:
        st.tool_error_details.append(str(obs_error or fb.get("detail") or obs or ""))
        if isinstance(action, dict) and isinstance(action.get("args"), dict):
            st.tool_error_args.append(dict(action["args"]))
    if kind == "tool" and turn.get("observation") is not None and not tool_error:
        shown = _shown_after(turns, i)
        if shown is None:
            return
        st.observations += 1
        passages = passage_texts(turn.get("observation"))
        st.passages_per_obs.append(len(passages))
        shown_n = _norm(shown)
        cut = False
        for p in passages:
            pn = _norm(p)
            if not pn:
                continue
            st.passages_seen += 1
            st.passage_lengths.append(len(pn))
            head, tail = pn[:40], pn[-40:]
            if tail in shown_n:
                continue
            cut = True
            if head in shown_n:
                st.passages_truncated += 1
            else:
                st.passages_hidden += 1
        if cut:
            st.truncated_obs.append(tid)


def cite(ids: Iterable[str], n: int = 4) -> list[str]:
    """A few distinct trace ids to quote."""
    return list(dict.fromkeys(ids))[:n]
