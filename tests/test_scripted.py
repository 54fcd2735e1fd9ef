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


def test_the_docstring_example_runs_as_a_doctest():
    import doctest

    import agent_r1.rollout.scripted as scripted

    result = doctest.testmod(scripted)
    assert result.attempted >= 10 and result.failed == 0, result


def test_a_prompt_that_leaves_no_room_for_a_turn_is_a_clear_error():
    """The tool schemas in the prompt (env.tool_schemas to the context manager) can take the
    whole budget: every episode would end on turn 1 with 'token_budget'; that is an error naming
    the sizes, not a silent zero reward."""
    from agent_r1.context import ContextManager
    from agent_r1.envs import ToolEnv
    from agent_r1.models import train_tokenizer
    from agent_r1.rollout import SamplingParams, ScriptedEngine, run_episodes
    from agent_r1.tools import tool

    @tool(thread_safe=True)
    def lookup(city: str) -> str:
        """Look up a city's population.

        Args:
            city: The city's name.
        """
        return "12000"

    tasks = [{"id": "q1", "question": "How many people live in Lorvik?"}]
    tokenizer = train_tokenizer([t["question"] for t in tasks], vocab_size=300)
    env = ToolEnv([lookup], max_turns=3)
    engine = ScriptedEngine(tokenizer, ["<answer>12000</answer>"])
    context = ContextManager(tokenizer, env.tool_schemas)
    prompt = len(context.start(env.reset(tasks[0])).prompt_ids)
    from agent_r1.rollout.loop import ContextBudgetError

    with pytest.raises(ContextBudgetError, match=rf"the prompt of every task is at least {prompt} tokens \(1 tool schemas in it\); with max_new_tokens=16 "
                                         rf"that is more than max_context_tokens={prompt}"):
        run_episodes(engine, lambda: ToolEnv([lookup], max_turns=3), tasks, context, SamplingParams(max_new_tokens=16),
                     max_context_tokens=prompt)
    trajs = run_episodes(engine, lambda: ToolEnv([lookup], max_turns=3), tasks, context, SamplingParams(max_new_tokens=16),
                         max_context_tokens=prompt + 16)
    assert trajs[0].stop_reason == "answer" and trajs[0].final_reward == 0.0


@pytest.mark.parametrize("kind", ["scripted", "hf"])
def test_a_prompt_that_does_not_fit_never_reaches_the_engine(kind, tok, make_model):
    """Of two episodes, the one whose prompt leaves no room for a turn of max_new_tokens ends
    before its first turn: 'token_budget', no step (so no training row), final reward 0 although
    its environment scores a missing answer -1; only the other's contexts reach the engine
    (ScriptedEngine or HFEngine: the same loop)."""
    from agent_r1.context import ContextManager
    from agent_r1.envs import ToolEnv
    from agent_r1.rollout import HFEngine, run_episodes
    from agent_r1.trajectory import to_sequences

    class Strict(ToolEnv):  # as CodeEnv: no well-formed answer scores -1
        def final_reward(self, answer, action_text):
            return (1.0 if answer == "Paris" else -1.0), {}

    engine = ScriptedEngine(tok, ["<answer>Paris</answer>"]) if kind == "scripted" else \
        HFEngine(make_model(seed=0, std=0.3), tok, precision="fp32")
    seen = []
    generate = engine.generate
    engine.generate = lambda contexts, params: seen.append(list(contexts)) or generate(contexts, params)
    tasks = [{"id": "short", "question": "Paris?"}, {"id": "long", "question": "the museum of Paris " * 40}]
    context = ContextManager(tok)
    sizes = [len(context.start(Strict([], max_turns=1).reset(t)).prompt_ids) for t in tasks]
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    budget = sizes[0] + 8
    assert sizes[1] + 8 > budget
    short, long = run_episodes(engine, lambda: Strict([], max_turns=1), tasks, context, params, max_context_tokens=budget)
    assert long.stop_reason == "token_budget" and long.steps == [] and long.final_reward == 0.0 and long.total_reward == 0.0
    assert to_sequences(long, 1) == []
    assert len(short.steps) == 1 and short.stop_reason in ("answer", "max_turns")
    assert len(seen) == 1 and len(seen[0]) == 1 and len(seen[0][0]) == sizes[0]  # the long prompt never went out
