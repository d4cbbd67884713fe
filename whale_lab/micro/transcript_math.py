"""Math pre-training dialogues: problems from a stream disjoint from evaluation, and their policy.

The reference solution runs as a Python program or one expression, with deliberate mistakes
(more for harder problems), format slips and failing code that is retried.
"""

from __future__ import annotations

import contextlib
import io
import linecache
import random
import re
import traceback
from typing import Any

from whale_lab.domains.base import Action, Task
from whale_lab.micro.styles import Style, sample_style
from whale_lab.micro.transcript_episode import Policy, RuntimeCache, Transcript, run_episode

PRETRAIN_MATH_SEED = "micro-pretrain"
# Evaluation seeds whose default splits are explicitly excluded from the math data.
EXCLUDED_EVAL_SEEDS = (0, 1, 2, 3)
DEFAULT_EVAL_SIZES = {"weight": 512, "harness": 32, "val": 32, "test": 32}


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
#: The mean of the rates above over the difficulty mix (0.524).
MATH_MISTAKE_RATE = sum(
    MATH_NOISE_BY_DIFFICULTY[d] * w for d, w in MATH_DIFFICULTY_WEIGHTS.items()
) / sum(MATH_DIFFICULTY_WEIGHTS.values())


def math_noise(difficulty: int, mistake_rate: float | None = None) -> float:
    """The chance a reference solution of this difficulty carries a deliberate mistake: the
    base rates, or (`mistake_rate`) the same spread moved so that its mean over the difficulty
    mix is `mistake_rate`, clipped to 0..1. How it moves the model's math h0 is measured in the
    README: more mistakes gave a better model in a 20-minute math-only check and a lower h0 in the
    shipped 118-minute recipe (0.75), which also changed the budget."""
    base = MATH_NOISE_BY_DIFFICULTY.get(difficulty, 0.5)
    if mistake_rate is None:
        return base
    return min(1.0, max(0.0, base + mistake_rate - MATH_MISTAKE_RATE))


class MathPolicy(Policy):
    def __init__(
        self,
        problem: Any,
        style: Style,
        rng: random.Random,
        *,
        mistake_rate: float | None = None,
    ) -> None:
        self.style = style
        self.rng = rng
        code = problem.solution_code.strip() if rng.random() < 0.6 else single_expression(problem)
        noisy = rng.random() < math_noise(problem.difficulty, mistake_rate)
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
    n: int,
    rng: random.Random,
    cache: RuntimeCache | None = None,
    *,
    mistake_rate: float | None = None,
) -> list[Transcript]:
    """`n` math dialogues; `mistake_rate`: see `math_noise` (None: the base rates)."""
    from whale_lab.domains.math import normalise_math_action

    cache = cache or RuntimeCache()
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
                task,
                env,
                normalise_math_action,
                cache.get(style),
                style,
                MathPolicy(p, style, rng, mistake_rate=mistake_rate),
            )
        )
    return out
