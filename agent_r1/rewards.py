"""Rewards for question-answering agents: answer scores, format checks, process rewards.

Pure functions over strings and numbers (no torch). The reward annotation stage combines them:

    pred = extract_answer(final_turn_text)
    score = answer_score(pred, golds, metric="em")
    reward = compose_reward(score, is_well_formed_answer(final_turn_text), scheme="agent_r1")

plus, per search step, ``retrieval_reward`` (a bonus the first time a gold document is found).

Answer normalisation follows the SQuAD / HotpotQA evaluation scripts (lower-case, drop
punctuation, drop the articles a/an/the, collapse whitespace), preceded by Unicode NFKC
normalisation so that full-width letters, ligatures and non-breaking spaces compare equal to
their plain forms. Two deliberate differences from the official scripts:

- accents are KEPT ("Beyoncé" != "Beyonce"): stripping them would merge distinct names;
- every Unicode punctuation character (category P*) is removed, not only ASCII punctuation, so a
  curly apostrophe or an en-dash is treated like its ASCII counterpart. On ASCII text the result
  is identical to the official normalisation;
- an answer that is a number and nothing else compares as a number with a gold answer that is
  one: the sign and the decimal point count ("-3" != "3", "1.5" != "15"), thousands separators
  and trailing zeros do not ("1,000" == "1000", "3.0" == "3"). Text normalisation would drop the
  "-" and the "." (both punctuation) and merge those.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from decimal import Decimal

__all__ = [
    "REWARD_SCHEMES",
    "answer_score",
    "compose_reward",
    "exact_match",
    "extract_answer",
    "f1_score",
    "is_well_formed_answer",
    "normalize_answer",
    "retrieval_reward",
]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# HotpotQA's F1 gives no partial credit to these answers: "yes" vs "no" must not score 0.5.
_SPECIAL_ANSWERS = frozenset({"yes", "no", "noanswer"})

# a number and nothing else: optional sign, digits (with thousands commas, or none), decimals
_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[+-]?\.\d+")

#: Names accepted by ``compose_reward(scheme=...)``.
REWARD_SCHEMES = ("agent_r1", "answer_only", "answer_plus_format")


def _strip_punctuation(s: str) -> str:
    return "".join(ch for ch in s if not unicodedata.category(ch).startswith("P"))


def normalize_answer(s: str) -> str:
    """NFKC, lower-case, remove punctuation, remove articles, collapse whitespace (accents kept)."""
    s = unicodedata.normalize("NFKC", s).lower()
    s = _strip_punctuation(s)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _number(s: str) -> Decimal | None:
    """The value of an answer that is a number and nothing else (after NFKC, e.g. full-width
    digits, and around whitespace), else None."""
    s = unicodedata.normalize("NFKC", s).strip().replace("\u2212", "-")  # U+2212 minus sign
    return Decimal(s.replace(",", "")) if _NUMBER.fullmatch(s) else None


def _same_answer(pred: str, gold: str) -> bool:
    """Numbers compare as numbers, anything else by its normalised text."""
    p, g = _number(pred), _number(gold)
    if p is not None and g is not None:
        return p == g
    return normalize_answer(pred) == normalize_answer(gold)


def _as_golds(golds: str | Sequence[str]) -> list[str]:
    gold_list = [golds] if isinstance(golds, str) else list(golds)
    if not gold_list:
        raise ValueError("golds must hold at least one gold answer")
    return gold_list


def exact_match(pred: str | None, golds: str | Sequence[str]) -> float:
    """1.0 if the normalised prediction equals a normalised gold answer, else 0.0.

    Strict: a prediction that merely contains the gold answer ("Paris, France" for "Paris") is
    not a match. Two numbers compare by value (see the module docstring: "-3" != "3", "1,000"
    == "1000"). ``pred=None`` (no answer given) scores 0.0.
    """
    gold_list = _as_golds(golds)
    if pred is None:
        return 0.0
    return float(any(_same_answer(pred, g) for g in gold_list))


def _f1(pred: str, gold: str) -> float:
    if _number(pred) is not None and _number(gold) is not None:  # a number is right or wrong
        return float(_number(pred) == _number(gold))
    p, g = normalize_answer(pred), normalize_answer(gold)
    if (p in _SPECIAL_ANSWERS or g in _SPECIAL_ANSWERS) and p != g:
        return 0.0
    p_toks, g_toks = p.split(), g.split()
    if not p_toks or not g_toks:  # SQuAD 2.0 convention: both empty is a match
        return float(p_toks == g_toks)
    common = sum((Counter(p_toks) & Counter(g_toks)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p_toks), common / len(g_toks)
    return 2 * precision * recall / (precision + recall)


def f1_score(pred: str | None, golds: str | Sequence[str]) -> float:
    """Token-level F1 between the normalised prediction and answer, maximised over golds.

    As in the HotpotQA evaluation, "yes"/"no"/"noanswer" score 0 unless matched exactly; two
    numbers score as ``exact_match`` does (no partial credit). ``pred=None`` scores 0.0.
    """
    gold_list = _as_golds(golds)
    if pred is None:
        return 0.0
    return max(_f1(pred, g) for g in gold_list)


def answer_score(pred: str | None, golds: str | Sequence[str], metric: str = "em") -> float:
    """``exact_match`` (metric="em") or ``f1_score`` (metric="f1")."""
    if metric == "em":
        return exact_match(pred, golds)
    if metric == "f1":
        return f1_score(pred, golds)
    raise ValueError(f"unknown answer metric {metric!r}; valid metrics: 'em', 'f1'")


def extract_answer(text: str) -> str | None:
    """The stripped content of the LAST ``<answer>...</answer>`` in ``text``, or None."""
    matches = _ANSWER.findall(text)
    return matches[-1].strip() if matches else None


def is_well_formed_answer(text: str) -> bool:
    """True if a final turn is well formed.

    Exactly one ``<answer>`` and one ``</answer>``, in that order, around non-blank content, and
    no ``<tool_call>`` / ``</tool_call>`` tag anywhere in the turn.
    """
    if "<tool_call>" in text or "</tool_call>" in text:
        return False
    if text.count("<answer>") != 1 or text.count("</answer>") != 1:
        return False
    start, end = text.index("<answer>"), text.index("</answer>")
    return start < end and text[start + len("<answer>") : end].strip() != ""


def compose_reward(
    answer_score: float,
    format_valid: bool,
    scheme: str = "agent_r1",
    format_score: float = 0.0,
    format_bonus: float = 0.1,
) -> float:
    """Combine an answer score and a format check into the final (outcome) reward.

    Schemes:
      - ``agent_r1`` (Agent-R1 paper): ``answer_score`` if the format is valid, else
        ``format_score - 1`` (``format_score`` in [0, 1] is a partial format credit, so an
        ill-formed episode always scores below any well-formed one);
      - ``answer_only``: ``answer_score`` if the format is valid, else 0;
      - ``answer_plus_format``: ``answer_score + format_bonus * format_valid``.
    """
    if scheme == "agent_r1":
        return float(answer_score) if format_valid else float(format_score) - 1.0
    if scheme == "answer_only":
        return float(answer_score) if format_valid else 0.0
    if scheme == "answer_plus_format":
        return float(answer_score) + (format_bonus if format_valid else 0.0)
    raise ValueError(
        f"unknown reward scheme {scheme!r}; valid schemes: {', '.join(REWARD_SCHEMES)}"
    )


def retrieval_reward(
    retrieved_titles: Iterable[str],
    gold_titles: Iterable[str],
    already_found: set[str],
    bonus: float,
) -> tuple[float, set[str]]:
    """Process reward for one search step.

    ``bonus`` for each gold title retrieved for the first time in the episode (a gold document
    retrieved again, or twice in one result list, earns nothing more). Returns the reward and the
    updated set of gold titles found so far; ``already_found`` itself is not modified.
    """
    gold = set(gold_titles)
    new = (set(retrieved_titles) & gold) - already_found
    return bonus * len(new), already_found | new
