"""An LLM proposer: a tool-calling agent loop over any OpenAI-compatible chat endpoint.

The model gets the proposer instructions and four function tools confined to the phase archive:
list_files, read_file (offset/limit in lines), grep, and write_candidate. Paths with `..`, absolute
paths and symlinks that lead outside the archive are refused, and so is every file that is not a
regular file with one name (a hard link may be a file outside the archive; a fifo would block).
A candidate over the archive's size cap is refused when written, with the reason.

A session has budgets that hold against a hostile or broken endpoint: tool calls (checked before
every call, so one reply with thousands of calls runs only what is left), tokens (each request asks
for at most `request_max_tokens`, and less when the session budget has less room), wall time (one
deadline per request that covers the whole body read), and request size. HTTP faults are retried;
a timed-out request is cancelled and the retry waits until the server answers again
(`chat_client` says how). A session that still fails is recorded with its reason: the phase goes on.
Every session's transcript is kept in the archive (`transcript`), which `proposer.replay` replays.
"""

from __future__ import annotations

import ast
import errno
import json
import os
import re
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import httpx

from whale_lab.config import ProposerConfig
from whale_lab.search.archive import MAX_CANDIDATE_CHARS, SURFACES, PhaseArchive
from whale_lab.search.instructions import proposer_instructions
from whale_lab.search.proposers.base import (
    ProposalRequest,
    ProposalSession,
    ProposedCandidate,
    ProposerUsageRecord,
)
from whale_lab.search.proposers.chat_client import ChatClient, ProposerHTTPError, RequestTooLarge
from whale_lab.search.proposers.transcript import Transcript
from whale_lab.search.surfaces import changed_surfaces

MAX_READ_LINES = 400
MAX_TOOL_RESULT_CHARS = 24000
MAX_GREP_RESULTS = 60
MAX_FILE_BYTES = 8_000_000


class ToolError(Exception):
    """A tool call the model got wrong; its message goes back to the model."""


__all__ = ["ArchiveTools", "LLMProposer", "ProposerHTTPError", "ToolError", "TOOL_SPECS"]


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

    @staticmethod
    def _refusal(st: os.stat_result, shown: str) -> str:
        """Why a file may not be read ('' when it may): only regular files with one name."""
        if stat.S_ISDIR(st.st_mode):
            return ""
        if not stat.S_ISREG(st.st_mode):
            return f"refused {shown!r}: not a regular file (device, fifo or socket)"
        if st.st_nlink > 1:
            return (
                f"refused {shown!r}: a hard link ({st.st_nlink} names); its other name may be "
                "outside the archive"
            )
        return ""

    def _readable(self, p: Path) -> bool:
        """A child worth listing or searching: inside, and a folder or a plain one-name file."""
        if not self._inside(p):
            return False
        try:
            st = p.stat()
        except OSError:
            return False
        return not self._refusal(st, p.name)

    def _open(self, target: Path, shown: str) -> tuple[int, os.stat_result]:
        """An fd of a regular one-name file, checked on the open file itself (no swap between)."""
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        try:
            fd = os.open(target, flags)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ToolError(f"refused {shown!r}: a symlink") from None
            if exc.errno == errno.ENOENT:
                raise ToolError(f"{shown!r} does not exist") from None
            raise ToolError(f"cannot read {shown!r}: {exc.strerror}") from None
        st = os.fstat(fd)
        why = "" if not stat.S_ISDIR(st.st_mode) else f"{shown!r} is not a file"
        why = why or self._refusal(st, shown)
        if why:
            os.close(fd)
            raise ToolError(why)
        return fd, st

    def list_files(self, path: str = ".") -> str:
        target = self.resolve(path)
        try:
            st = target.stat()
        except OSError:
            raise ToolError(f"{path!r} does not exist") from None
        why = self._refusal(st, path)
        if why:
            raise ToolError(why)
        if not stat.S_ISDIR(st.st_mode):
            return f"{self._rel(target)} ({st.st_size} bytes)"
        lines = []
        base = self._rel(target)
        for child in sorted(target.iterdir(), key=lambda c: c.name):
            if child.name.startswith(".") or not self._readable(child):
                continue
            rel = child.name if base == "." else f"{base}/{child.name}"
            if child.is_dir():
                lines.append(rel + "/")
            else:
                lines.append(f"{rel} ({child.stat().st_size} bytes)")
        return "\n".join(lines) if lines else "(empty)"

    def read_file(self, path: str, offset: int = 0, limit: int = MAX_READ_LINES) -> str:
        target = self.resolve(path)
        try:
            offset = max(0, int(offset or 0))
            limit = max(1, min(int(limit or MAX_READ_LINES), MAX_READ_LINES * 4))
        except (TypeError, ValueError):
            raise ToolError("offset and limit must be integers (lines)") from None
        if target.is_dir():
            raise ToolError(f"{path!r} is not a file")
        fd, st = self._open(target, path)
        if st.st_size > MAX_FILE_BYTES:
            os.close(fd)
            raise ToolError(f"{path!r} is too large to read ({st.st_size:,} bytes)")
        with open(fd, encoding="utf-8", errors="replace") as fh:
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
        if target.is_dir():
            files = sorted(self._walk(target))
        else:
            os.close(self._open(target, path)[0])  # the same refusals as read_file, with reasons
            files = [target]
        hits: list[str] = []
        cap = max(1, min(int(max_results or MAX_GREP_RESULTS), 500))
        for f in files:
            try:
                fd, st = self._open(f, self._rel(f))
            except ToolError:
                continue
            if st.st_size > MAX_FILE_BYTES:
                os.close(fd)
                continue
            try:
                with open(fd, encoding="utf-8", errors="replace") as fh:
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

    def _walk(self, folder: Path) -> Iterator[Path]:
        for child in folder.iterdir():
            if child.name.startswith(".") or not self._readable(child):
                continue
            if child.is_symlink() and child.is_dir():
                continue
            if child.is_dir():
                yield from self._walk(child)
            else:
                yield child.resolve()


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
    reads_steer = True  # reviewers' steer notes go into the system message
    steer_route = "in the system message of its session"

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
        headers: dict[str, str] = {}
        key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self.client = ChatClient(
            cfg.base_url,
            headers=headers,
            request_timeout_s=cfg.request_timeout_s,
            max_retries=cfg.max_retries,
            concurrency=cfg.concurrency,
            backoff_s=backoff_s,
            transport=transport,
        )
        self.url = self.client.url

    def close(self) -> None:
        self.client.close()

    # ------------------------------------------------------------------ loop
    def propose(self, request: ProposalRequest) -> ProposalSession:
        t0 = time.monotonic()
        deadline = t0 + self.cfg.max_seconds
        abandoned = self.client.abandoned
        tools = ArchiveTools(request.archive.root)
        sess = _Session(request.archive, request.n, request.default_parent)
        usage = _Usage()
        transcript = Transcript(
            self.name,
            model=self.cfg.model,
            base_url=self.cfg.base_url,
            domain=request.domain,
            cycle=request.cycle,
            iteration=request.iteration,
            n=request.n,
            default_parent=request.default_parent,
            prompt_only=request.prompt_only,
            settings={
                "request_max_tokens": self.cfg.request_max_tokens,
                "max_tokens": self.cfg.max_tokens,
                "max_tool_calls": self.cfg.max_tool_calls,
                "max_seconds": self.cfg.max_seconds,
                "request_timeout_s": self.cfg.request_timeout_s,
                "concurrency": self.cfg.concurrency,
            },
        )
        messages: list[dict[str, Any]] = [
            {
                "role": "system",
                "content": proposer_instructions(
                    request.domain,
                    request.n,
                    prompt_only=request.prompt_only,
                    steer=request.steer,
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
            reply_tokens = self._reply_tokens(usage, messages)
            if reply_tokens < 1:
                note = f"token budget ({self.cfg.max_tokens}) spent (no room for another reply)"
                break
            payload = {
                "model": self.cfg.model,
                "messages": messages,
                "tools": TOOL_SPECS,
                "tool_choice": "auto",
                "max_tokens": reply_tokens,
            }
            index = usage.requests
            transcript.request(index, payload, len(json.dumps(payload, ensure_ascii=False)))

            def fault(message: str, i: int = index) -> None:
                transcript.add("fault", request=i, message=message)

            try:
                data = self.client.complete(payload, deadline, log=fault)
            except RequestTooLarge as exc:
                note = str(exc)
                break
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
            transcript.reply(index, data, msg)
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
            ran = 0
            for call in calls:
                # The budgets are checked before every call, not once per reply: a reply may
                # carry any number of calls.
                if usage.tool_calls >= self.cfg.max_tool_calls or time.monotonic() >= deadline:
                    break
                usage.tool_calls += 1
                ran += 1
                result = self._run_tool(call, tools, sess)
                transcript.tool(index, call, result)
                call_id = call.get("id", "") if isinstance(call, dict) else ""
                messages.append({"role": "tool", "tool_call_id": str(call_id), "content": result})
                if len(sess.candidates) >= request.n:
                    break
            if ran < len(calls) and len(sess.candidates) < request.n:
                if usage.tool_calls >= self.cfg.max_tool_calls:
                    note = (
                        f"tool-call budget ({self.cfg.max_tool_calls}) spent: the last reply "
                        f"asked for {len(calls)} calls, {ran} ran"
                    )
                else:
                    note = f"wall-time budget ({self.cfg.max_seconds:.0f}s) spent"
                break
        if not sess.candidates and not error and not note:
            note = "the session wrote no candidate"
        cost = (
            usage.prompt_tokens * self.cfg.price_per_million_input
            + usage.completion_tokens * self.cfg.price_per_million_output
        ) / 1e6
        if usage.estimated:
            note = (note + "; " if note else "") + "token counts estimated (endpoint sent no usage)"
        transcript.header["timed_out_requests"] = self.client.abandoned - abandoned
        record = ProposerUsageRecord(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cost=cost,
            seconds=time.monotonic() - t0,
            tool_calls=usage.tool_calls,
            requests=usage.requests,
        )
        candidates = tuple(sess.candidates)
        self._keep_transcript(
            request,
            transcript.to_dict(candidates=candidates, usage=record, note=note, error=error),
        )
        return ProposalSession(candidates=candidates, usage=record, note=note, error=error)

    def _reply_tokens(self, usage: _Usage, messages: list[dict[str, Any]]) -> int:
        """`max_tokens` for the next request: the configured cap, within the session's budget.

        The prompt's size is estimated (4 characters a token) before it is sent, so the session
        cannot overshoot its token budget by a whole reply.
        """
        left = self.cfg.max_tokens - usage.total
        prompt = sum(len(json.dumps(m, ensure_ascii=False)) for m in messages) // 4
        return min(self.cfg.request_max_tokens, left - prompt)

    @staticmethod
    def _keep_transcript(request: ProposalRequest, data: dict[str, Any]) -> None:
        """Write the transcript into the archive; a full disk must not lose the session."""
        try:
            request.archive.write_session(request.iteration, data)
        except OSError:
            pass

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
        if len(code) > MAX_CANDIDATE_CHARS:
            raise ToolError(
                f"the code is too large ({len(code):,} characters; a candidate holds at most "
                f"{MAX_CANDIDATE_CHARS:,}): write a smaller file"
            )
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
