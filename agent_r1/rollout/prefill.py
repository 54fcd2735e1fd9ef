"""The prefill plan of a batch: identical rows computed once, and the rows grouped into forward
passes, each padded only to its own longest new part."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agent_r1.rollout.kv_store import Kept


@dataclass
class PrefillRow:
    """A unique row of the batch: a context and the kept sequence it extends (``None``: none)."""

    ids: list[int]
    prefix: Kept | None

    @property
    def new(self) -> int:
        """The tokens after the kept prefix: those this row needs prefilled."""
        return len(self.ids) - (len(self.prefix.ids) if self.prefix else 0)


@dataclass
class PrefillGroup:
    """Unique rows prefilled in one forward pass, right-aligned: ``new`` input columns (the
    group's longest new part, shorter rows left-padded) after ``cached`` columns from kept
    prefixes, ``width`` in all (the group's longest context)."""

    rows: list[int]  # indices into PrefillPlan.rows
    width: int
    new: int

    @property
    def cached(self) -> int:
        return self.width - self.new


@dataclass
class PrefillPlan:
    rows: list[PrefillRow]  # the unique rows
    row_of: list[int]  # the unique row of each context of the batch
    groups: list[PrefillGroup]
    width: int  # the longest context: the decode cache's context columns

    @property
    def prefill_tokens(self) -> int:
        return sum(r.new for r in self.rows)

    @property
    def direct(self) -> bool:
        """One group holding every context in order: its cache is the decode cache."""
        return len(self.groups) == 1 and len(self.rows) == len(self.row_of)

    def layout(self, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Input ids, attention mask and positions of the unique rows, [rows, width] each:
        right-aligned, left-padded, positions counted from each row's first real token."""
        ids = torch.full((len(self.rows), self.width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(self.rows), self.width), dtype=torch.long)
        for b, row in enumerate(self.rows):
            ids[b, self.width - len(row.ids):] = torch.tensor(row.ids)
            mask[b, self.width - len(row.ids):] = 1
        return ids, mask, (mask.cumsum(1) - 1).clamp(min=0)

    def logit_rows(self) -> list[int]:
        """For each context, its row in the groups' next-token logits concatenated in group order."""
        at = {r: k for k, r in enumerate(r for g in self.groups for r in g.rows)}
        return [at[r] for r in self.row_of]


def plan_prefill(contexts: list[list[int]], prefixes: list[Kept | None], overhead: int = 64) -> PrefillPlan:
    """Identical (prefix, context) rows (a GRPO group's shared prompt) computed once, grouped by
    :func:`prefill_groups` on their new tokens."""
    unique: dict[tuple, int] = {}
    row_of = [unique.setdefault((id(p), tuple(c)), len(unique)) for c, p in zip(contexts, prefixes)]
    rows: list[PrefillRow | None] = [None] * len(unique)
    for c, p, r in zip(contexts, prefixes, row_of):
        rows[r] = rows[r] or PrefillRow(c, p)
    groups = [PrefillGroup(g, max(len(rows[r].ids) for r in g), max(rows[r].new for r in g))
              for g in prefill_groups([r.new for r in rows], overhead)]
    return PrefillPlan(rows, row_of, groups, max(len(c) for c in contexts))


def prefill_groups(lengths: list[int], overhead: int = 64) -> list[list[int]]:
    """Rows grouped for prefill, each group padded only to its own longest row: rows sorted by
    length, cut where (padded tokens + ``overhead`` tokens per forward pass) is least. One group
    keeps the rows' order."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    sizes = [lengths[r] for r in order]
    cost, cut = [0] + [float("inf")] * len(order), [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):  # the last group is order[i:j], padded to sizes[j - 1]
        for i in range(j):
            c = cost[i] + (j - i) * sizes[j - 1] + overhead
            if c < cost[j]:
                cost[j], cut[j] = c, i
    groups, j = [], len(order)
    while j:
        groups.append(order[cut[j]:j])
        j = cut[j]
    return groups if len(groups) > 1 else [list(range(len(order)))]
