"""Rollouts ahead of the learner (``rl.max_staleness``): the off-policy correction of the loss, the
rollout thread's staleness bound and its failure paths, and the driver running it end to end with
an engine that samples from its own copy of the policy (loaded from the folder each update writes,
as the vLLM server does). The real-server runs are in tests/test_vllm_async.py."""

from __future__ import annotations

import copy
import math
import shutil
import statistics
import tempfile
import threading
from pathlib import Path

import pytest
import torch

from agent_r1.config import ConfigError, RLConfig, load_config
from agent_r1.context import ContextManager
from agent_r1.learner import Learner, LearnerConfig
from agent_r1.learner.learner import off_policy_weights
from agent_r1.pipeline.ahead import RolloutsAhead
from agent_r1.pipeline.rl_driver import RLTrainer, build_train_batch
from agent_r1.rollout import EngineDied, HFEngine
from agent_r1.rollout.vllm_server import ROOT
from tests.machine_metrics import of_the_run
from tests.test_learner import batch_of, make_trajs
from tests.test_rl import TASKS, LetterEnv

# ------------------------------------------------------------------------------- the correction


def _batch(tok, shift: float):
    """A batch whose behaviour log-probs are ``shift`` below the proximal ones on every token."""
    b = batch_of(make_trajs(), tok.pad_token_id)
    b.advantages = torch.where(b.loss_mask.bool(), 1.0, 0.0)
    prox = torch.where(b.loss_mask.bool(), -1.0, 0.0)
    b.behaviour_logprobs = prox - shift
    return b, prox


@pytest.mark.parametrize("mode", ["tis", "decoupled", "none"])
def test_the_weight_is_pi_prox_over_pi_behav_truncated_or_zeroed_at_the_cap(tok, mode):
    cfg = LearnerConfig(off_policy_correction=mode, is_cap=2.0)
    act = _batch(tok, 0.0)[0].loss_mask.bool()
    for shift, w in ((math.log(1.5), 1.5), (math.log(4.0), 4.0)):  # under and over the cap
        b, prox = _batch(tok, shift)
        adv, metrics = off_policy_weights(prox, b, cfg)
        if mode == "none":
            assert adv is b.advantages and metrics == {}
        elif w < 2:
            assert torch.allclose(adv[act], torch.full_like(adv[act], w))
            assert metrics[f"is_{'truncated' if mode == 'tis' else 'masked'}_share"] == 0.0
        elif mode == "tis":  # truncated to the cap, every token still trained on
            assert torch.allclose(adv[act], torch.full_like(adv[act], 2.0))
            assert metrics["is_truncated_share"] == 1.0
        else:  # decoupled: tokens over the cap weigh 0 (and stay in the loss mask, the loss's denominator)
            assert not adv.any() and metrics["is_masked_share"] == 1.0 and metrics["is_weight_mean"] == 0.0
    b, prox = _batch(tok, math.log(1.5))
    b.behaviour_logprobs = None  # synchronous: no correction, whatever the mode
    assert off_policy_weights(prox, b, cfg)[0] is b.advantages
    if mode != "none":  # rl.loss_mask off: the observation tokens, never sampled, keep weight 1
        b, prox = _batch(tok, math.log(4.0))
        b.loss_mask = b.attention_mask.float()
        b.advantages = b.loss_mask.clone()
        obs = b.loss_mask.bool() & ~b.action_mask.bool()
        adv, _ = off_policy_weights(prox, b, cfg)
        assert obs.any() and torch.equal(adv[obs], b.advantages[obs])


def test_decoupled_gives_the_same_update_whatever_the_micro_batching(tok, make_model):
    """Some tokens of each row are sampled with a weight over the cap: the update through
    Learner.update() is the same with one micro-batch and with one row per micro-batch (the tokens
    weigh 0 and keep their place in the loss's denominator, which the accumulation weighs by)."""
    learner = Learner(make_model(seed=7), LearnerConfig(), precision="fp32")
    batch = build_train_batch(learner, make_trajs(seed=3, n=6), RLConfig(group_size=2), tok.pad_token_id)
    over = torch.rand(batch.loss_mask.shape, generator=torch.Generator().manual_seed(0)) < 0.4
    batch.behaviour_logprobs = learner.logprobs(batch) - torch.where(over, math.log(4.0), 0.0)
    results = []
    for budget in (10**6, 1):
        learner = Learner(make_model(seed=7), LearnerConfig(micro_batch_tokens=budget, lr=1e-3, is_cap=2.0,
                                                            off_policy_correction="decoupled"), precision="fp32")
        grads = {n: torch.zeros_like(p) for n, p in learner.model.named_parameters()}

        def keep(g, n):
            grads[n].add_(g)  # and return None: a returned tensor would replace the gradient

        hooks = [p.register_hook(lambda g, n=n: keep(g, n)) for n, p in learner.model.named_parameters()]
        before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
        stats = learner.update(copy.copy(batch))
        for h in hooks:
            h.remove()
        results.append((stats, grads, {n: p.detach() - before[n] for n, p in learner.model.named_parameters()}))
    (stats_a, grads_a, delta_a), (stats_b, grads_b, delta_b) = results
    assert 0.2 < stats_a["policy/is_masked_share"] < 0.6
    for n in grads_a:
        torch.testing.assert_close(grads_b[n], grads_a[n], rtol=1e-4, atol=1e-7)
        clear = grads_a[n].abs() > 1e-6  # AdamW's first step, where the gradient's sign is not rounding noise
        torch.testing.assert_close(delta_b[n][clear], delta_a[n][clear], rtol=1e-3, atol=1e-7)
    assert stats_b["policy/pg_loss"] == pytest.approx(stats_a["policy/pg_loss"], rel=1e-5)


def _update(make_model, tok, batch, correction: str) -> tuple[dict, dict]:
    learner = Learner(make_model(seed=0), LearnerConfig(lr=1e-2, off_policy_correction=correction), precision="fp32")
    stats = learner.update(batch)
    return stats, {k: v.detach().clone() for k, v in learner.model.state_dict().items()}


def test_the_update_weighs_each_tokens_surrogate_by_its_weight(tok, make_model):
    """Behaviour log-probs equal to the learner's own: w = 1, the same update as with no correction.
    Behaviour log-probs log 2 below: w = 2 (at the cap), a policy loss twice as large."""
    learner = Learner(make_model(seed=0), LearnerConfig(), precision="fp32")
    batch = build_train_batch(learner, make_trajs(), RLConfig(group_size=2), tok.pad_token_id)
    own = learner.logprobs(batch)
    plain_stats, plain = _update(make_model, tok, copy.copy(batch), "none")
    on_policy = copy.copy(batch)
    on_policy.behaviour_logprobs = own
    stats, weights = _update(make_model, tok, on_policy, "tis")
    assert all(torch.equal(plain[k], weights[k]) for k in plain)
    assert stats["policy/is_weight_mean"] == pytest.approx(1.0)
    twice = copy.copy(batch)
    twice.behaviour_logprobs = own - math.log(2.0)
    stats, _ = _update(make_model, tok, twice, "tis")
    assert stats["policy/is_weight_mean"] == pytest.approx(2.0, rel=1e-5)
    assert stats["policy/pg_loss"] == pytest.approx(2 * plain_stats["policy/pg_loss"], rel=1e-4)


# ------------------------------------------------------------------------------- the rollout thread


class Recorder:
    """An engine for the rollout thread alone: it records which weights it loaded, and when."""

    def __init__(self):
        self.loaded, self.events, self.aborted, self.restarts = [], [], 0, 0
        self.sampling = False

    def load_weights(self, path: Path) -> None:
        assert not self.sampling, "weights loaded during a batch"
        self.loaded.append(path)
        self.events.append(("load", path.name))

    def stats(self) -> dict:
        return {}

    def abort(self) -> None:
        self.aborted += 1

    def restart(self) -> None:
        self.restarts += 1


def _weights(version: int) -> Path:
    path = Path(tempfile.mkdtemp(prefix="agent-r1-test-weights.")) / f"v{version}"
    path.mkdir()
    return path


class Sampler:
    """``sample`` for the rollout thread that records, under a condition the test can wait on,
    which batches it has sampled: the test drives the thread step by step instead of timing it."""

    def __init__(self, engine: Recorder, gate: threading.Event | None = None):
        self.engine, self.gate, self.started, self.done = engine, gate, threading.Event(), []
        self.cond = threading.Condition()

    def __call__(self, j, g):
        self.started.set()
        self.engine.sampling = True
        if self.gate is not None:
            assert self.gate.wait(60), "the test never opened the gate"
        self.engine.events.append(("sample", j))
        self.engine.sampling = False
        with self.cond:
            self.done.append(j)
            self.cond.notify_all()
        return [], [{"j": j}]

    def wait_sampled(self, j: int) -> None:
        """Until batch ``j`` is sampled (the thread then needs newer weights to go on)."""
        with self.cond:
            assert self.cond.wait_for(lambda: j in self.done, timeout=60), f"batch {j} was never sampled"


@pytest.mark.parametrize("eta", [1, 2, 3])
def test_no_batch_is_sampled_more_than_eta_versions_behind_the_update_that_trains_on_it(eta):
    """Updates slower than rollouts: before each update hands its weights over, the thread has
    sampled every batch the weights it has allow, and waits."""
    engine, n = Recorder(), 8
    sample = Sampler(engine)
    ahead = RolloutsAhead(engine, sample, start=0, stop=n, max_staleness=eta, seed=0)
    versions, published = [], []
    try:
        for j in range(n):
            got = ahead.take(j)
            assert got.tasks == [{"j": j}] and 0 <= j - got.version <= eta
            versions.append(got.version)
            sample.wait_sampled(min(j + eta, n - 1))  # the update, slower than a rollout: the thread waits for weights
            published.append(_weights(j + 1))
            ahead.publish(published[-1], j + 1)
    finally:
        ahead.close()
    # the first η + 1 batches need no update; each later one waits for the update before it
    assert versions == [0] * eta + list(range(n - eta))
    assert [p.name for p in engine.loaded] == [f"v{v}" for v in range(1, n - eta)]
    assert not published[-1].parent.exists()  # handed over after the last batch, never loaded: deleted
    for path in engine.loaded:
        shutil.rmtree(path.parent)


def test_the_thread_takes_the_newest_weights_and_drops_older_ones_it_never_loaded():
    engine = Recorder()
    sample = Sampler(engine, gate=threading.Event())
    ahead = RolloutsAhead(engine, sample, start=0, stop=3, max_staleness=1, seed=0)
    try:
        older, newer = _weights(1), _weights(2)
        assert sample.started.wait(60)  # the thread samples batch 0 (with the start weights)
        ahead.publish(older, 1)
        ahead.publish(newer, 2)
        assert not older.parent.exists()
        sample.gate.set()
        assert [ahead.take(j).version for j in range(3)] == [0, 2, 2]
        assert engine.loaded == [newer]
    finally:
        ahead.close()
        shutil.rmtree(newer.parent, ignore_errors=True)


def test_a_sample_that_raises_reaches_the_main_thread_and_close_stops_a_waiting_thread():
    """close() gives up on the thread after 60 s: a thread still alive after it did not stop."""
    def broken(j, g):
        raise ValueError("the environment is broken")

    ahead = RolloutsAhead(Recorder(), broken, start=0, stop=4, max_staleness=1, seed=0)
    with pytest.raises(RuntimeError, match="failed: ValueError.*broken"):
        ahead.take(0)
    ahead.close()
    ahead = RolloutsAhead(Recorder(), lambda j, g: ([], []), start=0, stop=10, max_staleness=1, seed=0)
    ahead.take(0)
    ahead.close()  # the thread waits for weights that never come
    assert not ahead._thread.is_alive()
    engine, aborted = Recorder(), threading.Event()
    engine.abort = aborted.set

    def in_flight(j, g):  # a batch whose requests end only when aborted
        if aborted.wait(120):
            raise EngineDied("aborted")
        return [], []

    ahead = RolloutsAhead(engine, in_flight, start=0, stop=10, max_staleness=1, seed=0)
    ahead.close()
    assert not ahead._thread.is_alive() and engine.restarts == 0


def test_a_dead_engine_is_restarted_once_and_the_batch_sampled_again_from_the_same_seeds():
    engine, draws = Recorder(), []

    def sample(j, g):
        draws.append(int(torch.randint(2**31, (1,), generator=g)))
        if len(draws) == 1:
            raise EngineDied("connection refused")
        return [], []

    ahead = RolloutsAhead(engine, sample, start=0, stop=1, max_staleness=1, seed=7)
    try:
        ahead.take(0)
    finally:
        ahead.close()
    assert engine.restarts == 1 and len(draws) == 2 and draws[0] == draws[1]


# ------------------------------------------------------------------------------- the driver


class CopyEngine(HFEngine):
    """An HF engine on a copy of the policy, given new weights only through the folder an update
    writes (as a vLLM server is): what the rollout thread needs of an engine, without a server."""

    def __init__(self, model, tok):
        super().__init__(copy.deepcopy(model), tok, precision="fp32")
        self.loaded = 0

    def new_weights_path(self) -> Path:
        return Path(tempfile.mkdtemp(prefix="agent-r1-test-weights.")) / "model"

    def load_weights(self, path: Path) -> None:
        from transformers import AutoModelForCausalLM

        self.model.load_state_dict(AutoModelForCausalLM.from_pretrained(str(path)).state_dict())
        shutil.rmtree(path.parent)
        self.loaded += 1

    def abort(self) -> None:
        pass


def test_grpo_ahead_of_the_learner_learns_within_the_staleness_bound(tok, make_model):
    """η = 1 on the letter task (test_rl's GRPO run): every update trains on the batch sampled
    beside the previous update, one version behind, weighed by truncated IS; the reward rises."""
    learner = Learner(make_model(seed=0), LearnerConfig(lr=2e-2), precision="fp32")
    engine = CopyEngine(learner.model, tok)
    cfg = RLConfig(algorithm="grpo", group_size=8, tasks_per_iteration=2, iterations=25, max_staleness=1)
    trainer = RLTrainer(learner, engine, LetterEnv, TASKS, ContextManager(tok), cfg, max_new_tokens=6,
                        max_context_tokens=256, seed=0)
    try:
        trainer.run()
    finally:
        trainer.close()
    h = trainer.history
    # batches 0 and 1 come from the start policy, batch j ≥ 2 from the weights of update j - 1
    assert [x["rollout/staleness_max"] for x in h] == [0] + [1] * 24 and engine.loaded == 23
    assert all(0.5 < x["policy/is_weight_mean"] < 2 for x in h)
    rewards = [x["reward_mean"] for x in h]
    assert statistics.fmean(rewards[-3:]) > statistics.fmean(rewards[:3]) + 0.25, rewards


def test_at_eta_0_nothing_runs_ahead_and_nothing_is_corrected(tok, make_model):
    """η = 0 is the synchronous loop: no thread, staleness 0, and the same metrics whatever the
    correction (none is applied). Measured besides: the tiny pipeline's metrics at η = 0 are the
    ones the code before rl.max_staleness gave, with the hf and the vLLM engine (docs/results.md)."""
    runs = {}
    for mode in ("tis", "decoupled", "none"):
        learner = Learner(make_model(seed=0), LearnerConfig(mini_batches=2, off_policy_correction=mode), precision="fp32")
        trainer = RLTrainer(learner, HFEngine(learner.model, tok, precision="fp32"), LetterEnv, TASKS,
                            ContextManager(tok), RLConfig(group_size=4, tasks_per_iteration=2, iterations=2),
                            max_new_tokens=4, seed=0)
        trainer.run()
        assert trainer._ahead is None
        runs[mode] = [of_the_run(h) for h in trainer.history]
    assert runs["tis"] == runs["decoupled"] == runs["none"]
    assert all(h["rollout/staleness_max"] == 0 and not any(k.startswith("policy/is_") for k in h) for h in runs["tis"])


def test_the_config_refuses_what_cannot_run_ahead():
    with pytest.raises(ConfigError, match="rl.max_staleness: rollouts ahead of the learner need rollout.engine: vllm"):
        load_config("tiny", ROOT / "pipelines.yaml", {"rl": {"max_staleness": 1}})
    with pytest.raises(ConfigError, match="rl.rollout_shards"):
        load_config("tiny", ROOT / "pipelines.yaml",
                    {"rl": {"max_staleness": 1, "rollout_shards": 2}, "rollout": {"engine": "vllm"}})
    summary = {"context": "summary", "context_kwargs": {"summarize": "policy"}}
    with pytest.raises(ConfigError, match=r"env.context_kwargs.summarize: 'policy' .*rl.max_staleness ≥ 1\)"):
        load_config("tiny", ROOT / "pipelines.yaml",
                    {"rl": {"max_staleness": 1}, "rollout": {"engine": "vllm"}, "env": summary})
    assert load_config("tiny", ROOT / "pipelines.yaml", {"rl": {"max_staleness": 2}, "rollout": {"engine": "vllm"}})
    assert load_config("tiny", ROOT / "pipelines.yaml", {"env": summary})  # synchronous: the policy writes them
