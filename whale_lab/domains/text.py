"""Answer text helpers shared by the math and search verifiers.

Verifiers must be tolerant of harmless surface variation (case, punctuation, "$", units, a
leftover `\\boxed{}`) and strict about substance, so these helpers decide what counts as "the
same answer". Nothing here imports anything heavy.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable
from fractions import Fraction

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation) | {"“", "”", "‘", "’", "–", "—", "…"}


def normalize_answer(text: str) -> str:
    """SQuAD-style normalisation: lowercase, drop punctuation and articles, squeeze spaces."""
    text = str(text).lower()
    text = "".join(" " if ch in _PUNCT else ch for ch in text)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, golds: Iterable[str]) -> bool:
    """True when the normalised prediction equals any normalised gold answer."""
    pred = normalize_answer(prediction)
    if not pred:
        return False
    return any(pred == normalize_answer(g) for g in golds)


def token_f1(prediction: str, golds: Iterable[str]) -> float:
    """Best token-overlap F1 of the prediction against the gold answers (0.0 when none)."""
    pred_tokens = normalize_answer(prediction).split()
    best = 0.0
    for gold in golds:
        gold_tokens = normalize_answer(gold).split()
        if not pred_tokens or not gold_tokens:
            continue
        common = Counter(pred_tokens) & Counter(gold_tokens)
        overlap = sum(common.values())
        if overlap == 0:
            continue
        precision = overlap / len(pred_tokens)
        recall = overlap / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def contains_answer(text: str, golds: Iterable[str]) -> bool:
    """Whether a normalised gold answer occurs, on word boundaries, inside the normalised text."""
    hay = f" {normalize_answer(text)} "
    for gold in golds:
        g = normalize_answer(gold)
        if g and f" {g} " in hay:
            return True
    return False


# ------------------------------------------------------------------ boxed answers


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`) with balanced braces, else None."""
    text = str(text)
    best: str | None = None
    for match in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth = 1
        i = match.end()
        start = i
        while i < len(text) and depth:
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
            i += 1
        if depth == 0:
            best = text[start : i - 1].strip()
    return best


# ------------------------------------------------------------------ numbers

_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]+?)\s*\}\s*\{\s*([^{}]+?)\s*\}")
_TEXT_CMD = re.compile(r"\\(?:text|textbf|mathrm|mbox|mathbf)\s*\{([^{}]*)\}")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:\s*/\s*-?\d+(?:\.\d+)?)?|-?\.\d+")
# Words and symbols allowed around a single number: units, currency, "answer is", "x =", etc.
_FILLER = re.compile(r"^[\sA-Za-z%$€£°:=~≈.,!'\"()\[\]]*$")


def _clean_numeric_text(text: str) -> str:
    s = str(text).strip()
    boxed = extract_boxed(s)
    if boxed is not None:
        s = boxed
    s = s.replace("\u2212", "-").replace("\u2013", "-")
    s = _TEXT_CMD.sub(r" \1 ", s)
    s = _FRAC.sub(r"(\1)/(\2)", s)
    s = re.sub(r"\\[,;!: ]", "", s)  # LaTeX thin spaces
    s = s.replace("\\$", "$").replace("\\%", "%")
    s = re.sub(r"\\(?:left|right|displaystyle)", "", s)
    s = s.replace("{", "").replace("}", "")
    s = re.sub(r"(?<=\d),(?=\d{3}\b)", "", s)  # thousands separators
    s = re.sub(r"(?<=\d) (?=\d{3}\b)", "", s)  # 1 000 000
    s = re.sub(r"\((-?\d+(?:\.\d+)?)\)", r"\1", s)  # (3)/(4) -> 3/4
    return s


def parse_number(text: str) -> Fraction | None:
    """Read one exact number from an answer string, or None when there is not exactly one.

    Accepts "$1,234.50", "12 apples", "3/4", "\\frac{3}{4}", "-2.5", "x = 7", "42.", "50%"
    (read as 50). Rejects text with no number or with two numbers ("5 or 6").
    """
    s = _clean_numeric_text(text)
    numbers = list(_NUMBER.finditer(s))
    if len(numbers) != 1:
        return None
    m = numbers[0]
    rest = s[: m.start()] + " " + s[m.end() :]
    rest = re.sub(r"(?<=[A-Za-z])/(?=[A-Za-z])", " ", rest)  # units such as km/h
    if not _FILLER.match(rest):
        return None
    token = re.sub(r"\s+", "", m.group(0))
    try:
        if "/" in token:
            num, den = token.split("/")
            den_f = Fraction(den)
            if den_f == 0:
                return None
            return Fraction(num) / den_f
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


def to_fraction(value: object) -> Fraction | None:
    """A gold answer (int, float, Fraction, numeric string) as an exact Fraction, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, Fraction)):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(repr(value))
    if isinstance(value, str):
        return parse_number(value)
    return None


def format_number(value: Fraction | int | float) -> str:
    """An exact number as short text: 12, 3.75, or 7/3 when it has no finite decimal form."""
    f = Fraction(value) if not isinstance(value, float) else Fraction(repr(value))
    if f.denominator == 1:
        return str(f.numerator)
    den = f.denominator
    for p in (2, 5):
        while den % p == 0:
            den //= p
    if den != 1:
        return f"{f.numerator}/{f.denominator}"
    digits = 0
    scaled = f
    while scaled.denominator != 1:
        scaled *= 10
        digits += 1
    sign = "-" if scaled < 0 else ""
    n = abs(scaled.numerator)
    whole, frac = divmod(n, 10**digits)
    return f"{sign}{whole}.{str(frac).rjust(digits, '0')}"


def normalize_latex(text: str) -> str:
    """Loose canonical form for non-numeric math answers (\\frac{a}{b} vs \\dfrac, spaces, $)."""
    s = str(text).strip()
    boxed = extract_boxed(s)
    if boxed is not None:
        s = boxed
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\\(?:left|right|displaystyle|!|,|;|:)", "", s)
    s = s.replace("$", "").replace(" ", "").rstrip(".")
    s = _TEXT_CMD.sub(r"\1", s)
    return s
