"""Is a harness file usable? Static check, load in the sandbox, type checks, domain contract, smoke.

Used before a candidate harness is scored (and by `whale-lab` when a user names a harness file), so
the answer is a `ValidationResult` with a readable reason rather than an exception.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import whale_lab.harness.chess_contract as chess_contract
from whale_lab.config import SandboxConfig
from whale_lab.harness.ast_check import check_source
from whale_lab.harness.host import HarnessHost, HarnessInfo, HarnessLoadError


@dataclass(frozen=True)
class ValidationResult:
    ok: bool
    reason: str  # the first problem, "" when ok
    info: HarnessInfo | None = None
    problems: tuple[str, ...] = ()


def _domain_name(domain: Any) -> str:
    return domain if isinstance(domain, str) else str(getattr(domain, "name", ""))


def _chess_boards(domain: Any) -> list[chess_contract.SampleBoard]:
    """The contract's sample boards, rendered by the domain object when it offers a renderer.

    The domain renders them so the check sees exactly the text a harness gets; a domain given by
    name only gets the contract's documented layout, since this layer does not import domains.
    """
    render = getattr(domain, "sample_observation", None)
    if isinstance(domain, str) or not callable(render):
        return chess_contract.sample_boards()
    return chess_contract.sample_boards(render)


# Replies that name no move. A parser that still returns a legal move for one chose it itself.
NO_MOVE_REPLIES: tuple[str, ...] = ("I am not sure.", "", "Let me think about the position")
_LISTED = re.compile(r"\[\s*([a-h][1-8][a-h][1-8][qrbn]?)\s*\]", re.IGNORECASE)


def _legal_moves(observation: str) -> set[str]:
    """The legal moves (UCI) of a sample board: those it lists, and those of its FEN line."""
    import chess

    moves = {m.lower() for m in _LISTED.findall(observation)}
    for line in observation.splitlines():
        if line.startswith("FEN:"):
            try:
                moves |= {m.uci() for m in chess.Board(line[4:].strip()).legal_moves}
            except ValueError:
                pass
    return moves


def _parsed_move(value: Any) -> str:
    """The move a parse_action result names, as the chess domain would read it ("" for none)."""
    if isinstance(value, Mapping) and value.get("type") in ("move", "answer"):
        value = value.get("move", value.get("value", value.get("content")))
    return re.sub(r"\s+", "", value).lower() if isinstance(value, str) else ""


def _chooser_problems(host: HarnessHost, boards: list[chess_contract.SampleBoard]) -> list[str]:
    """A parser that returns a legal move for a reply naming none: it plays the puzzle itself.

    Each board is rendered first, so a harness that remembers the position it showed (the way to
    pick a move from it) is caught too. The engine refuses such moves at run time as well.
    """
    path, problems = str(host.path), []
    for n, (obs, ctx, _) in enumerate(boards, 1):
        host.render(
            [
                {
                    "fields": {},
                    "history": [{"type": "observation", "observation": obs}],
                    "context": ctx,
                }
            ]
        )
        parsed = host.parse([{"response": reply, "context": ctx} for reply in NO_MOVE_REPLIES])
        legal = _legal_moves(obs)
        for reply, res in zip(NO_MOVE_REPLIES, parsed, strict=True):
            move = _parsed_move(res.value) if res.ok else ""
            if move in legal:
                problems.append(
                    f"{path}: parse_action returned the legal move {move} for a reply that names "
                    f"no move ({reply!r}) on sample board {n}: the harness may parse the model's "
                    "move, never choose one"
                )
                break
    return problems


def _sample_request(domain: Any, max_turns: int) -> dict[str, Any]:
    """A render request for a smoke call: the domain's first harness task if it can give one."""
    if not isinstance(domain, str):
        try:
            task = domain.tasks("harness")[0]
            env = domain.make_env(task)
            context = {**dict(env.context()), "turn_count": 1, "max_turns": max_turns}
            return {
                "fields": dict(task.fields),
                "history": [{"type": "observation", "observation": env.initial_observation()}],
                "context": context,
            }
        except Exception:  # noqa: BLE001 - a domain that cannot sample still gets the generic smoke
            pass
    return {
        "fields": {"question": "What is 2 + 3?"},
        "history": [
            {"type": "observation", "observation": None},
            {"type": "response", "text": "It is five."},
            {"type": "feedback", "kind": "format", "detail": "Give the final answer."},
        ],
        "context": {"turn_count": 2, "max_turns": max_turns},
    }


def _smoke(host: HarnessHost, domain: Any) -> list[str]:
    path = str(host.path)
    request = _sample_request(domain, host.info.max_turns)
    problems = []
    (rendered,) = host.render([request])
    if not rendered.ok:
        problems.append(
            f"{path}: render failed on a sample task: {rendered.kind}: {rendered.error}"
        )
    context: Mapping[str, Any] = request["context"]
    (parsed,) = host.parse([{"response": "The answer is 5.", "context": context}])
    if not parsed.ok:
        problems.append(
            f"{path}: parse_action failed on a sample reply: {parsed.kind}: {parsed.error}"
        )
    return problems


def validate_harness(
    path: str | Path,
    domain: Any,
    sandbox: SandboxConfig = SandboxConfig(),  # noqa: B008
    *,
    open_host: Callable[[], HarnessHost] | None = None,
) -> ValidationResult:
    """AST check, load in the host (constants type-checked there), domain contract, smoke calls.

    `domain` is a Domain or its name; the chess domain adds the WHALE chess contract, whose sample
    boards a chess Domain object renders itself (`sample_observation`), and a check that the
    parser returns no move for replies that name none (`NO_MOVE_REPLIES`). `open_host`, called
    once the static checks pass, gives a host its caller keeps (and closes) for later runs of the
    same code; without it the check starts and closes its own.
    """
    p = Path(path)
    name = _domain_name(domain)
    try:
        source = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ValidationResult(False, f"{p}: harness file not found")
    except (OSError, UnicodeDecodeError) as exc:
        return ValidationResult(False, f"{p}: cannot read the harness file ({exc})")

    problems = [
        f"{p}:{prob.line}: {prob.message}" if prob.line else f"{p}: {prob.message}"
        for prob in check_source(source, str(p))
    ]
    if not problems and name == "chess":
        problems = chess_contract.static_problems(source, str(p))
    if problems:
        return ValidationResult(False, problems[0], None, tuple(problems))

    try:
        host = open_host() if open_host is not None else HarnessHost(p, name, sandbox)
    except HarnessLoadError as exc:
        return ValidationResult(False, str(exc), None, (str(exc),))
    with host if open_host is None else contextlib.nullcontext(host):
        problems = _smoke(host, domain)
        if name == "chess":
            boards = _chess_boards(domain)
            problems += chess_contract.check_chess_contract(host, boards)
            problems += _chooser_problems(host, boards)
        info = host.info
    return ValidationResult(not problems, problems[0] if problems else "", info, tuple(problems))
