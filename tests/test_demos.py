"""Demonstrations inside RL (agent_r1.algorithms.demos): prefixed episodes give a task that every
sampled episode fails a gradient, with the prefix masked; LUFFY's member is part of its group and
its tokens get the shaped weight; ReLIFT routes failed groups' demonstrations to an SFT buffer and
interleaves SFT steps at the configured ratio."""

from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from agent_r1.algorithms import ppo_clip_loss, with_demonstrated_tokens
from agent_r1.algorithms.demos import MEMBER, PREFIX, failed_tasks
from agent_r1.config import ConfigError, RLConfig, load_config, parse_overrides
from agent_r1.context import ContextManager
from agent_r1.envs import ToolEnv
from agent_r1.learner import Learner, LearnerConfig
from agent_r1.pipeline.rl_driver import RLTrainer, build_train_batch, end_iteration, sample_episodes, update_policy
from agent_r1.rollout import HFEngine
from agent_r1.trajectory import Step, Trajectory

TARGET = "Paris museum"


class TargetEnv(ToolEnv):
    """One turn, no tools: reward 1 when the turn contains ``TARGET`` (a random tiny model never
    writes it); the oracle writes it."""

    def __init__(self):
        super().__init__([], max_turns=1)

    def final_reward(self, answer, action_text):
        return float(TARGET in action_text), {}

    def oracle_turns(self, task):
        return [TARGET]


TASKS = [{"id": "a", "prompt": "go"}, {"id": "b", "prompt": "write"}]


def _trainer(tok, make_model, cfg: RLConfig, demo_pool: set[str] | None = None) -> RLTrainer:
    learner = Learner(make_model(seed=0), LearnerConfig(lr=1e-2), precision="fp32")
    return RLTrainer(learner, HFEngine(learner.model, tok, precision="fp32"), TargetEnv, TASKS, ContextManager(tok), cfg,
                     max_new_tokens=4, max_context_tokens=256, seed=0, demo_pool=demo_pool)


def _weights(trainer) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in trainer.learner.model.parameters()])


def _iteration(trainer):
    trajs = sample_episodes(trainer)
    batch = build_train_batch(trainer.learner, trajs, trainer.cfg, trainer.tokenizer.pad_token_id)
    before = _weights(trainer)
    stats = update_policy(trainer, batch)
    moved = not torch.equal(before, _weights(trainer))
    return trajs, batch, end_iteration(trainer, trajs, stats), moved


# ---------------------------------------------------------------- prefix (R³ / BREAD)
def test_prefixed_episodes_give_a_failed_group_a_gradient_with_the_prefix_masked(tok, make_model):
    plain = _trainer(tok, make_model, RLConfig(group_size=2, tasks_per_iteration=2))
    trajs, batch, stats, moved = _iteration(plain)
    assert [t.final_reward for t in trajs] == [0.0] * 4  # every sampled episode fails: no signal
    assert stats["update/live_share"] == 0 and not moved

    trainer = _trainer(tok, make_model, RLConfig(group_size=2, tasks_per_iteration=2, demos="prefix",
                                                 demo_settings={"episodes": 2}))
    demo_ids = tok.encode(TARGET, add_special_tokens=False) + [tok.eos_token_id]
    k0 = len(demo_ids) - 1  # a one-step demonstration: k counts its tokens, from all but the last
    trajs, batch, stats, moved = _iteration(trainer)
    own = [t for t in trajs if not t.demo]
    prefixed = [t for t in trajs if t.demo == PREFIX]
    assert [t.final_reward for t in own] == [0.0] * 4  # the same sampled episodes, all failed
    assert len(prefixed) == 4 and {t.demo_prefix for t in prefixed} == {k0}
    assert sorted(t.group_id for t in prefixed) == [0, 0, 1, 1]  # they join their task's group
    assert all(t.final_reward == 1.0 for t in prefixed)  # the demonstration's start carries them to the target
    for t in prefixed:  # the prefix is the end of the context the policy saw, and not in its action
        (step,) = t.steps
        assert step.context_ids[-k0:] == demo_ids[:k0]
        assert len(step.action_ids) == len(step.action_logprobs) <= 4 and t.num_action_tokens == len(step.action_ids)
    rows = [i for i, e in enumerate(batch.episode_ids.tolist()) if trajs[e].demo == PREFIX]
    for r in rows:
        ids, loss = batch.input_ids[r].tolist(), batch.loss_mask[r]
        start = next(i for i in range(len(ids)) if ids[i:i + k0] == demo_ids[:k0])
        assert loss[start:start + k0].eq(0).all()  # the prefix is context: no loss
        assert (batch.advantages[r][loss.bool()] > 0).all()  # the prefixed successes are pushed up
    assert (batch.advantages[[i for i in range(len(batch)) if i not in rows]][batch.loss_mask[
        [i for i in range(len(batch)) if i not in rows]].bool()] < 0).all()  # the failures down
    assert stats["update/live_share"] == 1 and moved  # a non-zero gradient for the failed tasks
    # the rollout's reward is the policy's own episodes; the prefixed ones are logged apart
    assert stats["reward_mean"] == 0.0 and stats["demos/prefix_episodes"] == 4 and stats["demos/prefix_success"] == 1
    # k shrinks for the tasks whose prefixed episodes succeeded; it is logged and in the resumable state
    assert trainer.demos.state() == {"k": {"a": k0 // 2, "b": k0 // 2}}
    assert stats["demos/prefix_k/a"] == k0 // 2 and stats["demos/prefix_k_mean"] == k0
    assert stats["time/demos_rollout_s"] > 0 and "time/demos_build_s" in stats
    resumed = _trainer(tok, make_model, RLConfig(demos="prefix"))
    resumed.demos.load(trainer.demos.state())
    assert resumed.demos.start_k("a") == k0 // 2


def test_tasks_without_ids_get_the_prefix_of_their_own_demonstration(tok, make_model):
    """Tasks without an ``id`` are named by their index in the trainer's tasks (the episodes were
    named by their index among the group members, and the demonstrations by the iteration's)."""
    learner = Learner(make_model(seed=0), LearnerConfig(lr=1e-2), precision="fp32")
    tasks = [{"prompt": "go"}, {"prompt": "write"}]
    trainer = RLTrainer(learner, HFEngine(learner.model, tok, precision="fp32"), TargetEnv, tasks,
                        ContextManager(tok), RLConfig(group_size=2, tasks_per_iteration=2, demos="prefix",
                                                      demo_settings={"episodes": 2}), max_new_tokens=4, seed=0)
    trajs = sample_episodes(trainer)
    assert [t["id"] for t in trainer.tasks] == ["0", "1"] and "id" not in tasks[0]  # the caller's dicts are left as they were
    prefixed = [t for t in trajs if t.demo == PREFIX]
    assert len(prefixed) == 4 and all(t.final_reward == 1.0 for t in prefixed)
    for t in trajs:  # every episode, own or prefixed, is of its group's task
        assert t.task_id == trainer.batch_tasks[t.group_id]["id"]


def test_k_goes_down_to_zero_and_then_the_task_gets_no_prefix():
    demo = Trajectory("a", 0, steps=[Step([1], [5, 6], [0.0, 0.0]), Step([1, 5, 6, 9], [7, 8], [0.0, 0.0])])
    from agent_r1.algorithms.demos import PrefixMethod

    m = PrefixMethod(lambda task: demo, episodes=1)
    assert m.units(demo) == 2 and m.start_k("a") == 1  # several steps: k counts steps
    assert m.prefix(demo, 1).turns == [([5, 6], "")] and m.prefix(demo, 1).tokens == []
    failed = [Trajectory("a", 0, steps=[Step([1], [3], [-1.0])], final_reward=0.0, stop_reason="answer")]
    won = Trajectory("a", 0, steps=[Step([1], [3], [-1.0])], final_reward=1.0, demo=PREFIX, demo_prefix=1)
    m.after_iteration(failed + [won])
    assert m.k == {"a": 0}
    assert m.episodes(failed, rollout=None) == []  # k = 0: the task is on its own (no rollout asked for)
    assert failed_tasks(failed + [won], 1.0) == {0: "a"}  # a prefixed success is not the group's own


def test_k_in_tokens_of_the_first_action_and_shared_by_a_task_field():
    """``unit: tokens`` prefixes part of a multi-step demonstration's first action (the rest is the
    policy's); ``share_by`` gives the tasks of one kind one k, capped at each task's own length."""
    from agent_r1.algorithms.demos import PrefixMethod

    demos = {"a": Trajectory("a", 0, steps=[Step([1], [5, 6, 7, 8], [0.0] * 4), Step([1, 5, 6, 7, 8, 9], [2], [0.0])]),
             "b": Trajectory("b", 0, steps=[Step([1], [5, 6], [0.0] * 2), Step([1, 5, 6, 9], [2], [0.0])]),
             "c": Trajectory("c", 0, steps=[Step([1], [4, 4, 4, 4, 4], [0.0] * 5)])}
    m = PrefixMethod(demos.get, episodes=1, unit="tokens", share_by="kind")
    m.bind({"a": {"kind": "x"}, "b": {"kind": "x"}, "c": {"kind": "y"}})
    assert [m.start_k(t) for t in "abc"] == [3, 1, 4]  # all but the last token of the first action
    assert m.prefix(demos["a"], 3).tokens == [5, 6, 7] and m.prefix(demos["a"], 3).turns == []

    def prefixed(task, k, reward):
        return Trajectory(task, 0, steps=[Step([1], [3], [-1.0])], final_reward=reward, demo=PREFIX, demo_prefix=k)

    stats = m.after_iteration([prefixed("a", 3, 1.0), prefixed("b", 1, 0.0), prefixed("c", 4, 0.0)])
    assert m.k == {"x": 1, "y": 4}  # kind x: a success at its largest k (3) halves it; y failed: kept
    assert stats["demos/prefix_k/x"] == 1 and stats["demos/prefix_tasks_done"] == 0
    assert [m.start_k(t) for t in "abc"] == [1, 1, 4]  # b's success-less k moved with a's
    m.after_iteration([prefixed("b", 1, 1.0)])
    assert m.k["x"] == 0 and m.start_k("a") == 0  # one k for the kind: a is done too
    with pytest.raises(ValueError, match="share_by='kind': 1 task\\(s\\) have no such field, e.g. 'd'"):
        PrefixMethod(demos.get, share_by="kind").bind({"a": {"kind": "x"}, "d": {"id": "d"}})
    auto = PrefixMethod(demos.get)
    assert auto.start_k("a") == 1 and auto.prefix(demos["a"], 1).turns == [([5, 6, 7, 8], "")]  # steps, as before


def test_the_trainer_gives_the_method_its_tasks_fields(tok, make_model):
    with pytest.raises(ValueError, match="share_by='kind': 2 task\\(s\\) have no such field, e.g. 'a' \\(its fields: \\['id', 'prompt'\\]\\)"):
        _trainer(tok, make_model, RLConfig(demos="prefix", demo_settings={"share_by": "kind"}))
    trainer = _trainer(tok, make_model, RLConfig(demos="prefix", demo_settings={"share_by": "prompt"}))
    assert trainer.demos.keys == {"a": "go", "b": "write"}


# ---------------------------------------------------------------- member (LUFFY)
def _ep(group, final, ids=(30,), demo=""):
    return Trajectory(f"t{group}", group, steps=[Step([11, 12], list(ids), [-0.5] * len(ids))], final_reward=final,
                      stop_reason="answer", demo=demo)


def test_the_member_is_advantaged_with_its_group_and_its_tokens_are_demonstrated():
    learner = SimpleNamespace(critic=None, single_step=True, reference=None)
    trajs = [_ep(0, 0.0), _ep(0, 0.0), _ep(0, 0.0), _ep(0, 1.0, ids=(40, 41), demo=MEMBER), _ep(1, 1.0), _ep(1, 0.0)]
    batch = build_train_batch(learner, trajs, RLConfig(), 0)
    scores = torch.tensor([0.0, 0.0, 0.0, 1.0])  # GRPO over the group with the demonstration in it
    z = (scores - scores.mean()) / (scores.std() + 1e-6)
    assert_close(batch.advantages[:4].sum(1) / batch.loss_mask[:4].sum(1), z, atol=1e-4, rtol=0)
    assert batch.advantages[3][batch.loss_mask[3].bool()].gt(0).all()
    # its two tokens: in the loss, demonstrated, never counted as sampled
    assert batch.demo_mask[3].tolist()[2:4] == [1, 1] and batch.demo_mask.sum() == 2
    assert batch.loss_mask[3, 2:4].tolist() == [1, 1] and batch.action_mask[3].sum() == 0
    assert batch.action_mask.sum() == 5  # the five sampled tokens of the others
    # group 1 is untouched by group 0's member
    assert_close(batch.advantages[4:].sum(1), torch.tensor([0.7071, -0.7071]), atol=1e-4, rtol=0)


def test_demonstrated_tokens_get_luffys_shaped_weight_and_sampled_ones_ppo():
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.05], [0.3, 0.6, 0.9]])).requires_grad_()
    old = logp.detach() - 0.1  # the sampled row's ratio is 1.105: within PPO's clip
    adv = torch.tensor([[2.0, 2.0, 2.0], [-1.0, -1.0, -1.0]])
    mask = torch.ones(2, 3)
    demo = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    gamma = 0.1
    loss, metrics = with_demonstrated_tokens(ppo_clip_loss, logp, old, adv, mask, demo, gamma, agg="token-mean",
                                             clip_low=0.2, clip_high=0.2, dual_clip=None)
    loss.backward()
    pi = logp.detach().exp()
    # d/dlogp of -A*pi/(pi+gamma), over the 6 loss tokens: -A * gamma*pi/(pi+gamma)^2 / 6, no clip
    assert_close(logp.grad[0], -adv[0] * gamma * pi[0] / (pi[0] + gamma) ** 2 / 6)
    # the sampled row: PPO's -A * ratio / 6
    assert_close(logp.grad[1], -adv[1] * torch.exp(logp.detach()[1] - old[1]) / 6)
    assert metrics["demo_prob"] == pytest.approx(pi[0].mean().item())
    # a ratio far outside the clip still trains a demonstrated token (no clip for them)
    far = torch.log(torch.tensor([[0.9]])).requires_grad_()
    with_demonstrated_tokens(ppo_clip_loss, far, far.detach() - 5, torch.ones(1, 1), torch.ones(1, 1), torch.ones(1, 1),
                             gamma, clip_low=0.2, clip_high=0.2)[0].backward()
    assert far.grad.abs().item() == pytest.approx(gamma * 0.9 / (0.9 + gamma) ** 2)


def test_the_member_trains_through_the_learner(tok, make_model):
    trainer = _trainer(tok, make_model, RLConfig(group_size=2, tasks_per_iteration=2, demos="member"))
    trajs, batch, stats, moved = _iteration(trainer)
    assert sum(t.demo == MEMBER for t in trajs) == 2 and stats["demos/members"] == 2
    assert stats["demos/member_reward"] == 1.0  # the oracle's turn, scored by the environment
    assert "policy/demo_prob" in stats and moved and stats["reward_mean"] == 0.0


# ---------------------------------------------------------------- routing (ReLIFT)
def test_failed_groups_go_to_the_sft_buffer_and_sft_steps_interleave_at_the_ratio(tok, make_model):
    trainer = _trainer(tok, make_model, RLConfig(group_size=2, tasks_per_iteration=1, demos="relift",
                                                 demo_settings={"sft_every": 2, "batch_size": 1}))
    seen = []
    for _ in range(4):
        trajs, _, stats, moved = _iteration(trainer)
        assert all(t.final_reward == 0.0 and not t.demo for t in trajs)  # no demonstration in the rollout
        seen.append((trajs[0].task_id, stats["demos/routed"], stats["demos/sft_steps"], stats["demos/buffer"]))
    # iteration 1: the failed task routed; 2: an SFT step on it (every 2nd update), one demonstration at a time
    assert [s[2] for s in seen] == [0, 1, 0, 1]
    assert seen[0][1] == 1 and seen[0][3] == 1
    buffer = []
    for task, routed, steps, size in seen:  # the buffer: routed tasks in, once each; SFT steps take the oldest out
        buffer = buffer[steps:]
        buffer += [task] if routed else []
        assert size == len(buffer)
    assert trainer.demos.state() == {"buffer": buffer}
    assert stats["time/demos_sft_s"] > 0 and stats["demos/sft_loss"] > 0


# ---------------------------------------------------------------- the pool (rl.demo_pool)
@pytest.mark.parametrize("name", ["prefix", "member", "relift"])
def test_a_task_outside_the_pool_gets_no_demonstration_and_is_counted(tok, make_model, name):
    cfg = RLConfig(group_size=2, tasks_per_iteration=2, demos=name)
    demonstrated = {}
    for pool in ({"a"}, None):  # only a's demonstration (as SFT's, when b's type is scarce); every task's
        trajs, _, stats, _ = _iteration(_trainer(tok, make_model, cfg, demo_pool=pool))
        assert {t.task_id for t in trajs if not t.demo} == {"a", "b"}
        demonstrated[frozenset(pool or ())] = stats["demos/no_demo_share"], {t.task_id for t in trajs if t.demo}, stats
    (share, tasks, stats), (share_all, tasks_all, stats_all) = demonstrated[frozenset({"a"})], demonstrated[frozenset()]
    assert share == 0.5 and share_all == 0.0  # b: one of the iteration's two tasks
    if name == "relift":  # both groups failed; only a's demonstration goes to the buffer
        assert stats["demos/routed"] == 1 and stats_all["demos/routed"] == 2
    else:  # prefixed episodes / the member: a's only
        assert tasks == {"a"} and tasks_all == {"a", "b"}


def test_the_sft_pool_is_the_tasks_sft_trained_on_in_a_scarce_setting(tmp_path):
    from agent_r1.algorithms import make_demo_method
    from agent_r1.run import demo_pool, oracle_demonstrations, tasks_for
    from agent_r1.sft import demonstration
    from tests.test_run import _demo_setup

    small = ["data.n_films=16", "data.n_directors=6", "data.n_studios=3", "sft.worlds=0", "sft.scarce={director_spouse: 3}",
             "rl.hops=[]", "rl.qtypes=[director_spouse]", "rl.demos=member"]
    cfg, agent, tok, train = _demo_setup(tmp_path, small)
    sft_ids = {d.task_id for d in oracle_demonstrations(cfg, agent, agent.context(), train)}
    pool = demo_pool(cfg, train)
    assert pool == sft_ids  # exactly SFT's (and the control's) demonstrations
    rl_tasks = tasks_for(train, cfg.rl.hops, seed=cfg.seed, qtypes=cfg.rl.qtypes)
    assert len([t for t in rl_tasks if t["id"] in pool]) == 3 < len(rl_tasks)  # the scarce type: 3 demonstrated
    by_id = {t["id"]: t for t in rl_tasks}
    groups = [Trajectory(t["id"], g, steps=[Step([1], [2], [0.0])], final_reward=0.0) for g, t in enumerate(rl_tasks)]
    for p in (pool, demo_pool(cfg.model_copy(update={"rl": cfg.rl.model_copy(update={"demo_pool": "all"})}), train)):
        member = make_demo_method("member", lambda i: demonstration(agent.make_env(), by_id[i], agent.context()), {}, p)
        members = member.episodes(groups, rollout=None)
        share = member.after_iteration(groups + members)["demos/no_demo_share"]
        if p is not None:  # sft: the three scarce tasks SFT saw get their member, the others none
            assert {m.task_id for m in members} == pool & set(by_id) and share == 1 - 3 / len(rl_tasks)
        else:  # all: every RL task's
            assert len(members) == len(rl_tasks) and share == 0.0


def test_bad_demo_settings_are_named():
    with pytest.raises(ConfigError, match="rl.demos: unknown demonstration method 'luffy'; known: member, prefix, relift"):
        load_config("code-tiny", "pipelines.yaml", parse_overrides(["rl.demos=luffy"]))
    with pytest.raises(ConfigError, match=r"rl.demo_settings: demonstration method 'relift' has no setting\(s\) \['k'\]"):
        load_config("code-tiny", "pipelines.yaml", parse_overrides(["rl.demos=relift", "rl.demo_settings={k: 1}"]))
    with pytest.raises(ConfigError, match="prefix needs episodes >= 1, 0 <= shrink < 1 and unit auto or tokens, .*unit='steps'"):
        load_config("code-tiny", "pipelines.yaml", parse_overrides(["rl.demos=prefix", "rl.demo_settings={unit: steps}"]))
    with pytest.raises(ConfigError, match="shrink=1.5"):
        load_config("code-tiny", "pipelines.yaml", parse_overrides(["methods=[grpo+prefix]", "rl.demo_settings={shrink: 1.5}"]))
    with pytest.raises(ConfigError, match="rl.demos: prefix .* rl.algorithm rft"):
        load_config("code-tiny", "pipelines.yaml", parse_overrides(["rl.demos=prefix", "rl.algorithm=rft"]))
    cfg = load_config("code-tiny", "pipelines.yaml", parse_overrides(["methods=[grpo, grpo+member]"]))
    assert cfg.methods == ["grpo", "grpo+member"]
    with pytest.raises(ConfigError, match="methods: grpo\\+lufy: unknown demonstration method 'lufy'"):
        load_config("code-tiny", "pipelines.yaml", parse_overrides(["methods=[grpo+lufy]"]))
    # an import path stands for the name its class was registered under
    cfg = load_config("code-tiny", "pipelines.yaml", parse_overrides(["rl.demos=agent_r1.algorithms.demos:ReliftMethod"]))
    assert cfg.rl.demos == "relift" and cfg.rl.method == "grpo+relift"
    with pytest.raises(ConfigError, match="'DemoMethod' is not registered"):
        load_config("code-tiny", "pipelines.yaml", parse_overrides(["rl.demos=agent_r1.algorithms.demos:DemoMethod"]))
    with pytest.raises(ConfigError, match="rl.demo_pool: Input should be 'sft' or 'all'"):
        load_config("code-tiny", "pipelines.yaml", parse_overrides(["rl.demos=member", "rl.demo_pool=every"]))
    with pytest.raises(ConfigError, match="rl.demo_pool: sft with sft.worlds=2: .* none is of an RL task"):
        load_config("tiny", "pipelines.yaml", parse_overrides(["methods=[grpo, grpo+member]", "sft.worlds=2"]))
    assert load_config("tiny", "pipelines.yaml", parse_overrides(["rl.demos=member", "sft.worlds=2",
                                                                  "rl.demo_pool=all"])).rl.demo_pool == "all"


class TwoTurnEnv(TargetEnv):
    def __init__(self):
        ToolEnv.__init__(self, [], max_turns=2)


def test_a_prefix_of_demonstrated_turns_is_played_then_the_policy_takes_over(tok, make_model):
    from agent_r1.rollout import Prefix, SamplingParams, run_episodes

    model = make_model(seed=0)
    ids = tok.encode("Louvre", add_special_tokens=False) + [tok.eos_token_id]
    ctx = ContextManager(tok)
    (plain,), (prefixed,) = (run_episodes(HFEngine(model, tok, precision="fp32"), TwoTurnEnv, [TASKS[0]], ctx,
                                          SamplingParams(1.0, max_new_tokens=4), prefixes=p)
                             for p in (None, [Prefix(turns=[(ids, "Louvre")])]))
    assert len(plain.steps) == 2 and plain.metrics["turns"] == 2
    (step,) = prefixed.steps  # the demonstrated turn is context, not a step: one sampled turn is left
    assert prefixed.metrics["turns"] == 2 and prefixed.stop_reason == "max_turns"
    start = len(plain.steps[0].context_ids)  # the prompt, then the demonstrated turn and its observation
    assert step.context_ids[:start] == plain.steps[0].context_ids and step.context_ids[start:start + len(ids)] == ids


def test_the_prefix_k_and_the_sft_buffer_resume(tok, make_model, tmp_path):
    from agent_r1.pipeline.rl_driver import RLFiles

    for name in ("prefix", "relift"):
        files = RLFiles(tmp_path / name / "agent", tmp_path / name / "history.json", tmp_path / name / "state",
                        tmp_path / name / "rollouts", "fp")
        cfg = RLConfig(group_size=2, tasks_per_iteration=1, checkpoint_every=1, iterations=3, demos=name)

        def trainer():
            learner = Learner(make_model(seed=0), LearnerConfig(), precision="fp32")
            return RLTrainer(learner, HFEngine(learner.model, tok, precision="fp32"), TargetEnv, TASKS,
                             ContextManager(tok), cfg, max_new_tokens=4, max_context_tokens=256, seed=0, files=files)

        first = trainer()
        first.step()  # the state is saved after iteration 1
        saved = first.demos.state()
        assert saved and all(saved.values())  # a k for the task prefixed / its demonstration in the buffer
        resumed = trainer()
        assert resumed.iteration == 1 and resumed.demos.state() == saved
