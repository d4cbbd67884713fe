"""A built-in encyclopedia of fictional people, towns, rivers, seas, companies and inventions.

Every name is invented from syllables, so no model can know an answer without searching. The
world is generated from a seed: the search domain uses a fixed corpus seed, and pre-training data
can come from a disjoint world (`build_encyclopedia(other_seed, n, avoid=default_names)`), so a
model learns *how* to search and read, never the evaluation facts.

Passages are short (one to three sentences), titled by their entity, a few per entity; facts are
spread across passages, and phrasings vary so an answer is sometimes early in a passage and
sometimes late. Questions are one-hop ("In which town was X born?") or two-hop ("In which year was
the founder of C born?"), with the supporting passages and good queries recorded for each.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

DEFAULT_CORPUS_SEED = 1729
DEFAULT_N_ENTITIES = 1000
MIN_ENTITIES = 30

_ONSETS = [
    "b",
    "d",
    "f",
    "g",
    "h",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "gr",
    "kr",
    "st",
    "tr",
    "th",
    "sh",
    "j",
    "c",
    "w",
    "fr",
    "pr",
    "sl",
    "gl",
]
_VOWELS = ["a", "e", "i", "o", "u", "a", "e", "o", "ai", "ei", "ou", "y"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "m", "k", "nd", "rn", "st", "lt", "x", "sk", "v", "rd"]
_TOWN_SUFFIXES = ["", "", "", "holm", "wick", "ford", "stad", "mere", "by", "dale", "haven", "burg"]

OCCUPATIONS = [
    "cartographer",
    "shipwright",
    "botanist",
    "clockmaker",
    "glassblower",
    "surveyor",
    "astronomer",
    "printer",
    "engineer",
    "physician",
    "weaver",
    "chemist",
    "architect",
    "composer",
    "merchant",
    "painter",
    "geologist",
    "lawyer",
    "brewer",
    "teacher",
    "sculptor",
    "mapmaker",
    "beekeeper",
    "bookbinder",
    "mason",
    "navigator",
]
# industry -> product
INDUSTRIES = {
    "Looms": "woollen cloth",
    "Foundry": "cast-iron stoves",
    "Glassworks": "glass lenses",
    "Mills": "flour and oat meal",
    "Shipyards": "river barges",
    "Brewery": "dark ale",
    "Printing House": "maps and almanacs",
    "Ironworks": "railway bolts",
    "Ropeworks": "ship ropes",
    "Clockworks": "tower clocks",
    "Tannery": "saddle leather",
    "Potteries": "glazed tiles",
    "Paper Mill": "writing paper",
    "Dye Works": "indigo dye",
}
# device -> what it does
DEVICES = {
    "lamp": "that burns seal oil without smoke",
    "press": "for squeezing oil from seeds",
    "loom": "that weaves patterned ribbons",
    "engine": "driven by hot air",
    "compass": "that corrects for iron in a ship's hull",
    "pump": "for draining flooded mines",
    "kiln": "that fires bricks with little fuel",
    "valve": "for steam boilers",
    "sextant": "for measuring the height of stars",
    "telegraph": "that signals with mirrors",
    "lens": "for lighthouse beacons",
    "dynamo": "turned by a water wheel",
    "scale": "for weighing letters",
    "drill": "for boring wells",
}
CROPS = ["barley", "flax", "apples", "rye", "hops", "plums", "sheep", "cheese", "honey", "timber"]
SHOPS = ["bakery", "forge", "bookshop", "mill", "tavern", "apothecary", "tailor's shop", "dairy"]
MARKETS = ["horse", "fish", "wool", "spice", "flower", "cattle", "cloth", "salt"]


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str

    def to_dict(self) -> dict[str, str]:
        return {"id": self.id, "title": self.title, "text": self.text}


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    answers: tuple[str, ...]
    hops: int
    kind: str
    support: tuple[str, ...]  # passage ids that together answer it
    queries: tuple[str, ...]  # one good search query per hop
    bridge: str = ""  # the intermediate entity of a two-hop question

    def meta(self) -> dict[str, Any]:
        return {
            "hops": self.hops,
            "kind": self.kind,
            "support": list(self.support),
            "queries": list(self.queries),
            "bridge": self.bridge,
            "answers": list(self.answers),
        }


@dataclass
class Encyclopedia:
    seed: int
    passages: list[Passage]
    questions: list[Question]
    entities: dict[str, list[dict[str, Any]]]
    name_words: frozenset[str] = field(default_factory=frozenset)

    def passage_dicts(self) -> list[dict[str, str]]:
        return [p.to_dict() for p in self.passages]


# ------------------------------------------------------------------ names


class _Names:
    """Fresh invented words: unique within a world and absent from `avoid`."""

    def __init__(self, rng: random.Random, avoid: Iterable[str]) -> None:
        self.rng = rng
        self.used: set[str] = {w.lower() for w in avoid}
        self.made: set[str] = set()

    def _root(self) -> str:
        """Open syllables with a consonant ending only on the last: easy to read and say."""
        r = self.rng
        n = r.choice((2, 2, 2, 3))
        return "".join(r.choice(_ONSETS) + r.choice(_VOWELS) for _ in range(n)) + r.choice(_CODAS)

    def word(self, suffixes: list[str] | None = None) -> str:
        for _ in range(10000):
            root = self._root()
            if not 4 <= len(root) <= 10 or re.search(r"(.)\1\1", root):
                continue
            suffix = self.rng.choice(suffixes) if suffixes else ""
            full = (root + suffix).capitalize()
            keys = {root.lower(), full.lower()}
            if keys & self.used:
                continue
            self.used |= keys
            self.made |= keys
            return full
        raise RuntimeError("ran out of invented names; lower n_entities")  # pragma: no cover


# ------------------------------------------------------------------ the world


def _counts(n: int) -> dict[str, int]:
    c = {
        "province": max(2, n // 30),
        "sea": max(2, n // 40),
        "river": max(3, n // 12),
        "town": max(4, n // 5),
        "company": max(2, n // 8),
        "invention": max(2, n // 8),
    }
    c["person"] = n - sum(c.values())
    return c


def _a(word: str) -> str:
    """The word with its indefinite article."""
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def build_encyclopedia(
    seed: int, n_entities: int = DEFAULT_N_ENTITIES, avoid: Iterable[str] = ()
) -> Encyclopedia:
    """A deterministic fictional world of about `n_entities` entities, its passages and questions.

    `avoid` holds name words that must not be used (pass another world's `name_words` to get a
    disjoint world for pre-training).
    """
    if n_entities < MIN_ENTITIES:
        raise ValueError(f"n_entities must be at least {MIN_ENTITIES}, got {n_entities}")
    counts = _counts(n_entities)
    if counts["person"] < counts["company"] + 2:
        raise ValueError(f"n_entities={n_entities} leaves too few people")  # pragma: no cover
    rng = random.Random(f"whale-encyclopedia:{seed}:{n_entities}")
    names = _Names(rng, avoid)

    provinces = [
        {"name": names.word(), "crop": rng.choice(CROPS)} for _ in range(counts["province"])
    ]
    seas = []
    for _ in range(counts["sea"]):
        w = names.word()
        lake = rng.random() < 0.5
        seas.append(
            {
                "name": f"Lake {w}" if lake else f"{w} Sea",
                "root": w,
                "kind": "lake" if lake else "sea",
                "province": rng.choice(provinces)["name"],
            }
        )
    rivers = [
        {
            "name": f"{(w := names.word())} River",
            "root": w,
            "sea": rng.choice(seas),
            "length": rng.randint(30, 2400),
            "province": rng.choice(provinces)["name"],
        }
        for _ in range(counts["river"])
    ]
    towns = [
        {
            "name": names.word(_TOWN_SUFFIXES),
            "province": rng.choice(provinces)["name"],
            "river": rng.choice(rivers),
            "founded": rng.randint(900, 1800),
            "market": rng.choice(MARKETS),
        }
        for _ in range(counts["town"])
    ]
    people = []
    for _ in range(counts["person"]):
        born = rng.randint(1700, 1950)
        home = rng.choice(towns)
        later = rng.choice([t for t in towns if t is not home])
        people.append(
            {
                "name": f"{names.word()} {names.word()}",
                "pron": rng.choice(("she", "he")),
                "born": born,
                "town": home,
                "later_town": later,
                "died": born + rng.randint(40, 85),
                "occupation": rng.choice(OCCUPATIONS),
                "shop": rng.choice(SHOPS),
                "company": None,
                "inventions": [],
            }
        )
    founders = rng.sample(people, counts["company"])
    companies = []
    for founder in founders:
        industry = rng.choice(sorted(INDUSTRIES))
        company = {
            "name": f"{names.word()} {industry}",
            "product": INDUSTRIES[industry],
            "founder": founder,
            "year": founder["born"] + rng.randint(22, 60),
            "hq": rng.choice(towns),
        }
        founder["company"] = company
        companies.append(company)
    inventions = []
    pool = [p for p in people if p["company"] is None]
    rng.shuffle(pool)
    for i in range(counts["invention"]):
        inventor = pool[i % len(pool)]
        device = rng.choice(sorted(DEVICES))
        inv = {
            "name": f"{names.word()} {device}",
            "device": device,
            "purpose": DEVICES[device],
            "inventor": inventor,
            "year": inventor["born"] + rng.randint(20, 65),
        }
        inventor["inventions"].append(inv)
        inventions.append(inv)

    passages: list[Passage] = []
    ids: dict[tuple[str, str], str] = {}
    per_title: Counter[str] = Counter()

    def add(title: str, key: str, text: str) -> None:
        per_title[title] += 1
        pid = f"{_slug(title)}-{per_title[title]}"
        ids[(title, key)] = pid
        passages.append(Passage(id=pid, title=title, text=text))

    for pr in provinces:
        add(
            pr["name"],
            "about",
            rng.choice(
                [
                    f"{pr['name']} is a hilly province known for its {pr['crop']}.",
                    f"The province of {pr['name']} lives mostly from {pr['crop']} and small trade.",
                ]
            ),
        )
    for s in seas:
        add(
            s["name"],
            "about",
            rng.choice(
                [
                    f"{s['name']} is a cold {s['kind']} on the edge of the province of {s['province']}.",
                    f"Fishing boats from {s['province']} have worked {s['name']} for centuries; "
                    f"it is {_a(s['kind'])} with many small islands.",
                ]
            ),
        )
    for r in rivers:
        name, length, prov, sea = r["name"], r["length"], r["province"], r["sea"]["name"]
        add(
            name,
            "length",
            rng.choice(
                [
                    f"The {name} is about {length} kilometres long and rises in {prov}.",
                    f"Rising in the hills of {prov}, the {name} runs for some {length} kilometres.",
                ]
            ),
        )
        add(
            name,
            "mouth",
            rng.choice(
                [
                    f"The {name} flows into {sea}.",
                    f"After passing through farmland and several old towns, the {name} finally "
                    f"empties into {sea}.",
                ]
            ),
        )
    for t in towns:
        name, prov, year, river = t["name"], t["province"], t["founded"], t["river"]["name"]
        add(
            name,
            "founded",
            rng.choice(
                [
                    f"{name} is a town in the province of {prov}. It was founded in {year}.",
                    f"Founded in {year}, {name} is one of the older towns of {prov}.",
                    f"The town of {name} lies in the province of {prov}; its first settlers founded "
                    f"it in {year}.",
                ]
            ),
        )
        add(
            name,
            "river",
            rng.choice(
                [
                    f"{name} lies on the {river}.",
                    f"Built along the banks of the {river}, {name} is known for its {t['market']} market.",
                    f"Every autumn {name} holds a {t['market']} market on the quays of the {river}.",
                ]
            ),
        )
    for p in people:
        name, occ, born = p["name"], p["occupation"], p["born"]
        pron, poss = p["pron"], "her" if p["pron"] == "she" else "his"
        town = p["town"]["name"]
        add(
            name,
            "born",
            rng.choice(
                [
                    f"{name} was {_a(occ)} born in {born}.",
                    f"Born in {born}, {name} worked as {_a(occ)} for most of {poss} life.",
                    f"Known to {poss} friends as a patient and careful {occ}, {name} was born in {born}.",
                ]
            ),
        )
        add(
            name,
            "town",
            rng.choice(
                [
                    f"{name} was born in {town}, a town in {p['town']['province']}.",
                    f"The {occ} {name} was born in the town of {town}.",
                    f"{name} was born and grew up in {town}, where {poss} family ran a small {p['shop']}.",
                ]
            ),
        )
        later = f"{name} later moved to {p['later_town']['name']}, where {pron} lived until {p['died']}."
        if p["company"] is not None:
            later += f" In {p['company']['year']}, {name} founded {p['company']['name']}."
        for inv in p["inventions"]:
            later += f" {pron.capitalize()} also designed the {inv['name']}."
        add(name, "later", later)
    for c in companies:
        name, f = c["name"], c["founder"]
        add(
            name,
            "about",
            rng.choice(
                [
                    f"{name} is a maker of {c['product']}. It was founded in {c['year']}.",
                    f"Founded in {c['year']}, {name} makes {c['product']}.",
                ]
            ),
        )
        add(
            name,
            "founder",
            rng.choice(
                [
                    f"{name} was founded by {f['name']}.",
                    f"The founder of {name} was the {f['occupation']} {f['name']}.",
                ]
            ),
        )
        add(
            name,
            "hq",
            rng.choice(
                [
                    f"{name} has its headquarters in {c['hq']['name']}.",
                    f"The offices and main workshop of {name} stand in the town of {c['hq']['name']}.",
                ]
            ),
        )
    for inv in inventions:
        name, who = inv["name"], inv["inventor"]
        add(
            name,
            "about",
            rng.choice(
                [
                    f"The {name} is {_a(inv['device'])} {inv['purpose']}. It was first built in {inv['year']}.",
                    f"First built in {inv['year']}, the {name} is {_a(inv['device'])} {inv['purpose']}.",
                ]
            ),
        )
        add(
            name,
            "inventor",
            rng.choice(
                [
                    f"The {name} was invented by {who['name']}.",
                    f"{who['name']} invented the {name} while working as {_a(who['occupation'])}.",
                ]
            ),
        )

    questions = _questions(provinces, seas, rivers, towns, people, companies, inventions, ids)
    entities = {
        "province": provinces,
        "sea": seas,
        "river": rivers,
        "town": towns,
        "person": people,
        "company": companies,
        "invention": inventions,
    }
    return Encyclopedia(
        seed=seed,
        passages=passages,
        questions=questions,
        entities=_plain(entities),
        name_words=frozenset(names.made),
    )


def _plain(entities: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Entities with references to other entities replaced by their names (JSON-friendly)."""

    def flat(v: Any) -> Any:
        if isinstance(v, dict):
            return v["name"]
        if isinstance(v, list):
            return [flat(x) for x in v]
        return v

    return {
        kind: [{k: flat(v) for k, v in e.items()} for e in items]
        for kind, items in entities.items()
    }


def _questions(
    provinces: list[dict[str, Any]],
    seas: list[dict[str, Any]],
    rivers: list[dict[str, Any]],
    towns: list[dict[str, Any]],
    people: list[dict[str, Any]],
    companies: list[dict[str, Any]],
    inventions: list[dict[str, Any]],
    ids: dict[tuple[str, str], str],
) -> list[Question]:
    out: list[Question] = []

    def q(
        kind: str,
        text: str,
        answers: tuple[str, ...],
        support: list[tuple[str, str]],
        queries: list[str],
        bridge: str = "",
    ) -> None:
        out.append(
            Question(
                id=f"q{len(out):05d}",
                question=text,
                answers=answers,
                hops=len(queries),
                kind=kind,
                support=tuple(ids[s] for s in support),
                queries=tuple(queries),
                bridge=bridge,
            )
        )

    def river_answers(r: dict[str, Any]) -> tuple[str, ...]:
        return (r["name"], r["root"])

    def sea_answers(s: dict[str, Any]) -> tuple[str, ...]:
        return (s["name"], s["root"])

    for p in people:
        n = p["name"]
        q(
            "person_birth_town",
            f"In which town was {n} born?",
            (p["town"]["name"],),
            [(n, "town")],
            [f"{n} born town"],
        )
        q(
            "person_birth_year",
            f"In which year was {n} born?",
            (str(p["born"]),),
            [(n, "born")],
            [f"{n} born year"],
        )
        q(
            "person_occupation",
            f"What was the occupation of {n}?",
            (p["occupation"],),
            [(n, "born")],
            [f"{n} occupation"],
        )
        t = p["town"]
        q(
            "birthplace_river",
            f"On which river lies the town where {n} was born?",
            river_answers(t["river"]),
            [(n, "town"), (t["name"], "river")],
            [f"{n} born town", f"{t['name']} river"],
            bridge=t["name"],
        )
    for t in towns:
        n = t["name"]
        q(
            "town_river",
            f"On which river does {n} lie?",
            river_answers(t["river"]),
            [(n, "river")],
            [f"{n} river"],
        )
        q(
            "town_founded",
            f"In which year was {n} founded?",
            (str(t["founded"]),),
            [(n, "founded")],
            [f"{n} founded"],
        )
        q(
            "town_province",
            f"In which province is {n}?",
            (t["province"],),
            [(n, "founded")],
            [f"{n} province"],
        )
        r = t["river"]
        q(
            "town_river_mouth",
            f"Into which body of water does the river that flows through {n} empty?",
            sea_answers(r["sea"]),
            [(n, "river"), (r["name"], "mouth")],
            [f"{n} river", f"{r['name']} flows into"],
            bridge=r["name"],
        )
    for r in rivers:
        n = r["name"]
        q(
            "river_mouth",
            f"Into which body of water does the {n} flow?",
            sea_answers(r["sea"]),
            [(n, "mouth")],
            [f"{n} flows into"],
        )
        q(
            "river_length",
            f"How many kilometres long is the {n}?",
            (str(r["length"]),),
            [(n, "length")],
            [f"{n} length kilometres"],
        )
    for c in companies:
        n, f = c["name"], c["founder"]
        q("company_founder", f"Who founded {n}?", (f["name"],), [(n, "founder")], [f"{n} founder"])
        q(
            "company_hq",
            f"In which town does {n} have its headquarters?",
            (c["hq"]["name"],),
            [(n, "hq")],
            [f"{n} headquarters"],
        )
        q(
            "company_year",
            f"In which year was {n} founded?",
            (str(c["year"]),),
            [(n, "about")],
            [f"{n} founded"],
        )
        q(
            "founder_birth_year",
            f"In which year was the founder of {n} born?",
            (str(f["born"]),),
            [(n, "founder"), (f["name"], "born")],
            [f"{n} founder", f"{f['name']} born year"],
            bridge=f["name"],
        )
        q(
            "founder_birth_town",
            f"In which town was the founder of {n} born?",
            (f["town"]["name"],),
            [(n, "founder"), (f["name"], "town")],
            [f"{n} founder", f"{f['name']} born town"],
            bridge=f["name"],
        )
        q(
            "hq_province",
            f"In which province is the town where {n} has its headquarters?",
            (c["hq"]["province"],),
            [(n, "hq"), (c["hq"]["name"], "founded")],
            [f"{n} headquarters", f"{c['hq']['name']} province"],
            bridge=c["hq"]["name"],
        )
    for inv in inventions:
        n, who = inv["name"], inv["inventor"]
        q(
            "invention_inventor",
            f"Who invented the {n}?",
            (who["name"],),
            [(n, "inventor")],
            [f"{n} invented"],
        )
        q(
            "invention_year",
            f"In which year was the {n} first built?",
            (str(inv["year"]),),
            [(n, "about")],
            [f"{n} first built"],
        )
        q(
            "inventor_birth_town",
            f"In which town was the inventor of the {n} born?",
            (who["town"]["name"],),
            [(n, "inventor"), (who["name"], "town")],
            [f"{n} inventor", f"{who['name']} born town"],
            bridge=who["name"],
        )
        q(
            "inventor_birth_year",
            f"In which year was the inventor of the {n} born?",
            (str(who["born"]),),
            [(n, "inventor"), (who["name"], "born")],
            [f"{n} inventor", f"{who['name']} born year"],
            bridge=who["name"],
        )
    return out


@lru_cache(maxsize=4)
def default_encyclopedia() -> Encyclopedia:
    """The world the search domain uses (fixed corpus seed), built once per process."""
    return build_encyclopedia(DEFAULT_CORPUS_SEED, DEFAULT_N_ENTITIES)
