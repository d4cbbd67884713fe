"""Run the `claude` CLI as Meta-Harness does: in a folder that holds only the archive and a skill.

The folder gets a copy of the archive (symlinks are not followed), a skill file with the rules and
an empty `proposals/`. After the CLI exits, each `proposals/<name>/` with a harness.py becomes a
candidate. Where `claude` is not installed the session is skipped cleanly with a note.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from whale_lab.search.archive import SURFACES
from whale_lab.search.instructions import skill_text
from whale_lab.search.proposers.base import (
    ProposalRequest,
    ProposalSession,
    ProposedCandidate,
    ProposerUsageRecord,
)
from whale_lab.search.surfaces import changed_surfaces


def copy_archive(src: Path, dst: Path) -> None:
    """Copy regular files and folders only; the inbox and hidden files stay behind."""
    dst.mkdir(parents=True, exist_ok=True)
    for child in src.iterdir():
        if child.is_symlink() or child.name.startswith(".") or child.name == "inbox":
            continue
        if child.is_dir():
            copy_archive(child, dst / child.name)
        elif child.is_file():
            shutil.copy2(child, dst / child.name)


class ClaudeCodeProposer:
    name = "claude-code"

    def __init__(
        self,
        executable: str = "claude",
        max_seconds: float = 600.0,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.executable = executable
        self.max_seconds = max_seconds
        self.extra_args = extra_args

    def available(self) -> str | None:
        return shutil.which(self.executable)

    def prepare(self, request: ProposalRequest, workdir: Path) -> None:
        """Lay out the session folder: archive copy, skill, CLAUDE.md, empty proposals/."""
        copy_archive(request.archive.root, workdir / "archive")
        skill = skill_text(request.domain, request.n, prompt_only=request.prompt_only)
        skill_dir = workdir / ".claude" / "skills" / "harness-proposer"
        skill_dir.mkdir(parents=True, exist_ok=True)
        (skill_dir / "SKILL.md").write_text(skill, encoding="utf-8")
        (workdir / "CLAUDE.md").write_text(skill, encoding="utf-8")
        (workdir / "proposals").mkdir(exist_ok=True)

    def propose(self, request: ProposalRequest) -> ProposalSession:
        t0 = time.monotonic()
        exe = self.available()
        if exe is None:
            return ProposalSession(note=f"skipped: the `{self.executable}` CLI is not installed")
        with tempfile.TemporaryDirectory(prefix="whale-claude-") as tmp:
            workdir = Path(tmp)
            self.prepare(request, workdir)
            prompt = (
                f"Use the harness-proposer skill. Iteration {request.iteration}; best candidate so "
                f"far: {request.default_parent or '(none)'}. Read archive/summary.md, study the "
                f"traces, and write {request.n} candidates under proposals/."
            )
            cmd = [
                exe,
                "-p",
                prompt,
                "--output-format",
                "json",
                "--permission-mode",
                "acceptEdits",
                "--allowedTools",
                "Read,Grep,Glob,Write,Edit",
                *self.extra_args,
            ]
            try:
                proc = subprocess.run(
                    cmd,
                    cwd=workdir,
                    capture_output=True,
                    text=True,
                    timeout=self.max_seconds,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                cands = self.collect(request, workdir)
                return ProposalSession(
                    candidates=cands,
                    error=f"`claude` ran past {self.max_seconds:.0f}s",
                    usage=ProposerUsageRecord(seconds=time.monotonic() - t0),
                )
            except OSError as exc:
                return ProposalSession(error=f"cannot run `claude`: {exc}")
            usage = self._usage(proc.stdout, time.monotonic() - t0)
            cands = self.collect(request, workdir)
            error = ""
            if proc.returncode != 0:
                error = f"`claude` exited with {proc.returncode}: {(proc.stderr or '')[-300:]}"
            note = "" if cands else "the CLI wrote no proposal"
            return ProposalSession(candidates=cands, usage=usage, note=note, error=error)

    @staticmethod
    def _usage(stdout: str, seconds: float) -> ProposerUsageRecord:
        try:
            data: Any = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else {}
        except (ValueError, IndexError):
            data = {}
        u = data.get("usage", {}) if isinstance(data, dict) else {}
        u = u if isinstance(u, dict) else {}
        prompt = (
            int(u.get("input_tokens", 0) or 0)
            + int(u.get("cache_read_input_tokens", 0) or 0)
            + int(u.get("cache_creation_input_tokens", 0) or 0)
        )
        return ProposerUsageRecord(
            prompt_tokens=prompt,
            completion_tokens=int(u.get("output_tokens", 0) or 0),
            cost=float(data.get("total_cost_usd", 0.0) or 0.0) if isinstance(data, dict) else 0.0,
            seconds=seconds,
            requests=int(data.get("num_turns", 0) or 0) if isinstance(data, dict) else 0,
        )

    @staticmethod
    def collect(request: ProposalRequest, workdir: Path) -> tuple[ProposedCandidate, ...]:
        out: list[ProposedCandidate] = []
        root = workdir / "proposals"
        for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
            code_path = folder / "harness.py"
            if not code_path.is_file() or code_path.is_symlink():
                continue
            code = code_path.read_text(encoding="utf-8", errors="replace")
            meta: dict[str, Any] = {}
            try:
                meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                meta = {}
            parent = str(meta.get("parent") or request.default_parent)
            if not request.archive.exists(parent):
                parent = request.default_parent
            hyp_path = folder / "hypothesis.md"
            hypothesis = hyp_path.read_text(encoding="utf-8").strip() if hyp_path.is_file() else ""
            touched = changed_surfaces(request.archive.code(parent), code) if parent else []
            surface = str(meta.get("surface") or "")
            if surface not in SURFACES:
                surface = touched[0] if touched else "prompts"
            cited = meta.get("cited_traces") or []
            out.append(
                ProposedCandidate(
                    code=code,
                    hypothesis=hypothesis or f"(no hypothesis given for {folder.name})",
                    parent_id=parent,
                    surface=surface,
                    cited_traces=tuple(str(c) for c in cited) if isinstance(cited, list) else (),
                )
            )
            if len(out) >= request.n:
                break
        return tuple(out)
