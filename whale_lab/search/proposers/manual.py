"""The human as proposer: a file dropped into the archive's inbox, or an edit in `$EDITOR`.

Whatever the human writes goes through the same validation, review and scoring as any other
candidate. A dropped `name.py` may come with `name.md` (the hypothesis); the parent is read from a
`# parent: c003` line in the file, else the phase's best candidate is the parent.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from whale_lab.search.archive import PhaseArchive
from whale_lab.search.proposers.base import (
    ProposalRequest,
    ProposalSession,
    ProposedCandidate,
    ProposerUsageRecord,
)
from whale_lab.search.surfaces import changed_surfaces
from whale_lab.store import atomic_write_text

_PARENT = re.compile(r"^#\s*parent\s*:\s*(c\d{3,})\s*$", re.MULTILINE | re.IGNORECASE)
_HYPOTHESIS = re.compile(r"^#\s*hypothesis\s*:\s*(.+)$", re.MULTILINE | re.IGNORECASE)


def _surface(parent_code: str, code: str) -> str:
    touched = changed_surfaces(parent_code, code)
    return touched[0] if len(touched) == 1 else (",".join(touched) or "prompts")


class ManualProposer:
    """Reads `inbox/*.py`; with an editor configured and an empty inbox, opens the parent in it."""

    name = "manual"
    reads_steer = True  # a human reads the notes beside the inbox
    steer_route = "written to inbox/STEER.md for the person writing candidates"

    def __init__(self, editor: str | None = None, ask: Callable[[str], str] | None = None) -> None:
        # The editor command: explicit, else $VISUAL / $EDITOR; None disables editing.
        self.editor = (
            editor
            if editor is not None
            else (os.environ.get("VISUAL") or os.environ.get("EDITOR") or "")
        )
        self.ask = ask

    def propose(self, request: ProposalRequest) -> ProposalSession:
        t0 = time.monotonic()
        archive = request.archive
        archive.inbox.mkdir(parents=True, exist_ok=True)
        if request.steer:
            notes = "".join(f"- {n}\n" for n in request.steer)
            atomic_write_text(
                archive.inbox / "STEER.md",
                f"# Requests from the reviewer (iteration {request.iteration})\n\n{notes}",
            )
        out: list[ProposedCandidate] = []
        problems: list[str] = []
        for path in sorted(archive.inbox.glob("*.py"))[: request.n]:
            try:
                out.append(self._from_file(archive, path, request.default_parent))
            except ValueError as exc:
                problems.append(f"{path.name}: {exc}")
            self._take(archive, path)
        if not out and not problems and self.editor:
            cand = self._edit(archive, request.default_parent)
            if cand is not None:
                out.append(cand)
        note = "; ".join(problems)
        if not out and not note:
            note = (
                f"no candidate: drop a harness file into {archive.inbox} (with an optional "
                "<name>.md hypothesis and a '# parent: cNNN' line), or set $EDITOR"
            )
        return ProposalSession(
            candidates=tuple(out),
            note=note,
            usage=ProposerUsageRecord(seconds=time.monotonic() - t0),
        )

    @staticmethod
    def _take(archive: PhaseArchive, path: Path) -> None:
        taken = archive.inbox / "taken"
        taken.mkdir(exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for p in (path, path.with_suffix(".md")):
            if p.exists():
                shutil.move(str(p), str(taken / f"{stamp}-{p.name}"))

    def _from_file(
        self, archive: PhaseArchive, path: Path, default_parent: str
    ) -> ProposedCandidate:
        code = path.read_text(encoding="utf-8")
        if not code.strip():
            raise ValueError("the file is empty")
        m = _PARENT.search(code)
        parent = m.group(1) if m else default_parent
        if not archive.exists(parent):
            raise ValueError(f"parent {parent!r} is not a candidate of this phase")
        md = path.with_suffix(".md")
        if md.exists():
            hypothesis = md.read_text(encoding="utf-8").strip()
        else:
            h = _HYPOTHESIS.search(code)
            hypothesis = h.group(1).strip() if h else f"Written by hand ({path.name})."
        return ProposedCandidate(
            code=code,
            hypothesis=hypothesis,
            parent_id=parent,
            surface=_surface(archive.code(parent), code),
            mechanism="manual",
        )

    def _edit(self, archive: PhaseArchive, parent: str) -> ProposedCandidate | None:
        if not archive.exists(parent):
            return None
        parent_code = archive.code(parent)
        draft = archive.inbox / f"draft-from-{parent}.py.edit"
        draft.write_text(f"# parent: {parent}\n# hypothesis: \n" + parent_code, encoding="utf-8")
        try:
            subprocess.run([*shlex.split(self.editor), str(draft)], check=False)
            code = draft.read_text(encoding="utf-8")
        except (OSError, ValueError):
            return None
        finally:
            draft.unlink(missing_ok=True)
        body = "\n".join(
            line
            for line in code.splitlines()
            if not _PARENT.match(line) and not re.match(r"^#\s*hypothesis\s*:", line, re.I)
        )
        if body.strip() == parent_code.strip():
            return None
        h = _HYPOTHESIS.search(code)
        hypothesis = h.group(1).strip() if h and h.group(1).strip() else ""
        if not hypothesis and self.ask is not None:
            hypothesis = self.ask("Hypothesis for this edit: ").strip()
        return ProposedCandidate(
            code=body + "\n",
            hypothesis=hypothesis or "Edited by hand.",
            parent_id=parent,
            surface=_surface(parent_code, body),
            mechanism="manual",
        )
