"""An LLM proposer: a tool-calling agent loop over any OpenAI-compatible chat endpoint.

The model gets the proposer instructions and four function tools confined to the phase archive:
list_files, read_file (offset/limit in lines), grep, and write_candidate. Paths with `..`, absolute
paths and symlinks that lead outside the archive are refused. A session has a budget (tool calls,
tokens, wall time); HTTP faults (timeouts, 5xx, 429, malformed JSON, empty choices) are retried
with backoff, and a session that still fails is recorded with its reason: the phase goes on.
"""

from __future__ import annotations

import ast
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import httpx

from whale_lab.config import ProposerConfig
from whale_lab.search.archive import SURFACES, PhaseArchive
from whale_lab.search.instructions import proposer_instructions
from whale_lab.search.proposers.base import (
    ProposalRequest,
    ProposalSession,
    ProposedCandidate,
    ProposerUsageRecord,
)
from whale_lab.search.surfaces import changed_surfaces

MAX_READ_LINES = 400
MAX_TOOL_RESULT_CHARS = 24000
MAX_GREP_RESULTS = 60
MAX_FILE_BYTES = 8_000_000


class ToolError(Exception):
    """A tool call the model got wrong; its message goes back to the model."""


class ProposerHTTPError(RuntimeError):
    """The endpoint kept failing after retries."""


# ---------------------------------------------------------------------------- tools


class ArchiveTools:
    """File tools over one folder; nothing outside it is reachable, by path or by symlink."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()

    def resolve(self, path: str) -> Path:
        raw = str(path if path is not None else ".").strip() or "."
        if "\x00" in raw:
            raise ToolError(f"refused {raw!r}: NUL byte in path")
        if (
            raw.startswith("~")
            or PurePosixPath(raw).is_absolute()
            or PureWindowsPath(raw).is_absolute()
            or PureWindowsPath(raw).drive
        ):
            raise ToolError(
                f"refused {raw!r}: absolute paths are not allowed; use a path relative "
                "to the archive root"
            )
        parts = re.split(r"[\\/]+", raw)
        if ".." in parts:
            raise ToolError(
                f"refused {raw!r}: '..' is not allowed; the archive is the whole filesystem here"
            )
        target = (self.root / raw).resolve()
        if target != self.root and self.root not in target.parents:
            raise ToolError(f"refused {raw!r}: it leads outside the archive (symlink)")
        return target

    def _rel(self, p: Path) -> str:
        return p.resolve().relative_to(self.root).as_posix() if p.resolve() != self.root else "."

    def _inside(self, p: Path) -> bool:
        try:
            r = p.resolve()
        except OSError:
            return False
        return r == self.root or self.root in r.parents

    def list_files(self, path: str = ".") -> str:
        target = self.resolve(path)
        if not target.exists():
            raise ToolError(f"{path!r} does not exist")
        if target.is_file():
            return f"{self._rel(target)} ({target.stat().st_size} bytes)"
        lines = []
        base = self._rel(target)
        for child in sorted(target.iterdir(), key=lambda c: c.name):
            if child.name.startswith(".") or not self._inside(child):
                continue
            rel = child.name if base == "." else f"{base}/{child.name}"
            if child.is_dir():
                lines.append(rel + "/")
            else:
                lines.append(f"{rel} ({child.stat().st_size} bytes)")
        return "\n".join(lines) if lines else "(empty)"

    def read_file(self, path: str, offset: int = 0, limit: int = MAX_READ_LINES) -> str:
        target = self.resolve(path)
        if not target.is_file():
            raise ToolError(f"{path!r} is not a file")
        try:
            offset = max(0, int(offset or 0))
            limit = max(1, min(int(limit or MAX_READ_LINES), MAX_READ_LINES * 4))
        except (TypeError, ValueError):
            raise ToolError("offset and limit must be integers (lines)") from None
        with open(target, encoding="utf-8", errors="replace") as fh:
            lines = fh.readlines()
        chunk = lines[offset : offset + limit]
        text = "".join(chunk)
        more = offset + len(chunk) < len(lines)
        head = f"[{self._rel(target)}: lines {offset + 1}-{offset + len(chunk)} of {len(lines)}]"
        if len(text) > MAX_TOOL_RESULT_CHARS:
            text = text[:MAX_TOOL_RESULT_CHARS] + "\n[... cut: use a smaller limit]"
        tail = f"\n[more: read with offset={offset + len(chunk)}]" if more else ""
        return head + "\n" + text + tail

    def grep(self, pattern: str, path: str = ".", max_results: int = MAX_GREP_RESULTS) -> str:
        try:
            rx = re.compile(pattern)
        except re.error as exc:
            raise ToolError(f"bad regular expression {pattern!r}: {exc}") from None
        target = self.resolve(path)
        files = [target] if target.is_file() else sorted(self._walk(target))
        hits: list[str] = []
        cap = max(1, min(int(max_results or MAX_GREP_RESULTS), 500))
        for f in files:
            if f.stat().st_size > MAX_FILE_BYTES:
                continue
            try:
                with open(f, encoding="utf-8", errors="replace") as fh:
                    for n, line in enumerate(fh, 1):
                        if rx.search(line):
                            text = line.rstrip("\n")
                            if len(text) > 300:
                                m = rx.search(text)
                                start = max(0, (m.start() if m else 0) - 100)
                                text = "…" + text[start : start + 300] + "…"
                            hits.append(f"{self._rel(f)}:{n}: {text}")
                            if len(hits) >= cap:
                                return "\n".join(hits) + f"\n[stopped at {cap} matches]"
            except OSError:
                continue
        return "\n".join(hits) if hits else "(no matches)"

    def _walk(self, folder: Path):
        for child in folder.iterdir():
            if child.name.startswith(".") or not self._inside(child):
                continue
            if child.is_symlink() and child.is_dir():
                continue
            if child.is_dir():
                yield from self._walk(child)
            elif child.is_file():
                yield child


TOOL_SPECS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "list_files",
            "description": "List a folder of the archive (path relative to the archive root).",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "folder, default '.'"}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file of the archive, `limit` lines from line `offset` (0-based).",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "offset": {"type": "integer", "description": "first line, 0-based"},
                    "limit": {
                        "type": "integer",
                        "description": f"lines, at most {MAX_READ_LINES * 4}",
                    },
                },
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "grep",
            "description": "Search archive files for a regular expression; returns path:line: text.",
            "parameters": {
                "type": "object",
                "properties": {
                    "pattern": {"type": "string"},
                    "path": {"type": "string", "description": "file or folder, default '.'"},
                    "max_results": {"type": "integer"},
                },
                "required": ["pattern"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_candidate",
            "description": "Submit one new candidate: the whole harness file, a hypothesis citing "
            "trace ids, the parent candidate id and the surface it changes.",
            "parameters": {
                "type": "object",
                "properties": {
                    "code": {"type": "string", "description": "complete Python file"},
                    "hypothesis": {"type": "string"},
                    "parent": {"type": "string", "description": "candidate id, e.g. c000"},
                    "surface": {"type": "string", "enum": list(SURFACES)},
                    "cited_traces": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["code", "hypothesis", "parent", "surface"],
            },
        },
    },
]


# ---------------------------------------------------------------------------- session


@dataclass
class _Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0
    tool_calls: int = 0
    estimated: bool = False

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class _Session:
    archive: PhaseArchive
    n: int
    default_parent: str
    candidates: list[ProposedCandidate] = field(default_factory=list)


class LLMProposer:
    """One agent session per iteration against `proposer.base_url` with `proposer.model`."""

    name = "llm"

    def __init__(
        self,
        cfg: ProposerConfig,
        *,
        backoff_s: float = 1.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not cfg.model.strip():
            raise ValueError(
                "proposer.model is empty: set the served model name under [proposer] "
                'in whale.toml (e.g. model = "Qwen/Qwen3-8B")'
            )
        self.cfg = cfg
        self.backoff_s = backoff_s
        self.url = cfg.base_url.rstrip("/") + "/chat/completions"
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(headers=headers, transport=transport)

    def close(self) -> None:
        self._client.close()

    # ------------------------------------------------------------------ HTTP
    def _post(self, payload: dict[str, Any], deadline: float) -> dict[str, Any]:
        """One chat completion with retries; raises ProposerHTTPError when it keeps failing."""
        last = ""
        attempts = self.cfg.max_retries + 1
        for attempt in range(attempts):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ProposerHTTPError(
                    f"wall-time budget spent while calling {self.url}"
                    + (f" (last error: {last})" if last else "")
                )
            timeout = min(self.cfg.request_timeout_s, remaining)
            retry = True
            try:
                resp = self._client.post(self.url, json=payload, timeout=timeout)
                if resp.status_code >= 500 or resp.status_code == 429:
                    last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                elif resp.status_code >= 400:
                    last = f"HTTP {resp.status_code}: {resp.text[:300]}"
                    retry = False
                else:
                    try:
                        data = resp.json()
                    except ValueError:
                        last = f"malformed JSON in the response: {resp.text[:120]!r}"
                    else:
                        if not isinstance(data, dict):
                            last = "the response is not a JSON object"
                        elif not data.get("choices"):
                            last = "the response has no choices"
                        else:
                            return data
            except httpx.TimeoutException:
                last = f"timed out after {timeout:.1f}s"
            except httpx.TransportError as exc:
                last = f"cannot reach {self.url}: {exc}"
            if not retry:
                break
            if attempt + 1 < attempts:
                pause = min(self.backoff_s * (2**attempt), max(0.0, deadline - time.monotonic()))
                time.sleep(pause)
        raise ProposerHTTPError(
            f"{self.url}: {last} (after {attempt + 1} attempt{'s' if attempt else ''})"
        )

    # ------------------------------------------------------------------ loop
    def propose(self, request: ProposalRequest) -> ProposalSession:
        t0 = time.monotonic()
        deadline = t0 + self.cfg.max_seconds
        tools = ArchiveTools(request.archive.root)
        sess = _Session(request.archive, request.n, request.default_parent)
        usage = _Usage()
        messages: list[dict[str, Any]] = [
            {
                "role": "system",
                "content": proposer_instructions(
                    request.domain, request.n, prompt_only=request.prompt_only
                ),
            },
            {
                "role": "user",
                "content": (
                    f"Iteration {request.iteration} of this harness phase. The best candidate so far "
                    f"is {request.default_parent or '(none)'}. Read summary.md first, then write "
                    f"{request.n} candidates with write_candidate."
                ),
            },
        ]
        note, error = "", ""
        nudged = False
        while len(sess.candidates) < request.n:
            if usage.tool_calls >= self.cfg.max_tool_calls:
                note = f"tool-call budget ({self.cfg.max_tool_calls}) spent"
                break
            if usage.total >= self.cfg.max_tokens:
                note = f"token budget ({self.cfg.max_tokens}) spent"
                break
            if time.monotonic() >= deadline:
                note = f"wall-time budget ({self.cfg.max_seconds:.0f}s) spent"
                break
            payload = {
                "model": self.cfg.model,
                "messages": messages,
                "tools": TOOL_SPECS,
                "tool_choice": "auto",
            }
            try:
                data = self._post(payload, deadline)
            except ProposerHTTPError as exc:
                error = str(exc)
                break
            usage.requests += 1
            self._count(usage, data, messages)
            choice = data["choices"][0] if isinstance(data["choices"], list) else None
            msg = choice.get("message") if isinstance(choice, dict) else None
            if not isinstance(msg, dict):
                error = "the endpoint returned a choice without a message"
                break
            calls = msg.get("tool_calls") or []
            if not isinstance(calls, list):
                calls = []
            assistant: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or ""}
            if calls:
                assistant["tool_calls"] = calls
            messages.append(assistant)
            if not calls:
                if sess.candidates or nudged:
                    note = note or "the model ended the session"
                    break
                nudged = True
                messages.append(
                    {
                        "role": "user",
                        "content": (
                            "No candidate was written. Use the write_candidate tool to submit "
                            f"{request.n} candidates (complete files)."
                        ),
                    }
                )
                continue
            for call in calls:
                usage.tool_calls += 1
                result = self._run_tool(call, tools, sess)
                messages.append(
                    {"role": "tool", "tool_call_id": str(call.get("id", "")), "content": result}
                )
                if len(sess.candidates) >= request.n:
                    break
        if not sess.candidates and not error and not note:
            note = "the session wrote no candidate"
        cost = (
            usage.prompt_tokens * self.cfg.price_per_million_input
            + usage.completion_tokens * self.cfg.price_per_million_output
        ) / 1e6
        if usage.estimated:
            note = (note + "; " if note else "") + "token counts estimated (endpoint sent no usage)"
        return ProposalSession(
            candidates=tuple(sess.candidates),
            usage=ProposerUsageRecord(
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                cost=cost,
                seconds=time.monotonic() - t0,
                tool_calls=usage.tool_calls,
                requests=usage.requests,
            ),
            note=note,
            error=error,
        )

    @staticmethod
    def _count(usage: _Usage, data: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        u = data.get("usage")
        if isinstance(u, dict) and isinstance(u.get("prompt_tokens"), int):
            usage.prompt_tokens += int(u.get("prompt_tokens") or 0)
            usage.completion_tokens += int(u.get("completion_tokens") or 0)
            return
        usage.estimated = True
        usage.prompt_tokens += sum(len(json.dumps(m)) for m in messages) // 4
        try:
            usage.completion_tokens += len(json.dumps(data["choices"][0].get("message", {}))) // 4
        except (KeyError, IndexError, TypeError, AttributeError):
            pass

    def _run_tool(self, call: Any, tools: ArchiveTools, sess: _Session) -> str:
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            return "error: malformed tool call (expected {'function': {'name', 'arguments'}})"
        fn = call["function"]
        name = str(fn.get("name", ""))
        raw = fn.get("arguments") or "{}"
        try:
            args = json.loads(raw) if isinstance(raw, str) else dict(raw)
        except (ValueError, TypeError) as exc:
            return f"error: the arguments of {name} are not valid JSON ({exc}); send a JSON object"
        if not isinstance(args, dict):
            return f"error: the arguments of {name} must be a JSON object"
        try:
            if name == "list_files":
                return tools.list_files(str(args.get("path", ".")))
            if name == "read_file":
                if "path" not in args:
                    raise ToolError("read_file needs a path")
                return tools.read_file(
                    str(args["path"]), args.get("offset", 0), args.get("limit", MAX_READ_LINES)
                )
            if name == "grep":
                if "pattern" not in args:
                    raise ToolError("grep needs a pattern")
                return tools.grep(
                    str(args["pattern"]),
                    str(args.get("path", ".")),
                    args.get("max_results", MAX_GREP_RESULTS),
                )
            if name == "write_candidate":
                return self._write_candidate(args, sess)
            return (
                f"error: unknown tool {name!r}; available: list_files, read_file, grep, "
                "write_candidate"
            )
        except ToolError as exc:
            return f"error: {exc}"
        except (TypeError, ValueError) as exc:
            return f"error: bad arguments for {name}: {exc}"

    @staticmethod
    def _write_candidate(args: dict[str, Any], sess: _Session) -> str:
        if len(sess.candidates) >= sess.n:
            raise ToolError(f"this session already holds {sess.n} candidates")
        code = args.get("code")
        if not isinstance(code, str) or not code.strip():
            raise ToolError("code must be the complete harness file as a string")
        try:
            ast.parse(code)
        except SyntaxError as exc:
            raise ToolError(f"code does not parse: line {exc.lineno}: {exc.msg}") from None
        hypothesis = str(args.get("hypothesis") or "").strip()
        if not hypothesis:
            raise ToolError("a hypothesis is required: what changes, why, and which traces show it")
        parent = str(args.get("parent") or sess.default_parent or "").strip()
        if not sess.archive.exists(parent):
            raise ToolError(f"parent {parent!r} is not a candidate in the archive")
        parent_code = sess.archive.code(parent)
        if code.strip() == parent_code.strip():
            raise ToolError(f"the code is identical to {parent}; change one mechanism")
        surface = str(args.get("surface") or "").strip()
        touched = changed_surfaces(parent_code, code)
        if surface not in SURFACES:
            surface = touched[0] if touched else "prompts"
        cited = args.get("cited_traces") or []
        cited_t = tuple(str(c) for c in cited) if isinstance(cited, list) else ()
        sess.candidates.append(
            ProposedCandidate(
                code=code,
                hypothesis=hypothesis,
                parent_id=parent,
                surface=surface,
                cited_traces=cited_t,
            )
        )
        extra = (
            f" (the code changes: {', '.join(touched)})" if touched and touched != [surface] else ""
        )
        return (
            f"accepted as proposal {len(sess.candidates)} of {sess.n}, parent {parent}, "
            f"surface {surface}{extra}. It will be validated, reviewed and scored."
        )
