"""Built-in generator of grade-school multi-step arithmetic word problems.

Each problem is built step by step: every step is a short phrase, a numeric expression, its exact
result and a Python line, so the same record yields the question, the worked solution, a program
that prints the answer and the answer itself. Difficulty is the number of steps (1 to 5). The
generator is deterministic for a seed (it uses `random.Random` with string seeds, which do not
depend on PYTHONHASHSEED).
"""

from __future__ import annotations

import ast
import operator
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from whale_lab.domains.text import format_number

MAX_DIFFICULTY = 5
Number = int | Fraction


@dataclass(frozen=True)
class Ref:
    """An earlier step's result, used as an operand."""

    var: str
    value: Fraction


@dataclass(frozen=True)
class Step:
    text: str  # what this step finds, e.g. "cost of the pens"
    var: str  # Python name of the result
    expr: str  # the arithmetic with numbers, e.g. "4 * 3"
    code: str  # the arithmetic over earlier names, e.g. "4 * 3" or "total - cost"
    value: Fraction

    def to_dict(self) -> dict[str, str]:
        return {
            "text": self.text,
            "var": self.var,
            "expr": self.expr,
            "result": format_number(self.value),
        }


@dataclass(frozen=True)
class Problem:
    question: str
    steps: tuple[Step, ...]
    template: str

    @property
    def difficulty(self) -> int:
        return len(self.steps)

    @property
    def value(self) -> Fraction:
        return self.steps[-1].value

    @property
    def answer(self) -> int | float:
        """The answer as an int, or as a float when it is an exact short decimal."""
        v = self.value
        return v.numerator if v.denominator == 1 else float(format_number(v))

    @property
    def answer_text(self) -> str:
        return format_number(self.value)

    @property
    def solution_code(self) -> str:
        lines = [f"{s.var} = {s.code}" for s in self.steps]
        lines.append(f"print({self.steps[-1].var})")
        return "\n".join(lines) + "\n"

    @property
    def solution_text(self) -> str:
        """A worked solution, one line per step, ending in a boxed answer."""
        lines = [
            f"{s.text[0].upper()}{s.text[1:]}: {s.expr} = {format_number(s.value)}."
            for s in self.steps
        ]
        lines.append(f"The answer is \\boxed{{{self.answer_text}}}.")
        return "\n".join(lines)

    def meta(self) -> dict[str, Any]:
        return {
            "difficulty": self.difficulty,
            "template": self.template,
            "steps": [s.to_dict() for s in self.steps],
            "solution_code": self.solution_code,
            "solution_text": self.solution_text,
            "answer_text": self.answer_text,
        }


# ------------------------------------------------------------------ exact evaluation

_OPS: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def eval_exact(expr: str) -> Fraction:
    """Evaluate + - * / and parentheses over decimal literals exactly (no floats, no eval)."""

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return (
                Fraction(repr(node.value))
                if isinstance(node.value, float)
                else Fraction(node.value)
            )
        raise ValueError(f"unsupported expression element: {ast.dump(node)}")

    return walk(ast.parse(expr, mode="eval"))


class _Builder:
    """Collects steps; each operand is a literal number or a `Ref` to an earlier step."""

    def __init__(self) -> None:
        self.steps: list[Step] = []

    def step(self, text: str, var: str, pattern: str, *operands: Number | Ref) -> Ref:
        nums = [format_number(o.value if isinstance(o, Ref) else o) for o in operands]
        names = [o.var if isinstance(o, Ref) else format_number(o) for o in operands]
        expr = pattern.format(*nums)
        value = eval_exact(expr)
        values = [o.value if isinstance(o, Ref) else Fraction(o) for o in operands]
        code = pattern.format(*names)
        if all(v.denominator == 1 for v in values) and value.denominator == 1:
            code = code.replace(" / ", " // ")
        if any(s.var == var for s in self.steps):
            raise ValueError(f"duplicate step name {var}")
        self.steps.append(Step(text=text, var=var, expr=expr, code=code, value=value))
        return Ref(var, value)


# ------------------------------------------------------------------ vocabulary

NAMES = [
    ("Mia", "she"),
    ("Tom", "he"),
    ("Ava", "she"),
    ("Leo", "he"),
    ("Nora", "she"),
    ("Sam", "he"),
    ("Ivy", "she"),
    ("Omar", "he"),
    ("Lena", "she"),
    ("Ravi", "he"),
    ("Zoe", "she"),
    ("Ben", "he"),
    ("Kai", "he"),
    ("Ana", "she"),
    ("Eli", "he"),
    ("Maya", "she"),
    ("Noah", "he"),
    ("Iris", "she"),
    ("Hugo", "he"),
    ("Jade", "she"),
    ("Finn", "he"),
    ("Rosa", "she"),
    ("Theo", "he"),
    ("Lila", "she"),
    ("Amir", "he"),
    ("Chloe", "she"),
    ("Jonas", "he"),
    ("Priya", "she"),
    ("Diego", "he"),
    ("Hana", "she"),
    ("Felix", "he"),
    ("Greta", "she"),
    ("Ivan", "he"),
    ("Sofia", "she"),
]
# (singular, plural, lowest price, highest price)
GOODS = [
    ("notebook", "notebooks", 2, 6),
    ("pen", "pens", 1, 4),
    ("apple", "apples", 1, 3),
    ("book", "books", 6, 15),
    ("toy car", "toy cars", 3, 9),
    ("mug", "mugs", 4, 10),
    ("sandwich", "sandwiches", 3, 8),
    ("ticket", "tickets", 5, 15),
    ("plant", "plants", 4, 12),
    ("scarf", "scarves", 7, 18),
    ("puzzle", "puzzles", 5, 14),
    ("candle", "candles", 2, 7),
    ("comic", "comics", 2, 6),
    ("ball", "balls", 3, 9),
    ("lamp", "lamps", 9, 20),
    ("shirt", "shirts", 8, 20),
    ("kite", "kites", 4, 11),
    ("bowl", "bowls", 3, 8),
]
THINGS = [
    "marbles",
    "stickers",
    "cookies",
    "stamps",
    "shells",
    "cards",
    "beads",
    "coins",
    "grapes",
    "crayons",
    "buttons",
    "pebbles",
]
PLACES = [
    ("library", "books"),
    ("farm", "sheep"),
    ("school", "chairs"),
    ("shop", "boxes"),
    ("zoo", "birds"),
    ("garden", "tulips"),
    ("bakery", "loaves"),
    ("warehouse", "crates"),
    ("museum", "paintings"),
    ("harbour", "boats"),
]
SURFACES = ["garden", "room", "field", "patio", "classroom", "playground", "carpet", "pool"]
VEHICLES = ["car", "train", "bus", "cyclist", "truck", "boat"]
WIDGETS = ["toys", "bottles", "bricks", "cups", "boxes", "chairs", "bolts", "jars"]
BILLS = [20, 50, 100]


def _name(rng: random.Random, exclude: tuple[str, ...] = ()) -> tuple[str, str]:
    while True:
        n = rng.choice(NAMES)
        if n[0] not in exclude:
            return n


def _money(rng: random.Random, lo: int, hi: int, cents: bool) -> Number:
    """A price in whole dollars, or in quarters of a dollar when `cents` is set."""
    if cents:
        return Fraction(rng.randint(lo * 4, hi * 4), 4)
    return rng.randint(lo, hi)


def _d(v: Number | Ref) -> str:
    """Dollar text: $12 or $3.75 (quarters are shown with two decimals)."""
    x = v.value if isinstance(v, Ref) else Fraction(v)
    if x.denominator == 1:
        return f"${x.numerator}"
    return f"${float(x):.2f}"


# ------------------------------------------------------------------ templates
# Each template returns (question, builder); its step count is its difficulty.

Template = Callable[[random.Random], tuple[str, _Builder]]
TEMPLATES: dict[int, list[tuple[str, Template]]] = {d: [] for d in range(1, MAX_DIFFICULTY + 1)}


def template(steps: int) -> Callable[[Template], Template]:
    def register(fn: Template) -> Template:
        TEMPLATES[steps].append((fn.__name__, fn))
        return fn

    return register


@template(1)
def buy_items(rng: random.Random) -> tuple[str, _Builder]:
    (name, pron), (_one, many, lo, hi) = _name(rng), rng.choice(GOODS)
    n, p = rng.randint(2, 12), _money(rng, lo, hi, rng.random() < 0.3)
    b = _Builder()
    b.step(f"cost of the {many}", "cost", "{} * {}", n, p)
    return f"{name} buys {n} {many} that cost {_d(p)} each. How many dollars does {pron} spend?", b


@template(1)
def more_arrive(rng: random.Random) -> tuple[str, _Builder]:
    place, things = rng.choice(PLACES)
    a, k = rng.randint(20, 400), rng.randint(5, 150)
    b = _Builder()
    b.step(f"{things} after the delivery", "total", "{} + {}", a, k)
    return (
        f"A {place} has {a} {things}. Then {k} more {things} arrive. "
        f"How many {things} does the {place} have now?"
    ), b


@template(1)
def share_equally(rng: random.Random) -> tuple[str, _Builder]:
    (name, _pron), things = _name(rng), rng.choice(THINGS)
    k, q = rng.randint(2, 12), rng.randint(2, 25)
    b = _Builder()
    b.step(f"{things} for each friend", "each", "{} / {}", k * q, k)
    return (
        f"{name} shares {k * q} {things} equally among {k} friends. "
        f"How many {things} does each friend get?"
    ), b


@template(1)
def rectangle_area(rng: random.Random) -> tuple[str, _Builder]:
    surface = rng.choice(SURFACES)
    length, width = rng.randint(3, 30), rng.randint(2, 20)
    b = _Builder()
    b.step(f"area of the {surface}", "area", "{} * {}", length, width)
    return (
        f"A rectangular {surface} is {length} metres long and {width} metres wide. "
        f"What is its area in square metres?"
    ), b


@template(1)
def age_later(rng: random.Random) -> tuple[str, _Builder]:
    name, pron = _name(rng)
    a, k = rng.randint(4, 60), rng.randint(2, 30)
    b = _Builder()
    b.step(f"{name}'s age in {k} years", "age", "{} + {}", a, k)
    return f"{name} is {a} years old. How old will {pron} be in {k} years?", b


@template(1)
def distance_at_speed(rng: random.Random) -> tuple[str, _Builder]:
    vehicle = rng.choice(VEHICLES)
    s, h = rng.randint(10, 90), rng.randint(2, 9)
    b = _Builder()
    b.step("distance travelled", "distance", "{} * {}", s, h)
    return (
        f"A {vehicle} travels at {s} kilometres per hour for {h} hours. "
        f"How many kilometres does it travel?"
    ), b


@template(2)
def buy_with_change(rng: random.Random) -> tuple[str, _Builder]:
    (name, pron), (_one, many, lo, hi) = _name(rng), rng.choice(GOODS)
    n, p = rng.randint(2, 6), _money(rng, lo, hi, rng.random() < 0.3)
    bill = next(x for x in BILLS if x > n * p) if n * p < 100 else 200
    b = _Builder()
    cost = b.step(f"cost of the {many}", "cost", "{} * {}", n, p)
    b.step("change", "change", "{} - {}", bill, cost)
    return (
        f"{name} buys {n} {many} at {_d(p)} each and pays with a ${bill} bill. "
        f"How much change, in dollars, does {pron} get?"
    ), b


@template(2)
def share_the_rest(rng: random.Random) -> tuple[str, _Builder]:
    (name, pron), things = _name(rng), rng.choice(THINGS)
    k, q, e = rng.randint(2, 9), rng.randint(2, 15), rng.randint(1, 20)
    total = k * q + e
    b = _Builder()
    rest = b.step(f"{things} left after keeping some", "rest", "{} - {}", total, e)
    b.step(f"{things} for each friend", "each", "{} / {}", rest, k)
    return (
        f"{name} has {total} {things}. {pron.capitalize()} keeps {e} and shares the rest "
        f"equally among {k} friends. How many {things} does each friend get?"
    ), b


@template(2)
def fence_perimeter(rng: random.Random) -> tuple[str, _Builder]:
    surface = rng.choice(SURFACES)
    length, width = rng.randint(4, 40), rng.randint(3, 25)
    b = _Builder()
    half = b.step("length plus width", "half", "{} + {}", length, width)
    b.step("perimeter", "perimeter", "2 * {}", half)
    return (
        f"A rectangular {surface} is {length} metres long and {width} metres wide. "
        f"How many metres of fence are needed to go all the way around it?"
    ), b


@template(2)
def combined_age(rng: random.Random) -> tuple[str, _Builder]:
    (a_name, _), (b_name, _) = _name(rng), _name(rng)
    while b_name == a_name:
        b_name, _ = _name(rng)
    m, young = rng.randint(2, 5), rng.randint(3, 15)
    b = _Builder()
    old = b.step(f"{a_name}'s age", f"{a_name.lower()}_age", "{} * {}", m, young)
    b.step("their combined age", "combined", "{} + {}", old, young)
    return (
        f"{a_name} is {m} times as old as {b_name}, who is {young} years old. "
        f"What is their combined age?"
    ), b


@template(2)
def daily_walks(rng: random.Random) -> tuple[str, _Builder]:
    name, pron = _name(rng)
    d1, d2, k = rng.randint(1, 9), rng.randint(1, 9), rng.randint(2, 14)
    b = _Builder()
    day = b.step("kilometres walked each day", "per_day", "{} + {}", d1, d2)
    b.step(f"kilometres walked in {k} days", "total", "{} * {}", day, k)
    return (
        f"Every day {name} walks {d1} kilometres in the morning and {d2} kilometres in the "
        f"evening. How many kilometres does {pron} walk in {k} days?"
    ), b


@template(2)
def machine_two_days(rng: random.Random) -> tuple[str, _Builder]:
    widgets = rng.choice(WIDGETS)
    r, h1, h2 = rng.randint(5, 60), rng.randint(2, 10), rng.randint(2, 10)
    b = _Builder()
    hours = b.step("hours worked in total", "hours", "{} + {}", h1, h2)
    b.step(f"{widgets} made", "made", "{} * {}", hours, r)
    return (
        f"A machine makes {r} {widgets} per hour. It runs for {h1} hours on Monday and "
        f"{h2} hours on Tuesday. How many {widgets} does it make on the two days?"
    ), b


@template(2)
def weekly_savings(rng: random.Random) -> tuple[str, _Builder]:
    name, pron = _name(rng)
    w, n = rng.randint(3, 25), rng.randint(3, 12)
    s = rng.randint(1, w * n - 1)
    b = _Builder()
    saved = b.step(f"money saved in {n} weeks", "saved", "{} * {}", w, n)
    b.step("money left", "left", "{} - {}", saved, s)
    return (
        f"{name} saves ${w} every week for {n} weeks, then spends ${s} on a present. "
        f"How many dollars does {pron} have left?"
    ), b


@template(3)
def two_goods_total(rng: random.Random) -> tuple[str, _Builder]:
    name, pron = _name(rng)
    (_, many1, lo1, hi1), (_, many2, lo2, hi2) = rng.sample(GOODS, 2)
    cents = rng.random() < 0.3
    n1, p1 = rng.randint(2, 8), _money(rng, lo1, hi1, cents)
    n2, p2 = rng.randint(2, 8), _money(rng, lo2, hi2, False)
    b = _Builder()
    c1 = b.step(f"cost of the {many1}", "cost_1", "{} * {}", n1, p1)
    c2 = b.step(f"cost of the {many2}", "cost_2", "{} * {}", n2, p2)
    b.step("total cost", "total", "{} + {}", c1, c2)
    return (
        f"{name} buys {n1} {many1} at {_d(p1)} each and {n2} {many2} at {_d(p2)} each. "
        f"How many dollars does {pron} spend in total?"
    ), b


@template(3)
def sale_price(rng: random.Random) -> tuple[str, _Builder]:
    name, pron = _name(rng)
    _, many, lo, hi = rng.choice(GOODS)
    pct = rng.choice([10, 20, 25, 50])
    p = 20 * rng.randint(1, 6) if pct != 25 else 4 * rng.randint(3, 25)
    n = rng.randint(2, 6)
    b = _Builder()
    off = b.step("discount on one", "discount", "{} * {} / 100", p, pct)
    sale = b.step("sale price of one", "sale_price", "{} - {}", p, off)
    b.step(f"cost of {n} {many}", "total", "{} * {}", sale, n)
    return (
        f"{many.capitalize()} usually cost ${p} each. This week they are {pct}% off. "
        f"{name} buys {n} {many}. How many dollars does {pron} pay?"
    ), b


@template(3)
def rug_uncovered(rng: random.Random) -> tuple[str, _Builder]:
    length, width = rng.randint(5, 15), rng.randint(4, 12)
    a, c = rng.randint(2, length - 1), rng.randint(2, width - 1)
    b = _Builder()
    room = b.step("area of the room", "room", "{} * {}", length, width)
    rug = b.step("area of the rug", "rug", "{} * {}", a, c)
    b.step("floor not covered", "uncovered", "{} - {}", room, rug)
    return (
        f"A room is {length} metres by {width} metres. A rug of {a} metres by {c} metres lies "
        f"on the floor. How many square metres of floor are not covered by the rug?"
    ), b


@template(3)
def three_ages(rng: random.Random) -> tuple[str, _Builder]:
    (x, _), (y, _), (z, _) = _name(rng), _name(rng), _name(rng)
    while len({x, y, z}) < 3:
        (y, _), (z, _) = _name(rng), _name(rng)
    ax, d = rng.randint(4, 30), rng.randint(2, 20)
    if (ax + d) % 2:
        d += 1
    b = _Builder()
    ay = b.step(f"{y}'s age", f"{y.lower()}_age", "{} + {}", ax, d)
    az = b.step(f"{z}'s age", f"{z.lower()}_age", "{} / 2", ay)
    b.step("sum of the three ages", "total", "{} + {} + {}", ax, ay, az)
    return (
        f"{x} is {ax} years old. {y} is {d} years older than {x}. {z} is half as old as {y}. "
        f"What is the sum of their three ages?"
    ), b


@template(3)
def two_leg_trip(rng: random.Random) -> tuple[str, _Builder]:
    vehicle = rng.choice(VEHICLES)
    s1, t1, s2, t2 = rng.randint(20, 90), rng.randint(1, 5), rng.randint(20, 90), rng.randint(1, 5)
    b = _Builder()
    h1 = b.step("hours for the first part", "time_1", "{} / {}", s1 * t1, s1)
    h2 = b.step("hours for the second part", "time_2", "{} / {}", s2 * t2, s2)
    b.step("hours for the whole trip", "hours", "{} + {}", h1, h2)
    return (
        f"A {vehicle} travels {s1 * t1} kilometres at {s1} kilometres per hour, then "
        f"{s2 * t2} kilometres at {s2} kilometres per hour. How many hours does the trip take?"
    ), b


@template(3)
def bus_stops(rng: random.Random) -> tuple[str, _Builder]:
    start = rng.randint(15, 60)
    off1 = rng.randint(1, start - 5)
    on1 = rng.randint(1, 20)
    off2 = rng.randint(1, start - off1 + on1 - 1)
    b = _Builder()
    after_off = b.step(
        "passengers after some get off at the first stop", "after_off", "{} - {}", start, off1
    )
    first = b.step("passengers after the first stop", "after_first", "{} + {}", after_off, on1)
    b.step("passengers after the second stop", "after_second", "{} - {}", first, off2)
    return (
        f"A bus leaves with {start} passengers. At the first stop {off1} get off and {on1} get "
        f"on. At the second stop {off2} get off. How many passengers are on the bus now?"
    ), b


@template(3)
def flour_to_buy(rng: random.Random) -> tuple[str, _Builder]:
    name, pron = _name(rng)
    per_batch, cookies = rng.randint(2, 5), rng.choice([6, 8, 10, 12, 15, 20, 24])
    batches = rng.randint(2, 8)
    have = rng.randint(1, per_batch * batches - 1)
    b = _Builder()
    nb = b.step("batches needed", "batches", "{} / {}", cookies * batches, cookies)
    need = b.step("cups of flour needed", "flour", "{} * {}", nb, per_batch)
    b.step("cups of flour to buy", "to_buy", "{} - {}", need, have)
    return (
        f"A recipe uses {per_batch} cups of flour for a batch of {cookies} cookies. {name} "
        f"wants to bake {cookies * batches} cookies and has {have} cups of flour. How many more "
        f"cups of flour does {pron} need?"
    ), b


@template(4)
def two_goods_change(rng: random.Random) -> tuple[str, _Builder]:
    name, pron = _name(rng)
    (_, many1, lo1, hi1), (_, many2, lo2, hi2) = rng.sample(GOODS, 2)
    n1, p1 = rng.randint(2, 5), _money(rng, lo1, hi1, rng.random() < 0.3)
    n2, p2 = rng.randint(2, 5), _money(rng, lo2, hi2, False)
    total = n1 * p1 + n2 * p2
    bill = next((x for x in BILLS if x > total), 200 if total < 200 else 500)
    b = _Builder()
    c1 = b.step(f"cost of the {many1}", "cost_1", "{} * {}", n1, p1)
    c2 = b.step(f"cost of the {many2}", "cost_2", "{} * {}", n2, p2)
    t = b.step("total cost", "total", "{} + {}", c1, c2)
    b.step("change", "change", "{} - {}", bill, t)
    return (
        f"{name} buys {n1} {many1} at {_d(p1)} each and {n2} {many2} at {_d(p2)} each. "
        f"{pron.capitalize()} pays with a ${bill} bill. How many dollars of change does "
        f"{pron} get?"
    ), b


@template(4)
def wages_split(rng: random.Random) -> tuple[str, _Builder]:
    name, pron = _name(rng)
    r, h, d = rng.randint(8, 25), rng.randint(3, 8), rng.randint(3, 6)
    earned = r * h * d
    s = rng.randint(1, earned - 2)
    if (earned - s) % 2:
        s += 1
    b = _Builder()
    day = b.step("pay per day", "per_day", "{} * {}", r, h)
    tot = b.step(f"pay for {d} days", "earned", "{} * {}", day, d)
    left = b.step("money left after rent", "left", "{} - {}", tot, s)
    b.step("amount in each account", "each", "{} / 2", left)
    return (
        f"{name} earns ${r} per hour and works {h} hours a day for {d} days. {pron.capitalize()} "
        f"pays ${s} of rent and splits the rest equally between two savings accounts. How "
        f"many dollars go into each account?"
    ), b


@template(4)
def fence_cost(rng: random.Random) -> tuple[str, _Builder]:
    surface = rng.choice(SURFACES)
    length, width = rng.randint(4, 30), rng.randint(3, 20)
    price, gate = rng.randint(2, 12), rng.randint(10, 80)
    b = _Builder()
    half = b.step("length plus width", "half", "{} + {}", length, width)
    per = b.step("perimeter", "perimeter", "2 * {}", half)
    fence = b.step("cost of the fence", "fence", "{} * {}", per, price)
    b.step("total cost with the gate", "total", "{} + {}", fence, gate)
    return (
        f"A rectangular {surface} is {length} metres long and {width} metres wide. Fencing "
        f"costs ${price} per metre, and a gate costs ${gate} more. How many dollars does it "
        f"cost to fence the whole {surface} and add the gate?"
    ), b


@template(4)
def fuel_trip(rng: random.Random) -> tuple[str, _Builder]:
    per100 = rng.choice([4, 5, 6, 8, 10])
    d = 25 * rng.randint(2, 16)
    price, toll = rng.randint(1, 3), rng.randint(3, 20)
    b = _Builder()
    both = b.step("kilometres there and back", "km", "2 * {}", d)
    litres = b.step("litres of fuel used", "litres", "{} * {} / 100", both, per100)
    fuel = b.step("cost of the fuel", "fuel_cost", "{} * {}", litres, price)
    b.step("total cost with the toll", "total", "{} + {}", fuel, toll)
    return (
        f"A car uses {per100} litres of fuel per 100 kilometres. It drives to a town {d} "
        f"kilometres away and back. Fuel costs ${price} per litre and the toll road costs "
        f"${toll} in total. How many dollars does the trip cost?"
    ), b


@template(4)
def pages_left(rng: random.Random) -> tuple[str, _Builder]:
    name, pron = _name(rng)
    p1, d1, p2, d2 = rng.randint(5, 30), rng.randint(2, 7), rng.randint(5, 30), rng.randint(2, 7)
    total = p1 * d1 + p2 * d2 + rng.randint(5, 200)
    b = _Builder()
    r1 = b.step("pages read at first", "read_1", "{} * {}", p1, d1)
    r2 = b.step("pages read afterwards", "read_2", "{} * {}", p2, d2)
    read = b.step("pages read in all", "read", "{} + {}", r1, r2)
    b.step("pages left", "left", "{} - {}", total, read)
    return (
        f"A book has {total} pages. {name} reads {p1} pages a day for {d1} days, then {p2} "
        f"pages a day for {d2} days. How many pages does {pron} still have to read?"
    ), b


@template(4)
def pizza_share(rng: random.Random) -> tuple[str, _Builder]:
    guests, each = rng.randint(3, 12), rng.randint(2, 4)
    slices = rng.choice([6, 8, 12])
    while (guests * each) % slices:
        guests += 1
    pizzas = guests * each // slices
    friends = rng.randint(2, 5)
    price = friends * rng.randint(2, 6)
    b = _Builder()
    s = b.step("slices needed", "slices", "{} * {}", guests, each)
    p = b.step("pizzas needed", "pizzas", "{} / {}", s, slices)
    c = b.step("cost of the pizzas", "cost", "{} * {}", p, price)
    b.step("share of each friend", "share", "{} / {}", c, friends)
    assert pizzas * price % friends == 0
    return (
        f"At a party {guests} guests each eat {each} slices of pizza. Each pizza has {slices} "
        f"slices and costs ${price}. {friends} friends split the cost of the pizzas equally. "
        f"How many dollars does each friend pay?"
    ), b


@template(5)
def three_goods_change(rng: random.Random) -> tuple[str, _Builder]:
    name, pron = _name(rng)
    goods = rng.sample(GOODS, 3)
    ns = [rng.randint(1, 4) for _ in goods]
    ps = [
        _money(rng, lo, hi, i == 0 and rng.random() < 0.3) for i, (_, _, lo, hi) in enumerate(goods)
    ]
    total = sum(n * p for n, p in zip(ns, ps, strict=True))
    bill = next((x for x in BILLS if x > total), 200 if total < 200 else 500)
    b = _Builder()
    costs = [
        b.step(f"cost of the {g[1]}", f"cost_{i + 1}", "{} * {}", n, p)
        for i, (g, n, p) in enumerate(zip(goods, ns, ps, strict=True))
    ]
    t = b.step("total cost", "total", "{} + {} + {}", *costs)
    b.step("change", "change", "{} - {}", bill, t)
    parts = [
        f"{n} {g[1] if n > 1 else g[0]} at {_d(p)} each"
        for g, n, p in zip(goods, ns, ps, strict=True)
    ]
    return (
        f"{name} buys {parts[0]}, {parts[1]} and {parts[2]}. {pron.capitalize()} pays with a "
        f"${bill} bill. How many dollars of change does {pron} get?"
    ), b


@template(5)
def sale_with_shipping(rng: random.Random) -> tuple[str, _Builder]:
    name, pron = _name(rng)
    _, many, _, _ = rng.choice(GOODS)
    pct = rng.choice([10, 20, 25, 50])
    p = 20 * rng.randint(1, 4) if pct != 25 else 4 * rng.randint(3, 15)
    n, ship = rng.randint(2, 4), rng.randint(3, 15)
    total = (p - p * pct // 100) * n + ship
    bill = next((x for x in BILLS if x > total), 200 if total < 200 else 500)
    b = _Builder()
    off = b.step("discount on one", "discount", "{} * {} / 100", p, pct)
    sale = b.step("sale price of one", "sale_price", "{} - {}", p, off)
    sub = b.step(f"cost of {n} {many}", "subtotal", "{} * {}", sale, n)
    tot = b.step("total with shipping", "total", "{} + {}", sub, ship)
    b.step("change", "change", "{} - {}", bill, tot)
    return (
        f"An online shop sells {many} for ${p} each, now {pct}% off. {name} orders {n} {many} "
        f"and pays ${ship} for shipping. {pron.capitalize()} pays with a ${bill} bill. How "
        f"many dollars of change does {pron} get?"
    ), b


@template(5)
def party_with_cake(rng: random.Random) -> tuple[str, _Builder]:
    guests, each = rng.randint(3, 12), rng.randint(2, 4)
    slices = rng.choice([6, 8, 12])
    while (guests * each) % slices:
        guests += 1
    pizzas = guests * each // slices
    friends = rng.randint(2, 5)
    price = rng.randint(5, 14)
    cake = rng.randint(8, 30)
    while (pizzas * price + cake) % friends:
        cake += 1
    b = _Builder()
    s = b.step("slices needed", "slices", "{} * {}", guests, each)
    p = b.step("pizzas needed", "pizzas", "{} / {}", s, slices)
    c = b.step("cost of the pizzas", "pizza_cost", "{} * {}", p, price)
    t = b.step("cost with the cake", "total", "{} + {}", c, cake)
    b.step("share of each friend", "share", "{} / {}", t, friends)
    return (
        f"At a party {guests} guests each eat {each} slices of pizza. Each pizza has {slices} "
        f"slices and costs ${price}. There is also a cake that costs ${cake}. {friends} friends "
        f"split the whole cost equally. How many dollars does each friend pay?"
    ), b


@template(5)
def four_ages_later(rng: random.Random) -> tuple[str, _Builder]:
    names: list[str] = []
    while len(names) < 4:
        n, _ = _name(rng)
        if n not in names:
            names.append(n)
    w, x, y, z = names
    aw, d, k = rng.randint(5, 20), rng.randint(1, 8), rng.randint(2, 10)
    if (2 * aw - d) % 2:
        d += 1
    b = _Builder()
    ax = b.step(f"{x}'s age", f"{x.lower()}_age", "2 * {}", aw)
    ay = b.step(f"{y}'s age", f"{y.lower()}_age", "{} - {}", ax, d)
    az = b.step(f"{z}'s age", f"{z.lower()}_age", "{} / 2", ay)
    now = b.step("their ages added now", "now", "{} + {} + {} + {}", aw, ax, ay, az)
    b.step(f"their ages added in {k} years", "later", "{} + 4 * {}", now, k)
    return (
        f"{w} is {aw} years old. {x} is twice as old as {w}. {y} is {d} years younger than "
        f"{x}. {z} is half as old as {y}. What will the four ages add up to in {k} years?"
    ), b


@template(5)
def factory_revenue(rng: random.Random) -> tuple[str, _Builder]:
    widgets = rng.choice(WIDGETS)
    r1, r2, h = rng.randint(5, 40), rng.randint(5, 40), rng.randint(2, 8)
    box = rng.choice([2, 4, 5, 10])
    while ((r1 + r2) * h) % box:
        h += 1
    price = rng.randint(3, 20)
    b = _Builder()
    a = b.step("made by machine A", "made_a", "{} * {}", r1, h)
    c = b.step("made by machine B", "made_b", "{} * {}", r2, h)
    t = b.step(f"{widgets} made in all", "made", "{} + {}", a, c)
    bx = b.step("boxes filled", "boxes", "{} / {}", t, box)
    b.step("money from the boxes", "revenue", "{} * {}", bx, price)
    return (
        f"Machine A makes {r1} {widgets} per hour and machine B makes {r2} per hour. Both run "
        f"for {h} hours. The {widgets} are packed in boxes of {box}, and each box sells for "
        f"${price}. How many dollars do the boxes bring in?"
    ), b


# ------------------------------------------------------------------ generation


def generate_problem(rng: random.Random, difficulty: int) -> Problem:
    """One problem of the given difficulty (number of steps), drawn from that level's templates."""
    if not 1 <= difficulty <= MAX_DIFFICULTY:
        raise ValueError(f"difficulty must be 1..{MAX_DIFFICULTY}, got {difficulty}")
    name, fn = rng.choice(TEMPLATES[difficulty])
    question, builder = fn(rng)
    if len(builder.steps) != difficulty:
        raise AssertionError(f"template {name} made {len(builder.steps)} steps, not {difficulty}")
    return Problem(question=question, steps=tuple(builder.steps), template=name)


def difficulty_plan(n: int, rng: random.Random) -> list[int]:
    """n difficulties spread evenly over 1..MAX_DIFFICULTY, in a seeded order."""
    plan = [1 + (i % MAX_DIFFICULTY) for i in range(n)]
    rng.shuffle(plan)
    return plan


# Distinct problems one seed's stream is asked for at most, across all splits. The smallest
# difficulty's template space holds about 46,000 distinct questions (measured: 20,000 draws give
# 16,200 distinct), and a split is spread evenly over the five difficulties, so 100,000 keeps every
# difficulty under half of its space: new problems stay quick to find (about 17 s for all of them)
# where far more would take minutes and then fail for want of new questions.
STREAM_CAPACITY = 100_000


@dataclass
class ProblemStream:
    """Unique problems in a fixed order for a seed: the same seed always yields the same list."""

    seed: int | str
    seen: set[str] = field(default_factory=set)

    def take(self, label: str, n: int) -> list[Problem]:
        rng = random.Random(f"whale-math:{self.seed}:{label}")
        out: list[Problem] = []
        for d in difficulty_plan(n, rng):
            for _attempt in range(500):
                p = generate_problem(rng, d)
                if p.question not in self.seen:
                    self.seen.add(p.question)
                    out.append(p)
                    break
            else:  # pragma: no cover - the template space is far larger than any split
                raise RuntimeError(f"could not find a new problem of difficulty {d} for {label}")
        return out


def generate_problems(seed: int | str, n: int, label: str = "all") -> list[Problem]:
    """n unique problems with an even difficulty mix (for pre-training data and quick checks)."""
    return ProblemStream(seed).take(label, n)
