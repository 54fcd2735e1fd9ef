import pytest

from agent_r1.rewards import (
    REWARD_SCHEMES,
    answer_score,
    compose_reward,
    exact_match,
    extract_answer,
    f1_score,
    is_well_formed_answer,
    normalize_answer,
    retrieval_reward,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The Beatles", "beatles"),
        ("  a   Tale of  Two Cities. ", "tale of two cities"),
        ("Ｔｈｅ  Beatles!", "beatles"),  # full-width letters (NFKC)
        ("New\u00a0York", "new york"),  # non-breaking space
        ("\ufb01nal answer", "final answer"),  # "fi" ligature
        ("Beyoncé’s", "beyoncés"),  # accents kept; curly apostrophe is punctuation
        ("theatre anthem", "theatre anthem"),  # articles only as whole words
        ("U.S.A.", "usa"),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


def test_exact_match():
    assert exact_match("the Beatles", "Beatles") == 1.0
    assert exact_match("Ｔｈｅ  Beatles!", "beatles") == 1.0
    assert exact_match("New\u00a0York", ["Boston", "new york"]) == 1.0
    assert exact_match("Paris, France", "Paris") == 0.0  # a substring is not a match
    assert exact_match("Beyoncé", "Beyonce") == 0.0  # accents are kept
    assert exact_match(None, "Paris") == 0.0
    with pytest.raises(ValueError):
        exact_match("Paris", [])


@pytest.mark.parametrize(
    "pred, gold, match",
    [
        ("-3", "3", 0.0),  # text normalisation drops the sign
        ("1.5", "15", 0.0),  # ... and the decimal point
        ("1,000", "1000", 1.0),  # thousands separators do not count
        ("3.0", "3", 1.0),  # nor trailing zeros
        (" +42 ", "42", 1.0),
        ("\u22127", "-7", 1.0),  # the Unicode minus sign
        ("１２", "12", 1.0),  # full-width digits (NFKC)
        ("0.5", ".5", 1.0),
        ("1,00", "100", 1.0),  # not a thousands grouping: compared as text, as before
        ("3 apples", "3", 0.0),  # not a bare number: text rules
        ("the 3", "3", 1.0),  # text rules: the article goes
    ],
)
def test_exact_match_numbers(pred, gold, match):
    assert exact_match(pred, gold) == match
    assert f1_score(pred, gold) == (match if pred not in ("3 apples",) else pytest.approx(2 / 3))


def test_f1_hand_checked():
    # pred {paris, france} vs gold {paris}: P = 1/2, R = 1 -> F1 = 2/3
    assert f1_score("Paris, France", "Paris") == pytest.approx(2 / 3)
    # pred {mara, velkin, jr} vs gold {mara, velkin, senior, x}: common 2, P = 2/3, R = 2/4
    # F1 = 2 * (2/3) * (1/2) / (2/3 + 1/2) = 4/7
    assert f1_score("Mara Velkin Jr.", "Mara Velkin Senior X") == pytest.approx(4 / 7)
    # articles and punctuation do not count as tokens; max over golds
    assert f1_score("The Paris", ["Lyon", "paris!"]) == 1.0
    # tokens count with multiplicity: pred {x, x, y}, gold {x, y}: common 2, P = 2/3, R = 1 -> 0.8
    assert f1_score("x x y", "x y") == pytest.approx(0.8)
    assert f1_score("Lyon", "Paris") == 0.0
    assert f1_score(None, "Paris") == 0.0


def test_f1_yes_no_special_case():
    assert f1_score("yes", "no") == 0.0
    assert f1_score("no", "no") == 1.0
    assert f1_score("yes it is", "yes") == 0.0  # no partial credit against yes/no
    assert f1_score("yes", "yes it is") == 0.0


def test_answer_score():
    assert answer_score("Paris, France", ["Paris"], "em") == 0.0
    assert answer_score("Paris, France", ["Paris"], "f1") == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="'bleu'"):
        answer_score("a", "a", metric="bleu")


def test_extract_answer():
    assert extract_answer("think <answer> Paris </answer>") == "Paris"
    assert extract_answer("<answer>a</answer> then <answer>\nb\n</answer>") == "b"  # the last
    assert extract_answer("no answer here") is None
    assert extract_answer("<answer>unclosed") is None


def test_is_well_formed_answer():
    assert is_well_formed_answer("I found it. <answer>Pellton</answer>")
    assert not is_well_formed_answer("<answer>a</answer><answer>b</answer>")
    assert not is_well_formed_answer('<tool_call>{"name": "search"}</tool_call><answer>a</answer>')
    assert not is_well_formed_answer("</answer>a<answer>")
    assert not is_well_formed_answer("<answer>  </answer>")
    assert not is_well_formed_answer("Pellton")


def test_compose_reward():
    assert compose_reward(1.0, True) == 1.0
    assert compose_reward(0.5, True, "agent_r1") == 0.5
    assert compose_reward(1.0, False, "agent_r1") == -1.0
    assert compose_reward(1.0, False, "agent_r1", format_score=0.5) == -0.5
    assert compose_reward(0.7, True, "answer_only") == 0.7
    assert compose_reward(0.7, False, "answer_only") == 0.0
    assert compose_reward(0.7, True, "answer_plus_format") == pytest.approx(0.8)
    assert compose_reward(0.7, False, "answer_plus_format") == pytest.approx(0.7)
    assert compose_reward(0.0, True, "answer_plus_format", format_bonus=0.25) == 0.25
    with pytest.raises(ValueError) as err:
        compose_reward(1.0, True, "bogus")
    assert "'bogus'" in str(err.value)
    assert all(name in str(err.value) for name in REWARD_SCHEMES)


def test_retrieval_reward_counts_gold_once():
    gold = ["Brask Tolen", "Mara Velkin"]
    found: set[str] = set()
    r, found = retrieval_reward(["Brask Tolen", "Orvo Pictures", "Brask Tolen"], gold, found, 0.2)
    assert r == pytest.approx(0.2) and found == {"Brask Tolen"}
    before = set(found)
    r, found2 = retrieval_reward(["Brask Tolen"], gold, found, 0.2)  # already found: nothing
    assert r == 0.0 and found2 == {"Brask Tolen"}
    assert found == before  # the input set is not modified
    r, found3 = retrieval_reward(["Mara Velkin", "Brask Tolen"], gold, found2, 0.2)
    assert r == pytest.approx(0.2) and found3 == {"Brask Tolen", "Mara Velkin"}
    assert retrieval_reward([], gold, set(), 0.2) == (0.0, set())
