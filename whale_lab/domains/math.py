"""The math domain: word problems, a sandboxed `python` tool and a tolerant numeric verifier.

Tasks come from the built-in generator (`math_problems.py`) or a user's file (`loaders.py`).
Built-in splits are generated when first asked for (an eval of val never generates weight), in
the fixed order test, val, harness, weight, so they are the same whichever is asked for first.
The verifier receives the final answer as the harness extracted it and compares it exactly as a
number (fractions and decimals included) after stripping harmless decoration; an answer it cannot
read scores 0.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from whale_lab.config import split_seed
from whale_lab.domains.actions import normalise_answer_or_tool
from whale_lab.domains.base import SPLITS, Action, Domain, Env, Split, StepOutcome, Task
from whale_lab.domains.interpreter import InterpreterLimits, PythonResult, run_python
from whale_lab.domains.loaders import SPLIT_ORDER, fit_split_sizes, load_math_file, split_indices
from whale_lab.domains.math_problems import STREAM_CAPACITY, ProblemStream
from whale_lab.domains.text import normalize_latex, parse_number, to_fraction
from whale_lab.domains.tool_worker import ToolSession, ToolWorkers

if TYPE_CHECKING:
    from whale_lab.config import Config

TOOLS = ("python",)
DEFAULT_LIMITS = InterpreterLimits()


def verify_math(prediction: Any, gold: Any) -> bool:
    """True when the prediction names the gold answer.

    Numbers compare exactly ("$1,250.", "1250 dollars", "\\boxed{1250}" and "2500/2" all match
    1250); non-numeric gold answers (user data such as "\\sqrt{2}") compare as normalised LaTeX.
    """
    if prediction is None:
        return False
    pred_text = str(prediction).strip()
    if not pred_text:
        return False
    gold_num = to_fraction(gold)
    if gold_num is not None:
        pred_num = parse_number(pred_text)
        return pred_num is not None and pred_num == gold_num
    gold_norm = normalize_latex(str(gold))
    return bool(gold_norm) and normalize_latex(pred_text) == gold_norm


def normalise_math_action(raw: Any, tools: Sequence[str] = TOOLS) -> Action:
    """parse_action's return value -> Action (shared by math-like domains)."""

    def read_tool(name: str, args: Mapping[str, Any]) -> Action:
        code = args.get("code")
        if not isinstance(code, str) or not code.strip():
            return Action(kind="invalid", reason="python tool call without code")
        return Action(kind="tool", tool="python", args={"code": code})

    return normalise_answer_or_tool(raw, tools, read_tool, domain="math", default_arg="code")


class MathEnv(Env):
    """One problem: python calls give observations; the first answer ends the episode.

    With `tools` (the domain's warm workers) the episode's calls share one worker, stopped in
    `final_info`, which the rollout calls once when the episode ends; without, each call starts
    a fresh interpreter.
    """

    def __init__(
        self, task: Task, limits: InterpreterLimits, tools: ToolWorkers | None = None
    ) -> None:
        self.task = task
        self.limits = limits
        self._tools = tools
        self._session: ToolSession | None = None
        self.python_calls = 0
        self.python_errors = 0
        self.answer: str | None = None
        self.correct = False

    def initial_observation(self) -> Any:
        return None

    def context(self) -> dict[str, Any]:
        return {}

    def step(self, action: Action) -> StepOutcome:
        if action.kind == "answer":
            self.answer = action.value
            self.correct = verify_math(action.value, self.task.answer)
            return StepOutcome(
                done=True,
                reward=1.0 if self.correct else 0.0,
                stop_reason="answered",
                info={"correct": self.correct, "answer": action.value},
            )
        if action.kind == "tool" and action.tool == "python":
            code = str(action.args.get("code", ""))
            result = self._run_python(code)
            self.python_calls += 1
            if result.error:
                self.python_errors += 1
            obs = {"code": code, "stdout": result.stdout, "error": result.error}
            return StepOutcome(
                observation=obs,
                tool_error=bool(result.error),
                info={"timed_out": result.timed_out, "truncated": result.truncated},
            )
        detail = action.reason or f"unsupported action {action.kind!r} {action.tool!r}".strip()
        return StepOutcome(feedback_kind="format", feedback_detail=detail)

    def _run_python(self, code: str) -> PythonResult:
        if self._tools is None:
            return run_python(code, self.limits)
        if self._session is None:
            self._session = self._tools.session(self.limits)
        return self._session.run(code)

    def final_info(self) -> dict[str, Any]:
        if self._session is not None:  # the episode is over: its worker must not serve another
            self._session.end()
            self._session = None
        return {
            "python_calls": self.python_calls,
            "python_errors": self.python_errors,
            "answered": self.answer is not None,
            "correct": self.correct,
            "difficulty": self.task.meta.get("difficulty"),
        }


class _BuiltinSplits:
    """The generator's splits, each made on first use; earlier ones in SPLIT_ORDER first, since
    later splits leave out every question an earlier one holds."""

    def __init__(self, seed: int, sizes: Mapping[str, int]) -> None:
        self.stream = ProblemStream(seed)
        self.sizes = dict(sizes)
        self.lock = threading.Lock()

    def __call__(self, split: str, done: dict[str, list[Task]]) -> None:
        with self.lock:
            for name in SPLIT_ORDER[: SPLIT_ORDER.index(split) + 1]:
                if name not in done:
                    done[name] = [
                        Task(
                            id=f"math-{name}-{i:05d}",
                            domain="math",
                            fields={"question": p.question},
                            answer=p.answer,
                            meta={**p.meta(), "source": "builtin"},
                        )
                        for i, p in enumerate(self.stream.take(name, self.sizes[name]))
                    ]


class MathDomain(Domain):
    name = "math"

    def __init__(
        self,
        splits: Mapping[str, list[Task]],
        limits: InterpreterLimits = DEFAULT_LIMITS,
        *,
        generate: Callable[[str, dict[str, list[Task]]], None] | None = None,
    ) -> None:
        missing = [s for s in SPLITS if s not in splits]
        if missing and generate is None:
            raise ValueError(f"missing splits: {missing}")
        self._splits = {s: list(splits[s]) for s in SPLITS if s in splits}
        self._generate = generate  # fills in a missing split on first use
        self.limits = limits
        self._tools = ToolWorkers(limits)  # started on the first python call
        weakref.finalize(self, self._tools.close)  # a domain dropped without close()

    # ---------------------------------------------------------------- construction

    @classmethod
    def builtin(
        cls, seed: int, sizes: Mapping[str, int], limits: InterpreterLimits = DEFAULT_LIMITS
    ) -> MathDomain:
        """Generated problems; test is drawn first, so it depends only on the seed and its size.

        Sizes are bounded by what the generator can make (`STREAM_CAPACITY`), by the rule every
        domain uses for too-small data; each split is generated when first asked for.
        """
        fitted, _note = fit_split_sizes(
            STREAM_CAPACITY,
            sizes,
            f"the built-in math generator makes at most {STREAM_CAPACITY} distinct problems "
            f"per seed",
            "math",
        )
        return cls({}, limits, generate=_BuiltinSplits(seed, fitted))

    @classmethod
    def from_file(
        cls,
        path: str,
        seed: int,
        sizes: Mapping[str, int],
        limits: InterpreterLimits = DEFAULT_LIMITS,
    ) -> MathDomain:
        """A user's problems, split by seed (GSM8K JSONL, boxed JSONL/Parquet, DAPO style)."""
        records = load_math_file(path)
        index = split_indices([r.question for r in records], sizes, seed, "math", path)
        splits: dict[str, list[Task]] = {}
        for split, idxs in index.items():
            splits[split] = [
                Task(
                    id=f"math-{split}-{i:05d}",
                    domain="math",
                    fields={"question": records[j].question},
                    answer=records[j].answer,
                    meta={**records[j].meta, "source": records[j].where},
                )
                for i, j in enumerate(idxs)
            ]
        return cls(splits, limits)

    @classmethod
    def from_config(cls, cfg: Config) -> MathDomain:
        sizes = {s: getattr(cfg.domain.splits, s) for s in SPLITS}
        limits = dataclasses.replace(DEFAULT_LIMITS, allow_unconfined=cfg.sandbox.allow_unconfined)
        source = cfg.domain.source.strip()
        if source in ("", "builtin"):
            return cls.builtin(split_seed(cfg), sizes, limits)
        return cls.from_file(source, split_seed(cfg), sizes, limits)

    # ---------------------------------------------------------------- Domain API

    def tasks(self, split: Split) -> list[Task]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        if split not in self._splits and self._generate is not None:
            self._generate(split, self._splits)
        return list(self._splits[split])

    def make_env(self, task: Task) -> MathEnv:
        return MathEnv(task, self.limits, self._tools)

    def normalise_action(self, raw: Any) -> Action:
        return normalise_math_action(raw, TOOLS)

    def close(self) -> None:
        """Stop every tool worker (a later python call starts a worker of its own again)."""
        self._tools.close()
