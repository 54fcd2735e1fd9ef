"""The public ScriptedEngine keeps RolloutEngine.generate's contract."""

import pytest
import torch

from agent_r1.learner import token_logprobs
from agent_r1.rollout import SamplingParams, ScriptedEngine


def test_text_turns_end_with_eos_and_long_turns_are_cut_unfinished(tok):
    engine = ScriptedEngine(tok, ["<answer>Paris</answer>", ["hello", list(range(5, 40))]])
    (g,) = engine.generate([[1, 2]], SamplingParams(max_new_tokens=64))
    assert g.ids == tok.encode("<answer>Paris</answer>", add_special_tokens=False) + [tok.eos_token_id]
    assert g.finished and g.logprobs == [0.0] * len(g.ids)  # no model: no log-probs to give
    short, cut = engine.generate([[1], [2]], SamplingParams(max_new_tokens=6))
    assert short.finished and short.ids[-1] == tok.eos_token_id
    assert cut.ids == list(range(5, 11)) and not cut.finished  # cut at max_new_tokens
    with pytest.raises(IndexError, match="no model"):
        engine.generate([[1]], SamplingParams())


def test_scripted_turns_get_their_true_logprobs_and_none_samples(tok, make_model):
    model = make_model(seed=0, std=0.3)
    engine = ScriptedEngine(tok, [["<answer>x</answer>", None]], model=model)
    torch.manual_seed(0)
    scripted, sampled = engine.generate([[3, 4], [3, 4]], SamplingParams(temperature=0.7, max_new_tokens=5))
    full = torch.tensor([[3, 4] + scripted.ids])
    expected = token_logprobs(model, full, torch.ones_like(full), 0.7)[0, 2:]
    assert torch.allclose(torch.tensor(scripted.logprobs), expected, atol=1e-5)
    assert 1 <= len(sampled.ids) <= 5 and len(sampled.logprobs) == len(sampled.ids)
    with pytest.raises(ValueError, match="2 turns for 1 contexts"):
        ScriptedEngine(tok, [["a", "b"]]).generate([[1]], SamplingParams())
