"""RL end to end through the driver that ships (:class:`agent_r1.pipeline.rl_driver.RLTrainer`):
process rewards reach the advantages, a short run of GRPO learns a tiny task, GAE trains a
critic, and an estimator registered here (nowhere in the library) runs an iteration."""

import statistics

import pytest
import torch

from agent_r1.algorithms import ADVANTAGES, POLICY_LOSSES, register_advantage, register_policy_loss, vanilla_pg_loss
from agent_r1.config import ConfigError, RLConfig, load_config, parse_overrides
from agent_r1.context import ContextManager
from agent_r1.envs import MultiHopQAEnv, ToolEnv
from agent_r1.learner import Learner, LearnerConfig, ValueModel
from agent_r1.pipeline.rl_driver import (RLTrainer, build_train_batch, end_iteration, sample_episodes,
                                         update_policy)
from agent_r1.rollout import HFEngine, SamplingParams, ScriptedEngine, run_episodes
from agent_r1.tools import SearchIndex, make_search_tool

# ------------------------------------------------------------------------------- process reward


def _search(query):
    return f'<tool_call>{{"name": "search", "arguments": {{"query": "{query}"}}}}</tool_call>'


@pytest.fixture(scope="module")
def searched_trajs(tok, frozen_learner, corpus, tasks):
    """Two episodes of the Mona Lisa task: one searches a gold document, one a distractor; both
    then give the same wrong answer. Returns a function of the retrieval bonus."""
    search = make_search_tool(SearchIndex(corpus), top_k=1)

    def ids(text):
        return tok.encode(text) + [tok.eos_token_id]

    def run(bonus):
        script = [[ids(_search("Mona Lisa")), ids(_search("Danube"))], [ids("<answer>London</answer>")] * 2]
        return run_episodes(
            ScriptedEngine(tok, script, model=frozen_learner.model),
            lambda: MultiHopQAEnv(search, retrieval_bonus=bonus),
            [tasks[0], tasks[0]],
            ContextManager(tok, tools=[search.schema]),
            SamplingParams(temperature=1.0, max_new_tokens=64),
            group_ids=[0, 0],
        )

    return run


@pytest.mark.parametrize("algorithm", ["grpo", "reinforce_pp"])
def test_retrieval_bonus_reaches_the_advantages(algorithm, searched_trajs, frozen_learner, tok):
    cfg = RLConfig(algorithm=algorithm, group_size=2)
    with_bonus, without = searched_trajs(0.5), searched_trajs(0.0)
    assert [s.reward for s in with_bonus[0].steps] == [0.5, 0.0]  # "Mona Lisa" is a gold title
    assert [s.reward for s in with_bonus[1].steps] == [0.0, 0.0]  # "Danube" is not
    assert [t.final_reward for t in with_bonus] == [0.0, 0.0]  # both answers wrong (well formed)
    assert with_bonus[0].metrics["found_gold"] == 1
    assert [s.reward for t in without for s in t.steps] == [0.0] * 4
    # the same turns, token for token, apart from the reward
    assert [s.action_ids for t in with_bonus for s in t.steps] == [s.action_ids for t in without for s in t.steps]

    b1 = build_train_batch(frozen_learner, with_bonus, cfg, tok.pad_token_id)
    b0 = build_train_batch(frozen_learner, without, cfg, tok.pad_token_id)
    assert torch.equal(b1.input_ids, b0.input_ids)
    # the step reward sits on the last token of the searching turn
    first_turn = (b1.step_ids[0] == 0).nonzero().max()
    assert b1.token_rewards[0, first_turn] == 0.5 and b1.token_rewards.sum() == 0.5
    assert b0.advantages.eq(0).all()  # equal scores: nothing to learn without the bonus
    assert not torch.allclose(b1.advantages, b0.advantages)
    act = b1.action_mask.bool()
    if algorithm == "grpo":  # the gold search makes the whole first episode better than the second
        assert (b1.advantages[0][act[0]] > 0).all() and (b1.advantages[1][act[1]] < 0).all()
    else:  # return-to-go: the searching turn is credited, the later answer turn is not
        steps, adv = b1.step_ids[0], b1.advantages[0]
        assert adv[steps == 0].min() > adv[steps == 1].max()


# ------------------------------------------------------------------------------- learning


class LetterEnv(ToolEnv):
    """Two turns, no tools; the final reward is the fraction of the letter "e" in everything the
    model wrote. A random model scores a few percent; a policy that learns scores up to 1."""

    def __init__(self):
        super().__init__([], max_turns=2)
        self.texts = []

    def step(self, action_text, context_tokens=None):
        self.texts.append(action_text)
        return super().step(action_text, context_tokens)

    def final_reward(self, answer, action_text):
        text = "".join(self.texts)
        return text.count("e") / max(len(text), 1), {}


TASKS = [{"id": "a", "prompt": "go"}, {"id": "b", "prompt": "write"}]


def _trainer(learner, tok, cfg: RLConfig) -> RLTrainer:
    engine = HFEngine(learner.model, tok, precision="fp32")  # the rollout shares the policy's weights
    return RLTrainer(learner, engine, LetterEnv, TASKS, ContextManager(tok), cfg, max_new_tokens=6,
                     max_context_tokens=256, seed=0)


@pytest.mark.slow
def test_grpo_raises_the_reward_of_a_tiny_task(tok, make_model):
    learner = Learner(make_model(seed=0), LearnerConfig(lr=2e-2), precision="fp32")
    trainer = _trainer(learner, tok, RLConfig(algorithm="grpo", group_size=8, tasks_per_iteration=2, iterations=25))
    assert trainer.run() is None  # no files to write: the agent stays in memory
    assert trainer.iteration == 25 and all(h["turns"] == 2 for h in trainer.history)
    rewards = [h["reward_mean"] for h in trainer.history]
    first, last = statistics.fmean(rewards[:3]), statistics.fmean(rewards[-3:])
    assert first < 0.15
    assert last > first + 0.25, rewards


@pytest.mark.slow
def test_one_gae_iteration_trains_policy_and_critic(tok, make_model):
    cfg = RLConfig(algorithm="gae", group_size=4)
    with pytest.raises(ValueError, match="'gae' needs a critic"):
        _trainer(Learner(make_model(seed=0), LearnerConfig(), precision="fp32"), tok, cfg)
    learner = Learner(
        make_model(seed=0), LearnerConfig(lr=1e-2, critic_lr=1e-2), critic=ValueModel(make_model(seed=0))
    , precision="fp32")
    trainer = _trainer(learner, tok, cfg)
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    trajs = sample_episodes(trainer)
    assert len(trajs) == 8 and min(t.total_reward for t in trajs) < max(t.total_reward for t in trajs)
    batch = build_train_batch(learner, trajs, cfg, tok.pad_token_id)
    stats = end_iteration(trainer, trajs, update_policy(trainer, batch))
    assert {"critic/loss", "policy/pg_loss"} <= stats.keys() and stats["critic/loss"] > 0
    assert stats["iteration"] == trainer.iteration == 1
    after = learner.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert learner.critic.module.head.weight.ne(0).any()  # zero-initialised head has learned


# ------------------------------------------------------------------------------- a new estimator

CALLS = []


@pytest.fixture
def centred_estimator():
    """An estimator and a policy loss registered by this test module alone: the estimator is
    ``scale * (score - group mean)``, the loss the vanilla one, recording its settings."""

    @register_policy_loss("test_vanilla", settings=("clip_low",))
    def loss(logprobs, old_logprobs, advantages, mask, agg, clip_low):
        CALLS.append(("loss", agg, clip_low))
        return vanilla_pg_loss(logprobs, old_logprobs, advantages, mask, agg)

    @register_advantage("test_centred", needs_groups=True, report_name="centred")
    def centred(inp, *, scale: float = 1.0):
        CALLS.append(("advantage", scale))
        m = inp.mask.bool()
        scores = torch.where(m, inp.token_rewards, 0).sum(-1)
        means = torch.stack([scores[inp.group_ids == g].mean() for g in inp.group_ids])
        adv = torch.where(m, scale * (scores - means)[:, None], 0)
        return adv, adv

    yield "test_centred"
    del ADVANTAGES["test_centred"], POLICY_LOSSES["test_vanilla"]


def test_a_registered_estimator_and_loss_need_no_edit_to_run(centred_estimator, tok, make_model, tmp_path):
    # the config knows it, its settings and what it needs, from its registry entry
    def cfg(*overrides):
        return load_config("tiny", "pipelines.yaml", parse_overrides([f"output_dir={tmp_path}", *overrides]))

    c = cfg("rl.algorithm=test_centred", "rl.advantage_settings={scale: 2.0}")
    assert c.rl.method == "centred" and c.rl.advantage_settings == {"scale": 2.0}
    with pytest.raises(ConfigError, match=r"'test_centred' has no setting\(s\) \['nope'\]; its settings: \['scale'\]"):
        cfg("rl.algorithm=test_centred", "rl.advantage_settings={nope: 1}")
    with pytest.raises(ConfigError, match="rl.group_size: estimator 'test_centred' .* needs group_size >= 2, got 1"):
        cfg("rl.algorithm=test_centred", "rl.group_size=1")

    # and the driver runs an iteration with it
    CALLS.clear()
    learner = Learner(make_model(seed=0), LearnerConfig(lr=1e-2, policy_loss="test_vanilla", clip_low=0.3), precision="fp32")
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    trainer = _trainer(learner, tok, c.rl.model_copy(update={"group_size": 4, "tasks_per_iteration": 2}))
    assert trainer.method == "centred" and learner.critic is None
    stats = trainer.step()
    assert CALLS[0] == ("advantage", 2.0) and set(CALLS[1:]) == {("loss", "token-mean", 0.3)}
    assert stats["iteration"] == 1 and "policy/pg_loss" in stats
    assert any(not torch.equal(before[k], v) for k, v in learner.model.state_dict().items())


# ------------------------------------------------------------------------------- paired methods


def test_the_methods_of_a_run_draw_the_same_tasks_whatever_their_updates_draw(tok, make_model):
    """As ``methods: [grpo, rft]`` trains them (one seed, one trainer after the other): GRPO's update
    draws the permutation of its two mini-batches of every row, RFT's SFT step on the kept rows draws
    nothing; in each of 3 iterations both sample the same tasks."""
    tasks = [{"id": str(i), "prompt": p} for i, p in enumerate(["go", "write", "say", "tell", "show", "give"])]
    drawn = {}
    for cfg in (RLConfig(algorithm="grpo", group_size=2, tasks_per_iteration=2),
                RLConfig(algorithm="rft", rft_threshold=0.05, group_size=2, tasks_per_iteration=2)):
        learner = Learner(make_model(seed=0), LearnerConfig(lr=1e-3, mini_batches=2), precision="fp32")
        trainer = RLTrainer(learner, HFEngine(learner.model, tok, precision="fp32"), LetterEnv, tasks,
                            ContextManager(tok), cfg, max_new_tokens=6, max_context_tokens=256, seed=0)
        drawn[trainer.method] = []
        for _ in range(3):
            stats = trainer.step()
            drawn[trainer.method].append([t["id"] for t in trainer.batch_tasks])
        assert stats["update/tokens"] > 0  # each trained on its own rows
    assert drawn["grpo"] == drawn["rft"], drawn
    assert len({tuple(ids) for ids in drawn["grpo"]}) > 1  # and the draws change from iteration to iteration
