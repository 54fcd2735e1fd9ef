"""Write the mcp_tools dataset: ``data/{train,test}.jsonl``, time-zone questions answered with
the ``convert_time`` tool of the MCP server ``mcp-server-time``.

    python examples/mcp_tools/make_data.py [--seed 0]

A question gives a time of day in one zone and asks for the time in another: "When it is 14:30
in UTC, what time is it in Asia/Tokyo?" (answer "23:30"). Every zone keeps one UTC offset all
year (no daylight saving time), so the answer does not depend on the day the server converts
on. The train and test questions use disjoint times of day. Deterministic for a seed.
"""

from __future__ import annotations

import argparse
import json
import random
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

OUT = Path(__file__).parent / "data"
ZONES = ["UTC", "Asia/Tokyo", "Asia/Kolkata", "Asia/Shanghai", "Asia/Dubai", "Asia/Kathmandu", "Asia/Jakarta",
         "Asia/Karachi", "Africa/Nairobi", "Africa/Lagos", "America/Bogota", "America/Phoenix", "Pacific/Honolulu",
         "Australia/Brisbane"]


def offset(zone: str) -> timedelta:
    """The zone's UTC offset, the same in January and in July (checked)."""
    january, july = (datetime(2025, month, 15, 12, tzinfo=ZoneInfo(zone)).utcoffset() for month in (1, 7))
    if january != july:
        raise ValueError(f"{zone} observes daylight saving time; the answers would depend on the date")
    return january


def convert(time: str, source: str, target: str) -> str:
    """`time` (HH:MM) in zone `source` as the time of day in zone `target`, HH:MM."""
    when = datetime(2025, 1, 15, *map(int, time.split(":"))) + offset(target) - offset(source)
    return when.strftime("%H:%M")


def _rows(rng: random.Random, times: list[str], split: str) -> list[dict]:
    rows = []
    for i, time in enumerate(times):
        source, target = rng.sample(ZONES, 2)
        question = f"When it is {time} in {source}, what time is it in {target}?"
        rows.append({"id": f"{split}-{i:04d}", "question": question,
                     "answers": [convert(time, source, target)], "hops": 1, "qtype": "convert_time",
                     "source_timezone": source, "time": time, "target_timezone": target})
    return rows


def make(seed: int = 0, n_train: int = 160, n_test: int = 40, out: Path = OUT) -> Path:
    rng = random.Random(seed)
    times = rng.sample([f"{h:02d}:{m:02d}" for h in range(24) for m in range(0, 60, 5)], n_train + n_test)
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", _rows(rng, times[:n_train], "train")), ("test", _rows(rng, times[n_train:], "test"))):
        (out / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    print(make(args.seed, out=args.out))
