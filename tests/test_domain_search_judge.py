"""The search domain's LLM judge (`[domain.judge]`) against a local judge server: it decides the
reward where exact match is too strict, exact match stays recorded beside it and takes over when
the judge fails, repeated answers are judged once, and its calls land in the run's ledger."""

from __future__ import annotations

from pathlib import Path

import pytest
from servers import FaultServer, Reply, judge_responder, refused_url

from whale_lab.config import config_from_dict
from whale_lab.domains.base import Action
from whale_lab.domains.errors import DataError
from whale_lab.domains.judge import METER, Judge
from whale_lab.domains.search import SearchDomain
from whale_lab.engine.ledger import JUDGE_FILE, Ledger

SIZES = {"weight": 4, "harness": 2, "val": 4, "test": 2}


def _domain(url: str, **judge: object) -> SearchDomain:
    cfg = config_from_dict(
        {
            "domain": {
                "name": "search",
                "splits": SIZES,
                "judge": {"enabled": True, "base_url": url, "model": "judge", "max_retries": 0,
                          **judge},
            }
        }
    )  # fmt: skip
    return SearchDomain.from_config(cfg)


def _answer(domain: SearchDomain, text: str) -> tuple[float, dict]:
    task = domain.tasks("val")[0]
    env = domain.make_env(task)
    out = env.step(Action(kind="answer", value=text))
    assert out.done
    return out.reward, env.final_info()


def test_the_judge_decides_and_exact_match_is_kept_beside_it(tmp_path: Path) -> None:
    METER.take()
    with FaultServer() as server:
        server.set_default(judge_responder)
        domain = _domain(server.base_url)
        gold = domain.tasks("val")[0].answer[0]
        reward, info = _answer(domain, f"I believe it is {gold}, as the passage says")
        assert reward == 1.0 and info["judge"] == "correct" and info["em"] is False
        reward, info = _answer(domain, gold)
        assert reward == 1.0 and info["judge"] == "correct" and info["em"] is True
        reward, info = _answer(domain, "Nobody knows")
        assert reward == 0.0 and info["judge"] == "incorrect"
        _answer(domain, "Nobody knows")  # the same answer again: judged once
        calls = server.requests_to("/chat/completions")
        assert len(calls) == 3
        sent = calls[0].json
        assert sent["temperature"] == 0.0 and sent["model"] == "judge"
        assert "CORRECT or INCORRECT" in sent["messages"][0]["content"]  # the shipped rules
        domain.close()
    led = Ledger()
    led.write(tmp_path)
    assert (led.judge_calls, led.judge_prompt_tokens, led.judge_completion_tokens) == (3, 120, 3)
    assert led.judge_fallbacks == 0 and "judge: 3 calls" in led.summary_lines()[-1]
    again = Ledger()
    again.write(tmp_path)  # nothing new: the run's totals come back from its judge file
    assert again.judge_calls == 3 and (tmp_path / JUDGE_FILE).exists()
    assert Ledger.read(tmp_path).judge_calls == 3


def test_a_failing_judge_falls_back_to_exact_match_and_is_counted(tmp_path: Path) -> None:
    METER.take()
    domain = _domain(refused_url())
    gold = domain.tasks("val")[0].answer[0]
    reward, info = _answer(domain, gold)
    assert reward == 1.0 and info["judge"] == "fallback" and info["em"] is True
    reward, info = _answer(domain, f"it is {gold} probably")
    assert reward == 0.0 and info["judge"] == "fallback"  # exact match says no
    with FaultServer() as server:
        server.set_default(Reply.ok("Maybe?"))  # neither word: not a verdict
        reward, info = _answer(_domain(server.base_url), gold)
        assert info["judge"] == "fallback" and reward == 1.0
    led = Ledger()
    led.write(tmp_path)
    assert led.judge_fallbacks == 3 and led.judge_calls == 1


def test_without_a_judge_nothing_changes_and_the_ledger_has_no_judge_keys(tmp_path: Path) -> None:
    METER.take()
    domain = SearchDomain.builtin(0, SIZES)
    reward, info = _answer(domain, domain.tasks("val")[0].answer[0])
    assert reward == 1.0 and "judge" not in info
    Ledger().write(tmp_path)
    assert not any(k.startswith("judge_") for k in Ledger.read(tmp_path).to_dict())
    assert not (tmp_path / JUDGE_FILE).exists()


def test_judge_settings_are_checked_with_one_line(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="domain.judge.model"):
        _domain("http://127.0.0.1:1/v1", model="")
    with pytest.raises(DataError, match="domain.judge.rules: cannot read"):
        _domain("http://127.0.0.1:1/v1", rules=str(tmp_path / "missing.md"))
    empty = tmp_path / "empty.md"
    empty.write_text("  \n")
    with pytest.raises(DataError, match="is empty"):
        _domain("http://127.0.0.1:1/v1", rules=str(empty))
    rules = tmp_path / "rules.md"
    rules.write_text("Be strict. Reply CORRECT or INCORRECT.")
    judge = _domain("http://127.0.0.1:1/v1", rules=str(rules)).judge
    assert isinstance(judge, Judge) and judge.rules.startswith("Be strict")
