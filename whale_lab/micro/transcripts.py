"""Pre-training dialogues: the three built-in domains played by reference policies under many harnesses.

Each transcript is one episode run exactly as the rollout engine runs it: the harness runtime renders
the chat messages (system prompt, user prompt with the question and observation, earlier replies,
observations and feedback as user turns), a reference policy writes the assistant reply, the
harness parses it, the domain's environment steps, budgets and turn caps apply. The policies are
deliberately imperfect and follow what the harness lets them see:

- math: the reference solution as a Python program or one expression, run by the tool, then the
  printed value boxed; a share of programs carry a wrong number, operator or step (more for harder
  problems, which are also rarer), some replies slip on the format, some code fails and is retried.
- search: a query built from the question, then the answer copied from the *visible* passage text;
  when truncation or a single passage hides it, the policy searches again or guesses, so what the
  harness shows decides what can be answered. Two-hop questions need a second search for the bridge.
- chess: a move whose chance of being right depends on what the layout shows (a `#` in SAN marks a
  mate, named captures make a hanging piece easy, a bare list of squares shows little); wrong,
  illegal and untagged moves happen, with the environment's own feedback.

Data is disjoint from every evaluation split: math problems come from another generator stream
(and any question of the default splits is dropped), search questions from another encyclopedia
whose names avoid the evaluation world's, chess puzzles from another generator seed with every
shipped puzzle id and position excluded.
"""

from __future__ import annotations

import contextlib
import io
import json
import linecache
import os
import random
import re
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whale_lab.domains.base import Action, Env, Task
from whale_lab.micro.styles import Style, sample_style

PRETRAIN_MATH_SEED = "micro-pretrain"
PRETRAIN_CORPUS_SEEDS = (4242, 4243, 4244)
PRETRAIN_CHESS_SEED = 7001
# Evaluation seeds whose default splits are explicitly excluded from the math data.
EXCLUDED_EVAL_SEEDS = (0, 1, 2, 3)
DEFAULT_EVAL_SIZES = {"weight": 512, "harness": 32, "val": 32, "test": 32}


@dataclass
class Turn:
    """What the model saw on one turn and what it should say."""

    messages: list[dict[str, str]]
    response: str


@dataclass
class Transcript:
    domain: str
    task_id: str
    style: str
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    stop_reason: str = ""

    def final_messages(self) -> list[dict[str, str]]:
        """The whole dialogue: the last prompt plus the last reply."""
        last = self.turns[-1]
        return [*last.messages, {"role": "assistant", "content": last.response}]

    def to_dict(self) -> dict[str, Any]:
        return {
            "domain": self.domain,
            "task_id": self.task_id,
            "style": self.style,
            "reward": self.reward,
            "stop_reason": self.stop_reason,
            "turns": [{"messages": t.messages, "response": t.response} for t in self.turns],
        }


# ====================================================================== the episode loop


def _json_safe(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


class Policy:
    """Writes the assistant's reply for the current turn."""

    def respond(self, messages: list[dict[str, str]], history: list[dict[str, Any]]) -> str:
        raise NotImplementedError


def run_episode(
    task: Task,
    env: Env,
    normalise: Callable[[Any], Action],
    runtime: Any,
    style: Style,
    policy: Policy,
) -> Transcript:
    """One episode under one harness with the same budgets and caps as `rollout.run_episodes`."""
    info = runtime.info()
    max_turns = int(info["max_turns"])
    format_budget = int(info["format_retry_budget"])
    illegal_budget = int(info["illegal_move_retry_budget"])
    history: list[dict[str, Any]] = [
        {"type": "observation", "observation": _json_safe(env.initial_observation())}
    ]
    out = Transcript(domain=task.domain, task_id=task.id, style=style.name)
    format_failures = illegal = 0
    for turn in range(1, max_turns + 1):
        ctx = dict(env.context())
        ctx.setdefault("turn_count", turn)
        ctx["max_turns"] = max_turns
        messages = runtime.render(dict(task.fields), history, ctx)
        response = policy.respond(messages, history)
        out.turns.append(Turn(messages=messages, response=response))
        action = normalise(runtime.parse(response, ctx))
        history.append({"type": "response", "text": response})
        if action.kind == "invalid":
            format_failures += 1
            if format_failures > format_budget:
                out.stop_reason = "format_failure"
                return out
            history.append({"type": "feedback", "kind": "format", "detail": action.reason})
            continue
        outcome = env.step(action)
        if outcome.done:
            out.reward = float(outcome.reward)
            out.stop_reason = outcome.stop_reason or "answered"
            return out
        if outcome.feedback_kind is not None:
            if outcome.feedback_kind == "illegal":
                illegal += 1
                if illegal > illegal_budget:
                    out.stop_reason = "illegal_moves"
                    return out
            history.append(
                {
                    "type": "feedback",
                    "kind": outcome.feedback_kind,
                    "detail": outcome.feedback_detail,
                }
            )
        else:
            history.append({"type": "observation", "observation": _json_safe(outcome.observation)})
    out.stop_reason = "turn_cap"
    return out


def load_runtime(style: Style) -> Any:
    """The harness runtime (the code the host runs) for a style, loaded in this process."""
    from whale_lab.harness.chess_contract import CHESS_ALLOWED_IMPORTS
    from whale_lab.harness.runtime import HarnessRuntime
    from whale_lab.harness.surfaces import ALLOWED_IMPORTS

    allowed = CHESS_ALLOWED_IMPORTS if style.domain == "chess" else ALLOWED_IMPORTS
    return HarnessRuntime(
        style.source, f"<style {style.name}>", domain=style.domain, allowed_imports=allowed
    )


class _RuntimeCache:
    """Styles repeat (h0 above all): load each distinct source once."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] = {}

    def get(self, style: Style) -> Any:
        rt = self._cache.get(style.source)
        if rt is None:
            rt = load_runtime(style)
            self._cache[style.source] = rt
        return rt


# ====================================================================== math


def run_trusted_python(code: str) -> tuple[str, str]:
    """(stdout, error) of reference code, formatted as the sandboxed interpreter reports them.

    The code here is the project's own (reference programs and their deliberate mistakes), so it
    runs in process; errors get the interpreter's traceback layout (frames of `<python>` only).
    """
    name = "<python>"
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    buf = io.StringIO()
    error = ""
    try:
        with contextlib.redirect_stdout(buf):
            compiled = compile(code, name, "exec")
            exec(compiled, {"__name__": "__main__", "__builtins__": __builtins__})
    except Exception as exc:  # noqa: BLE001 - reported as the tool would
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != name:
            tb = tb.tb_next
        error = "".join(traceback.format_exception(type(exc), exc, tb)).strip()
        if len(error) > 800:
            error = "..." + error[-800:]
    return buf.getvalue(), error


def _math_env_class() -> type:
    from whale_lab.domains.base import StepOutcome
    from whale_lab.domains.math import MathEnv

    class TrustedMathEnv(MathEnv):
        """The math environment with the reference code run in process (same outputs, faster)."""

        def step(self, action: Action) -> StepOutcome:
            if action.kind == "tool" and action.tool == "python":
                code = str(action.args.get("code", ""))
                stdout, error = run_trusted_python(code)
                self.python_calls += 1
                self.python_errors += bool(error)
                obs = {"code": code, "stdout": stdout, "error": error}
                return StepOutcome(observation=obs, tool_error=bool(error))
            return super().step(action)

    return TrustedMathEnv


_NUM = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])")
_OPS = {"+": "-", "-": "+", "*": "+", "/": "*", "//": "*"}


def single_expression(problem: Any) -> str:
    """The reference program as one printed expression over the question's numbers."""
    exprs: dict[str, str] = {}
    for step in problem.steps:
        code = step.code
        for var in sorted(exprs, key=len, reverse=True):
            code = re.sub(rf"\b{re.escape(var)}\b", f"({exprs[var]})", code)
        exprs[step.var] = code
    return f"print({exprs[problem.steps[-1].var]})"


def _mutate(code: str, question: str, rng: random.Random) -> str:
    """A plausible mistake: a wrong number, a wrong operator, or a step left out."""
    kind = rng.choice(("number", "number", "operator", "step"))
    if kind == "step":
        lines = code.strip().splitlines()
        if len(lines) >= 3:
            prev = lines[-3].split("=")[0].strip()
            return "\n".join(lines[:-2] + [f"print({prev})"])
        kind = "number"
    if kind == "operator":
        spots = [m for m in re.finditer(r" (//|[+\-*/]) ", code)]
        if spots:
            m = rng.choice(spots)
            new = _OPS[m.group(1)]
            return code[: m.start(1)] + new + code[m.end(1) :]
    spots = list(_NUM.finditer(code))
    if not spots:
        return code + "\n"
    m = rng.choice(spots)
    pool = [x for x in re.findall(r"\d+(?:\.\d+)?", question) if x != m.group(0)]
    if pool and rng.random() < 0.6:
        new = rng.choice(pool)
    else:
        base = int(float(m.group(0)))
        new = str(max(0, base + rng.choice((-10, -2, -1, 1, 2, 3, 10))))
    return code[: m.start()] + new + code[m.end() :]


def _break_syntax(code: str, rng: random.Random) -> str:
    if "print(" in code and rng.random() < 0.5:
        return code.replace("print(", "print(", 1).rstrip().rstrip(")")
    lines = code.splitlines()
    i = rng.randrange(len(lines))
    lines[i] = lines[i].replace(" = ", " == ", 1) if " = " in lines[i] else lines[i] + " +"
    return "\n".join(lines)


MATH_NOISE_BY_DIFFICULTY = {1: 0.45, 2: 0.5, 3: 0.55, 4: 0.6, 5: 0.65}
MATH_DIFFICULTY_WEIGHTS = {1: 0.3, 2: 0.26, 3: 0.2, 4: 0.14, 5: 0.1}


class MathPolicy(Policy):
    def __init__(self, problem: Any, style: Style, rng: random.Random) -> None:
        self.style = style
        self.rng = rng
        code = problem.solution_code.strip() if rng.random() < 0.6 else single_expression(problem)
        noisy = rng.random() < MATH_NOISE_BY_DIFFICULTY.get(problem.difficulty, 0.5)
        self.code = _mutate(code, problem.question, rng) if noisy else code
        self.syntax_slip = rng.random() < 0.015
        self.format_slip = rng.random() < 0.01
        self.answer_slip = rng.random() < 0.03
        self.question = problem.question

    def _call(self, code: str) -> str:
        co, cc = self.style.get("call")
        lead = ""
        if self.rng.random() < 0.15:
            lead = self.rng.choice(("Let me compute it.\n", "I will use Python.\n", ""))
        return f"{lead}{co}{code}{cc}"

    def _answer(self, value: str) -> str:
        ao, ac = self.style.get("answer")
        if self.rng.random() < 0.25:
            return f"The answer is {ao}{value}{ac}."
        return f"{ao}{value}{ac}"

    def respond(self, messages: list[dict[str, str]], history: list[dict[str, Any]]) -> str:
        last = history[-1]
        if last["type"] == "feedback" and last.get("kind") == "format":
            # retry properly after a format slip
            prev = [h for h in history if h["type"] == "observation" and h["observation"]]
            if prev:
                return self._answer(str(prev[-1]["observation"].get("stdout", "")).strip() or "0")
            return self._call(self.code)
        obs = last.get("observation") if last["type"] == "observation" else None
        if not obs:
            if self.format_slip:
                self.format_slip = False
                return f"{self.code}"  # code without the tags: the parser finds nothing
            if self.syntax_slip:
                return self._call(_break_syntax(self.code, self.rng))
            return self._call(self.code)
        if obs.get("error"):
            self.syntax_slip = False
            return self._call(self.code)
        value = str(obs.get("stdout", "")).strip().splitlines()
        text = value[-1].strip() if value else ""
        if not text:
            return self._call(self.code)
        if self.answer_slip:
            nums = re.findall(r"\d+", self.question)
            text = self.rng.choice(nums) if nums else text
        return self._answer(text)


def math_problems(n: int, seed: str = PRETRAIN_MATH_SEED) -> list[Any]:
    """Pre-training problems: another stream, harder ones rarer, no question of a default split."""
    from whale_lab.domains.math import MathDomain
    from whale_lab.domains.math_problems import ProblemStream, generate_problem

    excluded: set[str] = set()
    for s in EXCLUDED_EVAL_SEEDS:
        dom = MathDomain.builtin(s, DEFAULT_EVAL_SIZES)
        for split in ("weight", "harness", "val", "test"):
            excluded.update(t.fields["question"] for t in dom.tasks(split))  # type: ignore[arg-type]
    stream = ProblemStream(seed)
    rng = random.Random(f"whale-micro-math:{seed}")
    levels = list(MATH_DIFFICULTY_WEIGHTS)
    weights = [MATH_DIFFICULTY_WEIGHTS[d] for d in levels]
    out = []
    while len(out) < n:
        d = rng.choices(levels, weights)[0]
        p = generate_problem(rng, d)
        if p.question in excluded or p.question in stream.seen:
            continue
        stream.seen.add(p.question)
        out.append(p)
    return out


def math_transcripts(
    n: int, rng: random.Random, cache: _RuntimeCache | None = None
) -> list[Transcript]:
    from whale_lab.domains.math import normalise_math_action

    cache = cache or _RuntimeCache()
    env_cls = _math_env_class()
    out = []
    for i, p in enumerate(math_problems(n)):
        task = Task(
            id=f"micro-math-{i:05d}",
            domain="math",
            fields={"question": p.question},
            answer=p.answer,
            meta={"difficulty": p.difficulty},
        )
        style = sample_style("math", rng)
        env = env_cls(task, None)
        out.append(
            run_episode(
                task, env, normalise_math_action, cache.get(style), style, MathPolicy(p, style, rng)
            )
        )
    return out


# ====================================================================== search


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
    n: int, rng: random.Random, cache: _RuntimeCache | None = None
) -> list[Transcript]:
    from whale_lab.domains.search import BM25Retriever, SearchEnv, normalise_search_action

    cache = cache or _RuntimeCache()
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


# ====================================================================== chess


def _gives_mate(board: Any, move: Any) -> bool:
    board.push(move)
    mate = board.is_checkmate()
    board.pop()
    return mate


class ChessPolicy(Policy):
    def __init__(self, env: Any, style: Style, rng: random.Random) -> None:
        from whale_lab.micro.styles import LAYOUT_VISIBILITY

        self.env = env
        self.style = style
        self.rng = rng
        self.vis = LAYOUT_VISIBILITY.get(style.get("layout", "raw"), LAYOUT_VISIBILITY["raw"])
        self.format_slip = rng.random() < 0.03

    def _move(self, uci: str) -> str:
        mo, mc = self.style.get("move")
        return f"{mo}{uci}{mc}"

    def _p_correct(self, board: Any, move: Any) -> float:
        if _gives_mate(board, move):
            return 0.85 if self.vis["san"] else 0.3
        if board.is_capture(move):
            if self.vis["capture_names"]:
                return 0.75
            return 0.45 if self.vis["san"] else 0.2
        if board.gives_check(move):
            return 0.35 if self.vis["san"] else 0.15
        return 0.15

    def _distractor(self, board: Any, correct: Any) -> Any:
        legal = [m for m in board.legal_moves if m != correct]
        if not legal:
            return correct
        forcing = [m for m in legal if board.is_capture(m) or board.gives_check(m)]
        if forcing and self.rng.random() < 0.6:
            return self.rng.choice(forcing)
        return self.rng.choice(legal)

    def _illegal(self, board: Any) -> str:
        import chess

        legal = list(board.legal_moves)
        m = self.rng.choice(legal)
        for _ in range(20):
            to = self.rng.randrange(64)
            cand = chess.Move(m.from_square, to)
            if to != m.from_square and not board.is_legal(cand):
                return cand.uci()
        return m.uci()[:2] + m.uci()[:2]

    def respond(self, messages: list[dict[str, str]], history: list[dict[str, Any]]) -> str:
        import chess

        env = self.env
        board = env.board
        expected = chess.Move.from_uci(env.moves[env.index])
        last = history[-1]
        if self.format_slip and last["type"] == "observation":
            self.format_slip = False
            return f"The best move is {expected.uci()}."
        if last["type"] == "observation" and self.rng.random() < 0.04:
            return self._move(self._illegal(board))
        if self.rng.random() < self._p_correct(board, expected):
            return self._move(expected.uci())
        return self._move(self._distractor(board, expected).uci())


SYMMETRIES = ("mirror", "flip", "mirror-flip")


def transform_puzzle(p: Any, symmetry: str) -> Any | None:
    """The same puzzle seen through a symmetry of the rules, or None when it does not apply.

    "mirror" flips the ranks and swaps the colours (python-chess `Board.mirror`); "flip" swaps
    files a-h, valid only without castling rights. Both keep every move's meaning, so a solution
    that was unique stays unique; the line is replayed to be sure.
    """
    import chess

    from whale_lab.domains.chess_puzzles import Puzzle, line_problem

    board = chess.Board(p.fen)
    ops = symmetry.split("-")
    if "flip" in ops and board.castling_rights:
        return None

    def square(sq: int) -> int:
        if "mirror" in ops:
            sq = chess.square_mirror(sq)
        if "flip" in ops:
            sq ^= 7
        return sq

    if "mirror" in ops:
        board = board.mirror()
    if "flip" in ops:
        board = board.transform(chess.flip_horizontal)
    moves = []
    for uci in p.moves:
        m = chess.Move.from_uci(uci)
        moves.append(chess.Move(square(m.from_square), square(m.to_square), m.promotion).uci())
    fen = board.fen()
    if line_problem(fen, moves):
        return None
    return Puzzle(
        id=f"{p.id}-{symmetry}",
        fen=fen,
        moves=tuple(moves),
        rating=p.rating,
        themes=p.themes,
        source=f"{p.source}+{symmetry}",
    )


def chess_puzzles(n: int, seed: int = PRETRAIN_CHESS_SEED, *, augment: bool = True) -> list[Any]:
    """Pre-training puzzles from another generator seed, none of them shipped (id or position).

    Generation searches every line exhaustively, so the result is cached on disk; each puzzle
    then also appears through the symmetries of the board (up to four positions per puzzle).
    """
    from whale_lab.domains.chess_puzzles import (
        generate_puzzles,
        load_builtin_puzzles,
        read_puzzles_jsonl,
        write_puzzles_jsonl,
    )
    from whale_lab.models import cache_dir

    path = cache_dir() / "micro-data" / f"chess-puzzles-{seed}-{n}.jsonl"
    if path.exists():
        puzzles = read_puzzles_jsonl(path, replay=False)
    else:
        puzzles = generate_puzzles(n, seed=seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        write_puzzles_jsonl(puzzles, tmp)
        os.replace(tmp, path)
    if augment:
        variants = [v for p in puzzles for v in (transform_puzzle(p, s) for s in SYMMETRIES)]
        puzzles = puzzles + [v for v in variants if v is not None]
    try:
        shipped = load_builtin_puzzles()
    except Exception:  # noqa: BLE001 - no shipped file: nothing to exclude
        shipped = []
    ids = {p.id for p in shipped}
    positions = {p.start_board().board_fen() for p in shipped}
    return [p for p in puzzles if p.id not in ids and p.start_board().board_fen() not in positions]


# Mates are where a reader of the legal-move list can learn most (a `#` marks the move), so they
# are drawn more often than the material-winning kinds.
CHESS_KIND_WEIGHTS = {"mateIn1": 0.45, "mateIn2": 0.2, "hangingPiece": 0.2, "fork": 0.15}


def chess_transcripts(
    n: int, rng: random.Random, puzzles: Sequence[Any], cache: _RuntimeCache | None = None
) -> list[Transcript]:
    from whale_lab.domains.chess import ChessDomain, ChessEnv

    cache = cache or _RuntimeCache()

    def normalise(raw: Any) -> Action:
        # normalise_action reads nothing from the domain instance
        return ChessDomain.normalise_action(None, raw)  # type: ignore[arg-type]

    out = []
    pools: dict[str, list[Any]] = {}
    for p in puzzles:
        pools.setdefault(p.themes[0] if p.themes else "other", []).append(p)
    for pool in pools.values():
        rng.shuffle(pool)
    kinds = sorted(pools)
    weights = [CHESS_KIND_WEIGHTS.get(k, 1.0) for k in kinds]
    drawn = dict.fromkeys(kinds, 0)
    for i in range(n):
        kind = rng.choices(kinds, weights)[0]
        p = pools[kind][drawn[kind] % len(pools[kind])]
        drawn[kind] += 1
        board = p.start_board()
        side = "white" if board.turn else "black"
        task = Task(
            id=f"micro-chess-{i:05d}",
            domain="chess",
            fields={
                "question": f"Solve the chess puzzle: you play {side}; find the best move.",
                "fen": board.fen(),
                "side_to_move": side,
            },
            answer={"fen": p.fen, "moves": list(p.moves)},
        )
        style = sample_style("chess", rng)
        env = ChessEnv(p.fen, list(p.moves), task_id=task.id)
        out.append(
            run_episode(task, env, normalise, cache.get(style), style, ChessPolicy(env, style, rng))
        )
    return out


# ====================================================================== all together


@dataclass(frozen=True)
class DataSizes:
    math: int = 8000
    search: int = 8000
    chess: int = 2500
    chess_puzzles: int = 600


def build_transcripts(sizes: DataSizes, seed: int = 0) -> list[Transcript]:
    """Every pre-training transcript for the given sizes, in a seeded order."""
    rng = random.Random(f"whale-micro-transcripts:{seed}")
    cache = _RuntimeCache()
    out: list[Transcript] = []
    out += math_transcripts(sizes.math, rng, cache)
    out += search_transcripts(sizes.search, rng, cache)
    if sizes.chess:
        puzzles = chess_puzzles(sizes.chess_puzzles)
        out += chess_transcripts(sizes.chess, rng, puzzles, cache)
    rng.shuffle(out)
    return out


def write_jsonl(transcripts: Iterable[Transcript], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for t in transcripts:
            fh.write(json.dumps(t.to_dict()) + "\n")
