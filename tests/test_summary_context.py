"""The summary context manager: older turns replaced by an extractive summary once the history
passes its budget, and training sees exactly the summarised context the policy saw."""

import json

import pytest

from agent_r1.config import ConfigError, load_config, parse_overrides
from agent_r1.context import ContextManager, Summary, extractive_summary, first_sentence, make_context_manager
from agent_r1.envs import MultiHopQAEnv
from agent_r1.rollout import SamplingParams, ScriptedEngine, run_episodes
from agent_r1.tools import SearchIndex, make_search_tool
from agent_r1.trajectory import to_sequences

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where is the Louvre?"}]


def search_msg(*passages):
    return [{"role": "tool", "name": "search",
             "content": "\n".join(f"({k}) {t}: {x}" for k, (t, x) in enumerate(passages, 1))}]


def test_extractive_summary_keeps_each_passage_title_and_first_sentence():
    obs = [search_msg(("Louvre", "An art museum in Paris. It opened in 1793."), ("Paris", "The capital of France!  Big.")),
           [{"role": "tool", "name": "calc", "content": "42. exactly"}]]
    assert extractive_summary(obs) == ("Found in earlier turns:\n- Louvre: An art museum in Paris.\n"
                                       "- Paris: The capital of France!\n- calc: 42.")
    assert first_sentence("a " * 300, max_chars=10) == "a a a a a "


def test_summary_is_the_full_history_until_the_budget_then_summarises_older_turns(tok):
    full, summary = ContextManager(tok), Summary(tok, budget=10**6, keep=1)
    ctx_f, ctx_s = full.start(MESSAGES), summary.start(MESSAGES)
    eos = tok.eos_token_id
    turns = [(tok.encode(f"search {k}") + [eos], search_msg((f"Louvre{k}", f"Fact {k}. More."))) for k in range(3)]
    for a, obs in turns:
        full.observe(ctx_f, a, obs)
        summary.observe(ctx_s, a, obs)
    assert summary.context_ids(ctx_s) == full.context_ids(ctx_f)  # under budget: nothing summarised

    tight = Summary(tok, budget=len(ctx_f.prompt_ids) + 5, keep=1)
    ids = tight.context_ids(ctx_s)
    last_action, last_obs = ctx_s.turns[-1]
    assert ids[-len(last_action + last_obs):] == last_action + last_obs  # the kept turn, as sampled
    text = tok.decode(ids)
    assert "Louvre0" in text and "Fact 0." in text and "Louvre1" in text  # the two older turns, summarised
    assert "search 0" not in text and "search 1" not in text  # their actions are gone
    assert "search 2" in text and len(ids) < len(full.context_ids(ctx_f))
    # the summary goes into the task's user message, in the prompt the chat template renders
    summarised_prompt = tight.start([MESSAGES[0], {"role": "user", "content": MESSAGES[1]["content"] + "\n\n"
                                                   + extractive_summary(ctx_s.observations[:2])}]).prompt_ids
    assert ids == summarised_prompt + last_action + last_obs
    with pytest.raises(ValueError, match="budget"):
        Summary(tok, budget=0)


def test_training_tokens_equal_rollout_tokens_across_a_summarised_episode(tok, corpus, tasks):
    seen = []

    class Recording(ScriptedEngine):
        def generate(self, contexts, params):
            seen.extend(list(c) for c in contexts)
            return super().generate(contexts, params)

    search = make_search_tool(SearchIndex(corpus), top_k=2)
    calls = [f'<tool_call>{json.dumps({"name": "search", "arguments": {"query": q}})}</tool_call>'
             for q in ("Louvre", "Mona Lisa", "Danube")]
    engine = Recording(tok, calls + ["<answer>Paris</answer>"])
    cm = Summary(tok, budget=60, keep=1)
    (traj,) = run_episodes(engine, lambda: MultiHopQAEnv(search, system_prompt=None), [tasks[0]], cm,
                           SamplingParams(max_new_tokens=64))
    assert len(traj.steps) == 4 and traj.stop_reason == "answer"
    assert [s.context_ids for s in traj.steps] == seen  # each step stores what the policy saw
    summarised = [s for s in traj.steps if "Found in earlier turns" in tok.decode(s.context_ids)]
    assert len(summarised) >= 2  # the budget was passed and the history summarised
    seqs = to_sequences(traj)  # not a prefix chain any more: one sequence per step
    assert [q.ids for q in seqs] == [c + s.action_ids for c, s in zip(seen, traj.steps)]
    for q, s in zip(seqs, traj.steps):
        assert [i for i, m in zip(q.ids, q.action) if m] == s.action_ids  # only the sampled ids are trained


def test_context_managers_are_chosen_by_name_or_import_path(tok, tmp_path):
    (tmp_path / "ctx.py").write_text(
        "from agent_r1.context import SlidingWindow\n\nclass LastTurn(SlidingWindow):\n"
        "    def __init__(self, tokenizer, tools=None, **kw):\n        super().__init__(tokenizer, tools, window=1)\n")
    assert isinstance(make_context_manager("summary", tok, budget=99), Summary)
    assert type(make_context_manager(f"{tmp_path / 'ctx.py'}:LastTurn", tok)).__name__ == "LastTurn"
    cfg = load_config("default", "pipelines.yaml", parse_overrides([f"env.context={tmp_path / 'ctx.py'}:LastTurn"]))
    assert cfg.env.context.endswith(":LastTurn")
    with pytest.raises(ConfigError, match="env.context: .*not a ContextManager subclass"):
        load_config("default", "pipelines.yaml", parse_overrides(["env.context=agent_r1.context:first_sentence"]))
    with pytest.raises(ConfigError, match="env.context_kwargs: Summary takes no setting 'budgt'"):
        load_config("default", "pipelines.yaml", parse_overrides(["env.context=summary", "env.context_kwargs={budgt: 5}"]))


@pytest.fixture
def registries():
    """The estimators and losses a test registers are removed after it (as test_rl's fixture does)."""
    from agent_r1.algorithms import ADVANTAGES, POLICY_LOSSES

    before = set(ADVANTAGES), set(POLICY_LOSSES)
    yield
    for table, names in zip((ADVANTAGES, POLICY_LOSSES), before):
        for name in set(table) - names:
            del table[name]


def test_estimators_and_losses_are_chosen_by_import_path(tmp_path, registries):
    (tmp_path / "algos.py").write_text(
        "from agent_r1.algorithms import register_advantage, register_policy_loss, rloo, vanilla_pg_loss\n\n"
        "@register_advantage('my_rloo_by_path', needs_groups=True)\n"
        "def my_rloo(inp, *, scale: float = 1.0):\n    adv, ret = rloo(inp)\n    return adv * scale, ret\n\n"
        "@register_policy_loss('my_pg_by_path')\n"
        "def my_pg(logprobs, old_logprobs, advantages, mask, agg='token-mean'):\n"
        "    return vanilla_pg_loss(logprobs, old_logprobs, advantages, mask, agg=agg)\n\n"
        "def unregistered(inp):\n    return inp\n")
    path = tmp_path / "algos.py"
    cfg = load_config("default", "pipelines.yaml", parse_overrides(
        [f"rl.algorithm={path}:my_rloo", f"rl.learner.policy_loss={path}:my_pg", "rl.advantage_settings={scale: 2.0}"]))
    # the config holds the registered names: what the driver, the learner and the run names use
    assert cfg.rl.algorithm == "my_rloo_by_path" and cfg.rl.learner.policy_loss == "my_pg_by_path"
    assert cfg.rl.method == "my_rloo_by_path"
    with pytest.raises(ConfigError, match="rl.algorithm: .*'unregistered' is not registered; decorate it with @register_advantage"):
        load_config("default", "pipelines.yaml", parse_overrides([f"rl.algorithm={path}:unregistered"]))
    with pytest.raises(ConfigError, match="rl.advantage_settings: .*'scal'"):
        load_config("default", "pipelines.yaml", parse_overrides([f"rl.algorithm={path}:my_rloo", "rl.advantage_settings={scal: 2}"]))


def test_import_paths_in_a_config_file_are_relative_to_that_file(tmp_path, registries):
    (tmp_path / "plug").mkdir()
    (tmp_path / "plug" / "algos2.py").write_text(
        "from agent_r1.algorithms import register_advantage, rloo\n\n"
        "@register_advantage('rloo_from_a_file_beside_the_config', needs_groups=True)\n"
        "def mine(inp):\n    return rloo(inp)\n")
    (tmp_path / "plug" / "ctx2.py").write_text("from agent_r1.context import Summary\n\nclass Mine(Summary):\n    pass\n")
    (tmp_path / "plug" / "p.yaml").write_text(
        "pipelines:\n  mine:\n    extends: agent-r1:tiny\n    rl: {algorithm: algos2.py:mine}\n"
        "    env: {context: ctx2.py:Mine, context_kwargs: {budget: 64}}\n")
    cfg = load_config("mine", tmp_path / "plug" / "p.yaml")  # the working directory is the repository
    assert cfg.rl.algorithm == "rloo_from_a_file_beside_the_config"
    assert cfg.env.context == f"{tmp_path / 'plug' / 'ctx2.py'}:Mine"


def test_the_policy_itself_can_write_the_summary(tok, make_model, corpus, tasks):
    """summarize: policy — the model writes the summary greedily (the same weights give the same
    text), once per episode and summarised turn count, and training sees it as the policy did."""
    from agent_r1.context import PolicySummarizer
    from agent_r1.run import Agent, make_tools

    model = make_model(seed=3, std=0.3)
    model.train()
    writer = PolicySummarizer(model, tok, max_new_tokens=6)
    obs = [search_msg(("Louvre", "An art museum in Paris."))]
    text = writer(obs)
    assert text.startswith("Summary of earlier turns: ") and len(text) > len("Summary of earlier turns: ")
    assert writer(obs) == text and model.training  # greedy, and the model's mode is restored
    calls = []

    def counted(o):
        calls.append(len(o))
        return writer(o)

    search = make_search_tool(SearchIndex(corpus), top_k=2)
    engine = ScriptedEngine(tok, [f'<tool_call>{json.dumps({"name": "search", "arguments": {"query": q}})}</tool_call>'
                                  for q in ("Louvre", "Mona Lisa", "Danube")] + ["<answer>Paris</answer>"])
    (traj,) = run_episodes(engine, lambda: MultiHopQAEnv(search, system_prompt=None), [tasks[0]],
                           Summary(tok, budget=60, keep=1, summarize=counted), SamplingParams(max_new_tokens=64))
    assert calls == [1, 2]  # once per summarised turn count (steps 3 and 4), not per context_ids call
    summarised = [s for s in traj.steps if "Summary of earlier turns" in tok.decode(s.context_ids)]
    assert len(summarised) == 2
    assert [q.ids for q in to_sequences(traj)] == [s.context_ids + s.action_ids for s in traj.steps]
    # from a config: the agent builds the writer over its own model; without a model it is an error
    cfg = load_config("tiny", "pipelines.yaml", parse_overrides(["env.context=summary", "env.context_kwargs.summarize=policy"]))
    assert isinstance(Agent(model, tok, [search], cfg).context().summarize, PolicySummarizer)
    with pytest.raises(ValueError, match="'policy' needs a model"):
        Agent(None, tok, [search], cfg).context()
    with pytest.raises(ValueError, match="needs the policy"):
        Summary(tok, summarize="policy")
