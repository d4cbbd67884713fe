"""The math domain: word problems, a sandboxed `python` tool and a tolerant numeric verifier.

Tasks come from the built-in generator (`math_problems.py`) or a user's file (`loaders.py`).
The verifier receives the final answer as the harness extracted it and compares it exactly as a
number (fractions and decimals included) after stripping harmless decoration; an answer it cannot
read scores 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from whale_lab.domains.actions import normalise_answer_or_tool
from whale_lab.domains.base import SPLITS, Action, Domain, Env, Split, StepOutcome, Task
from whale_lab.domains.interpreter import InterpreterLimits, run_python
from whale_lab.domains.loaders import load_math_file, split_indices
from whale_lab.domains.math_problems import ProblemStream
from whale_lab.domains.text import normalize_latex, parse_number, to_fraction

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
    """One problem: python calls give observations; the first answer ends the episode."""

    def __init__(self, task: Task, limits: InterpreterLimits) -> None:
        self.task = task
        self.limits = limits
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
            result = run_python(code, self.limits)
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

    def final_info(self) -> dict[str, Any]:
        return {
            "python_calls": self.python_calls,
            "python_errors": self.python_errors,
            "answered": self.answer is not None,
            "correct": self.correct,
            "difficulty": self.task.meta.get("difficulty"),
        }


class MathDomain(Domain):
    name = "math"

    def __init__(
        self, splits: Mapping[str, list[Task]], limits: InterpreterLimits = DEFAULT_LIMITS
    ) -> None:
        missing = [s for s in SPLITS if s not in splits]
        if missing:
            raise ValueError(f"missing splits: {missing}")
        self._splits = {s: list(splits[s]) for s in SPLITS}
        self.limits = limits

    # ---------------------------------------------------------------- construction

    @classmethod
    def builtin(
        cls, seed: int, sizes: Mapping[str, int], limits: InterpreterLimits = DEFAULT_LIMITS
    ) -> MathDomain:
        """Generated problems; test is drawn first, so it depends only on the seed and its size."""
        stream = ProblemStream(seed)
        splits: dict[str, list[Task]] = {}
        for split in ("test", "val", "harness", "weight"):
            problems = stream.take(split, sizes[split])
            splits[split] = [
                Task(
                    id=f"math-{split}-{i:05d}",
                    domain="math",
                    fields={"question": p.question},
                    answer=p.answer,
                    meta={**p.meta(), "source": "builtin"},
                )
                for i, p in enumerate(problems)
            ]
        return cls(splits, limits)

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
        source = cfg.domain.source.strip()
        if source in ("", "builtin"):
            return cls.builtin(cfg.run.seed, sizes)
        return cls.from_file(source, cfg.run.seed, sizes)

    # ---------------------------------------------------------------- Domain API

    def tasks(self, split: Split) -> list[Task]:
        if split not in self._splits:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        return list(self._splits[split])

    def make_env(self, task: Task) -> MathEnv:
        return MathEnv(task, self.limits)

    def normalise_action(self, raw: Any) -> Action:
        return normalise_math_action(raw, TOOLS)
