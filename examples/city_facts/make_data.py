"""Write the city_facts dataset: ``data/corpus.jsonl`` (one document per city) and
``data/{train,test}.jsonl`` (questions), in agent_r1.data's schema.

    python examples/city_facts/make_data.py [--cities 200] [--seed 0]

Questions: the population of a city, its founding year (one lookup each), and how many more
people live in one city than in another (two lookups and a calc; the answer may be negative).
The train and test questions are about disjoint cities. Deterministic for a seed.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

OUT = Path(__file__).parent / "data"
COUNTRIES = ["Velmark", "Ostrava", "Kelden", "Marisol"]


def _names(rng: random.Random, n: int) -> list[str]:
    onsets, vowels, ends = "b d f g k l m n p r s t v z".split(), "a e i o u".split(), ["vik", "ton", "mar", "dor", "s", "n"]
    names: set[str] = set()
    while len(names) < n:
        names.add((rng.choice(onsets) + rng.choice(vowels) + rng.choice(onsets) + rng.choice(vowels)
                   + rng.choice(ends)).capitalize())
    return sorted(names)


def _questions(rng: random.Random, cities: list[dict], split: str) -> list[dict]:
    rows = []
    for c in cities:
        rows.append({"question": f"What is the population of {c['name']}?", "answers": [str(c["population"])],
                     "hops": 1, "qtype": "population", "gold_titles": [c["name"]]})
        rows.append({"question": f"In which year was {c['name']} founded?", "answers": [str(c["founded"])],
                     "hops": 1, "qtype": "founded", "gold_titles": [c["name"]]})
        other = rng.choice([o for o in cities if o is not c])
        rows.append({"question": f"How many more people live in {c['name']} than in {other['name']}?",
                     "answers": [str(c["population"] - other["population"])], "hops": 2,
                     "qtype": "population_difference", "gold_titles": [c["name"], other["name"]]})
    for i, r in enumerate(rows):
        r.update(id=f"{split}-{i:04d}", search_chain=r["gold_titles"], split=split)
    return rows


def make(n_cities: int = 200, seed: int = 0, out: Path = OUT) -> Path:
    rng = random.Random(seed)
    cities = [{"name": name, "country": rng.choice(COUNTRIES), "population": rng.randrange(1000, 9999, 100),
               "founded": rng.randrange(1200, 1950)} for name in _names(rng, n_cities)]
    corpus = [{"doc_id": f"city-{i:03d}", "title": c["name"],
               "text": f"country {c['country']}, population {c['population']}, founded {c['founded']}"}
              for i, c in enumerate(cities)]
    cut = n_cities * 3 // 4
    splits = {"train": _questions(rng, cities[:cut], "train"), "test": _questions(rng, cities[cut:], "test")}
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in {"corpus": corpus, **splits}.items():
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cities", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    print(make(args.cities, args.seed, args.out))
