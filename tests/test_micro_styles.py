"""The pre-training mix favours no harness, and some formats are held out of it for calibration."""

from __future__ import annotations

import argparse
import random
import types
from pathlib import Path

import pytest

from whale_lab.micro import styles as S
from whale_lab.micro import transcripts as T

FORMAT_LISTS = (
    "FEEDBACKS", "SEARCH_TAGS", "SEARCH_USER", "SEARCH_SYSTEM", "PASSAGE_FORMATS", "OBS_WRAPS",
    "MATH_CALLS", "MATH_ANSWERS", "MATH_USER", "MATH_SYSTEM", "MATH_OBS", "CHESS_MOVES",
    "CHESS_SYSTEM", "CHESS_USER", "CHESS_LAYOUTS",
)


def _held_out_strings(domain: str) -> list[str]:
    ho = S.HELD_OUT[domain]
    out = [ho["feedback"].split("{")[0], ho["user"].split("{")[0], ho["system"].split("{")[0]]
    if domain == "search":  # the action tags are h0's on purpose: only what is read is held out
        out += [ho["passage"].split("{")[0] + "{title} --", ho["wrap"].split("\n")[0]]
    return [x for x in out if x.strip()]


def test_every_format_is_drawn_with_equal_weight() -> None:
    for name in FORMAT_LISTS:
        weights = {w for _, w in getattr(S, name)}
        assert len(weights) == 1, (name, weights)


def test_the_numbered_passage_format_is_not_favoured_over_the_others() -> None:
    """The rules proposer's `more_evidence` writes `[i] title: text` passages; pre-training
    draws that format no more often than any other passage format."""
    rng = random.Random(1)
    counts: dict[str, int] = {}
    for _ in range(4000):
        style = S.search_style(rng, h0_share=0.0)
        fmt = next(f for f, _ in S.PASSAGE_FORMATS if repr(f) in style.source)
        counts[fmt] = counts.get(fmt, 0) + 1
    share = {f: n / 4000 for f, n in counts.items()}
    assert set(share) == {f for f, _ in S.PASSAGE_FORMATS}
    assert all(abs(v - 1 / len(share)) < 0.03 for v in share.values()), share


@pytest.mark.parametrize("domain", ["search", "math"])
def test_held_out_formats_never_reach_pretraining(domain: str) -> None:
    held = _held_out_strings(domain)
    for name in FORMAT_LISTS:
        for option, _ in getattr(S, name):
            assert not any(h in repr(option) for h in held if len(h) > 3), (name, option)
    rng = random.Random(2)
    maker = S.STYLE_MAKERS[domain]
    for _ in range(1500):
        source = maker(rng).source
        assert not any(h in source for h in held), held


@pytest.mark.parametrize("domain", ["search", "math"])
@pytest.mark.parametrize("strong", [False, True])
def test_held_out_harnesses_keep_the_limits_and_use_the_held_out_tags(
    domain: str, strong: bool, tmp_path: Path
) -> None:
    from whale_lab.harness import validate_harness

    source = S.held_out_harness(domain, strong=strong)
    path = tmp_path / f"{domain}-{strong}.py"
    path.write_text(source, encoding="utf-8")
    result = validate_harness(path, domain)
    assert result.ok, result.reason
    T.load_runtime(S.Style(domain, "held-out", source, {}))  # as pre-training would load it
    module = types.ModuleType("held_out")  # our own generated code, read back for its values
    exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102
    h0_turns = S.h0_constant(domain, "MAX_TURNS")
    assert module.MAX_TURNS == (4 if strong else h0_turns)
    assert bool(module.SYSTEM_PROMPT) is strong
    ho = S.HELD_OUT[domain]
    if domain == "search":
        assert module.TOPK == (3 if strong else 1)
        assert module.SHOWN_WORDS == (0 if strong else S.h0_constant("search", "SHOWN_WORDS"))
        so, sc, ao, ac = ho["tags"]
        assert module.parse_action(f"{so}Zukev crops{sc}") == {
            "type": "tool", "name": "search",
            "arguments": {"query": "Zukev crops", "topk": module.TOPK},
        }
        assert module.parse_action(f"{ao}hops{ac}") == {"type": "answer", "content": "hops"}
        assert (so, sc, ao, ac) == ("<search>", "</search>", "<answer>", "</answer>")  # h0's
        shown = module.format_observation(
            {"query": "q", "passages": [{"title": "Zukev", "text": "Zukev grows hops."}] * 3}
        )
        assert shown.startswith("<docs>") and "* Zukev -- Zukev grows hops." in shown
        assert shown.count("* Zukev") == module.SHOWN_PASSAGES
    else:
        (co, cc), (ao, ac) = ho["call"], ho["answer"]
        call = module.parse_action(f"{co}print(6 * 7){cc}")
        assert call == {"type": "tool", "name": "python", "arguments": {"code": "print(6 * 7)"}}
        assert module.parse_action(f"{ao}42{ac}") == {"type": "answer", "content": "42"}
        assert (co, ao) == ("<python>\n", "\\boxed{")  # h0's action formats
        assert "{question}" in module.USER_PROMPT


def test_the_h0_style_reads_its_facts_from_the_h0_file() -> None:
    style = S.search_style(random.Random(0), h0_share=1.0)
    assert style.name == "h0" and style.source == S.h0_source("search")
    assert style.get("shown_words") == S.h0_constant("search", "SHOWN_WORDS")
    with pytest.raises(KeyError, match="NO_SUCH"):
        S.h0_constant("search", "NO_SUCH")


def test_calibrate_held_out_scores_held_out_harnesses(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from whale_lab.commands.micro import add_calibrate_arguments, run_calibrate
    from whale_lab.config import load_config

    p = argparse.ArgumentParser()
    add_calibrate_arguments(p)
    cfg = load_config(None, ["sampling.max_new_tokens=48"])
    args = p.parse_args(["--domain", "search", "--tasks", "2", "--k", "2", "--held-out"])
    assert run_calibrate(cfg, args) == 0
    out = capsys.readouterr().out
    assert "| search (held-out formats) | 2 |" in out
    args = p.parse_args(["--domain", "chess", "--tasks", "2", "--held-out"])
    assert run_calibrate(cfg, args) == 2
    err = capsys.readouterr().err
    assert "--held-out has formats for math, search, not chess" in err
    assert "Traceback" not in err
