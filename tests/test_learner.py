"""The DeepSpeed learner: masking of observations, updates under every ZeRO stage,
micro-batching invariance, checkpoints, and the critic path."""

import dataclasses
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agent_r1.algorithms import ADVANTAGES, AdvantageInputs, get_advantage, ppo_clip_loss
from agent_r1.config import RLConfig
from agent_r1.learner import Learner, LearnerConfig, ValueModel, token_logprobs
from agent_r1.models import default_device, load_model
from agent_r1.pipeline.rl_driver import build_train_batch
from agent_r1.trajectory import Step, Trajectory, collate, to_sequences


def make_trajs(seed: int = 0, n: int = 4, vocab: int = 290) -> list[Trajectory]:
    """Full-history multi-turn trajectories of random ids, two per group, varied lengths and rewards."""
    rng = random.Random(seed)

    def ids(k):
        return [rng.randrange(3, vocab) for _ in range(k)]

    trajs = []
    for i in range(n):
        ctx = ids(rng.randint(3, 6))
        steps = []
        for _ in range(rng.randint(2, 3)):
            action = ids(rng.randint(1, 4))
            logprobs = [-rng.uniform(0.5, 5) for _ in action]
            steps.append(Step(list(ctx), action, logprobs, reward=rng.choice([0.0, 0.5])))
            ctx = ctx + action + ids(rng.randint(2, 4))  # + the observation
        trajs.append(Trajectory(str(i), group_id=i // 2, steps=steps, final_reward=float(i % 2)))
    return trajs


def batch_of(trajs, pad_id, **kw):
    return collate([s for t in trajs for s in to_sequences(t)], pad_id, **kw)


def state(model) -> dict[str, torch.Tensor]:
    """A CPU copy of the weights (on a GPU machine the learner's live ones are on the GPU)."""
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def loaded_state(path) -> dict[str, torch.Tensor]:
    return state(AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32))


# ------------------------------------------------------------------------------- masking


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_every_advantage_is_exactly_zero_on_observation_tokens(name, tok):
    batch = batch_of(make_trajs(), tok.pad_token_id)
    obs = (batch.attention_mask == 1) & (batch.action_mask == 0)
    assert obs.any() and batch.action_mask.any()
    g = torch.Generator().manual_seed(0)
    adv, _ = get_advantage(name)(
        AdvantageInputs(
            token_rewards=batch.token_rewards,
            mask=batch.adv_mask,
            group_ids=batch.group_ids,
            values=torch.randn(batch.input_ids.shape, generator=g),
            step_ids=batch.step_ids,
        )
    )
    assert adv[batch.action_mask == 0].eq(0).all()
    assert adv[batch.action_mask == 1].ne(0).any()


class KeepLogits(torch.nn.Module):
    """Forwards to the model and keeps its logits (with their gradient) for inspection."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, **kw):
        out = self.model(**kw)
        if out.logits.requires_grad:
            out.logits.retain_grad()
        self.logits = out.logits
        return out


def test_observation_tokens_get_no_policy_gradient(tok, make_model):
    trajs = make_trajs(seed=1)
    model = KeepLogits(make_model(seed=2, std=0.3))

    def loss_of(batch, adv, old):
        logp = token_logprobs(model, batch.input_ids, batch.attention_mask)
        return ppo_clip_loss(logp, old, adv, batch.loss_mask)[0], logp

    batch = batch_of(trajs, tok.pad_token_id)
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(batch.input_ids.shape, generator=g)
    with torch.no_grad():
        old = token_logprobs(model, batch.input_ids, batch.attention_mask)
    old = old + 0.05 * torch.randn(old.shape, generator=g)  # ratios stay inside the clip range
    loss, _ = loss_of(batch, adv, old)
    loss.backward()
    # logits[t] predict token t+1: their gradient is zero exactly where token t+1 is not an action
    grad = model.logits.grad.abs().sum(-1)  # [B, T]
    predicts_action = torch.zeros_like(grad, dtype=torch.bool)
    predicts_action[:, :-1] = batch.action_mask[:, 1:].bool()
    assert grad[~predicts_action].eq(0).all()
    assert grad[predicts_action].gt(0).all()

    # perturbing an observation token's advantage or old log-prob leaves the loss unchanged ...
    obs = (batch.attention_mask == 1) & (batch.action_mask == 0)
    obs[:, 0] = False
    noise = torch.randn(adv.shape, generator=g) * obs
    with torch.no_grad():
        base = loss_of(batch, adv, old)[0]
        assert loss_of(batch, adv + 5 * noise, old)[0] == base
        assert loss_of(batch, adv, old + noise)[0] == base
        # ... while without the loss mask (the ablation) the same perturbation does change it
        wide = batch_of(trajs, tok.pad_token_id, loss_mask=False)
        assert loss_of(wide, adv + 5 * noise, old)[0] != loss_of(wide, adv, old)[0]


# ------------------------------------------------------------------------------- updates


def rl_batch(learner, tok, seed=0):
    batch = batch_of(make_trajs(seed), tok.pad_token_id)
    batch.old_logprobs = learner.logprobs(batch)
    g = torch.Generator().manual_seed(seed)
    batch.advantages = torch.randn(batch.input_ids.shape, generator=g) * batch.action_mask
    return batch


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_update_changes_the_policy_under_each_zero_stage(stage, tok, make_model, tmp_path):
    before = state(make_model(seed=5))
    learner = Learner(make_model(seed=5), LearnerConfig(zero_stage=stage, lr=1e-2, micro_batch_tokens=40), precision="fp32")
    batch = rl_batch(learner, tok)
    # before any update the recomputed log-probs are the old ones: ratio 1, nothing clipped
    stats = learner.update(batch)
    assert stats["policy/clipfrac"] == 0 and abs(stats["policy/approx_kl"]) < 1e-6
    assert torch.isfinite(torch.tensor(stats["policy/pg_loss"]))
    after = loaded_state(learner.save(tmp_path / "ckpt", tok))
    assert after.keys() == before.keys()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert "model.embed_tokens.weight" in changed and len(changed) > len(before) // 2
    if stage < 3:  # the module holds the full weights (ZeRO-3 holds shards: the save gathers them)
        live = state(learner.model)
        assert all(torch.equal(live[k], after[k]) for k in after)
    # a second pass sees the policy moved: new log-probs differ from the old ones
    assert not torch.allclose(learner.logprobs(batch), batch.old_logprobs)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_gradient_does_not_depend_on_micro_batching(agg, tok, make_model):
    batch = batch_of(make_trajs(seed=3, n=6), tok.pad_token_id)
    results = []
    for budget in (10**6, 1):  # one micro-batch vs one row per micro-batch
        learner = Learner(make_model(seed=7), LearnerConfig(micro_batch_tokens=budget, loss_agg=agg, lr=1e-3), precision="fp32")
        grads = {n: torch.zeros_like(p) for n, p in learner.model.named_parameters()}

        def keep(g, n):
            grads[n].add_(g)  # and return None: a returned tensor would replace the gradient

        hooks = [p.register_hook(lambda g, n=n: keep(g, n)) for n, p in learner.model.named_parameters()]
        before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
        stats = learner.sft_step(batch)
        for h in hooks:
            h.remove()
        delta = {n: p.detach() - before[n] for n, p in learner.model.named_parameters()}
        results.append((stats["sft_loss"], grads, delta))
    (loss_a, grads_a, delta_a), (loss_b, grads_b, delta_b) = results
    assert loss_a == pytest.approx(loss_b, rel=1e-5)
    for n in grads_a:
        assert grads_a[n].abs().sum() > 0
        torch.testing.assert_close(grads_b[n], grads_a[n], rtol=1e-4, atol=1e-7)
    # AdamW's first step is about -lr * g / (|g| + eps): compare it where g is clearly non-zero
    # (rounding noise can flip the sign of a vanishing gradient)
    for n in delta_a:
        clear = grads_a[n].abs() > 1e-6
        assert clear.any()
        torch.testing.assert_close(delta_b[n][clear], delta_a[n][clear], rtol=1e-3, atol=1e-7)


def test_save_writes_a_loadable_checkpoint_and_replaces_it_atomically(tok, make_model, tmp_path):
    learner = Learner(make_model(seed=8), LearnerConfig(lr=1e-2), precision="fp32")
    path = tmp_path / "ckpts" / "policy"
    assert learner.save(path, tok) == path
    first = loaded_state(path)
    assert all(torch.equal(first[k], v) for k, v in state(learner.model).items())
    loaded_tok = AutoTokenizer.from_pretrained(str(path))
    text = "<|im_start|>user\nWhere is the Louvre?<|im_end|>"
    assert loaded_tok.encode(text) == tok.encode(text)

    learner.sft_step(batch_of(make_trajs(), tok.pad_token_id))
    learner.save(path, tok)
    second = loaded_state(path)
    assert all(torch.equal(second[k], v) for k, v in state(learner.model).items())
    assert not torch.equal(first["model.embed_tokens.weight"], second["model.embed_tokens.weight"])
    assert [p.name for p in path.parent.iterdir()] == ["policy"]  # no temp or .old folders left
    # load_model puts a checkpoint on the GPU when there is one (evaluation, the KL reference)
    assert next(load_model(path)[0].parameters()).device == default_device()
    assert next(load_model(path, device="meta")[0].parameters()).device.type == "meta"


@pytest.mark.parametrize("algorithm", ["gae", "step_gae"])
def test_critic_and_reference_path(algorithm, tok, make_model):
    policy = make_model(seed=9)
    before = state(policy)
    learner = Learner(
        policy,
        LearnerConfig(lr=1e-2, critic_lr=1e-2, kl_coef=0.1),
        reference=make_model(seed=9),
        critic=ValueModel(make_model(seed=9)), precision="fp32",
    )
    assert learner.critic.module.head.weight.eq(0).all()
    batch = build_train_batch(learner, make_trajs(seed=4), RLConfig(algorithm=algorithm, group_size=2), tok.pad_token_id)
    for key in ("old_values", "returns", "ref_logprobs", "advantages"):
        assert getattr(batch, key) is not None, key
    assert batch.old_values.eq(0).all()  # zero-initialised head
    # the reference is the same network as the starting policy
    torch.testing.assert_close(batch.ref_logprobs, learner.logprobs(batch))
    off = batch.adv_mask == 0
    assert batch.advantages[off].eq(0).all() and batch.returns[off].eq(0).all()
    stats = learner.update(batch)
    assert {"critic/loss", "policy/kl", "policy/pg_loss"} <= stats.keys()
    assert learner.critic.module.head.weight.ne(0).any()
    assert not torch.equal(state(learner.model)["model.embed_tokens.weight"], before["model.embed_tokens.weight"])
    # the critic has its own body: training it did not touch the frozen reference or share the policy's
    assert learner.critic.module.body is not learner.model.get_decoder()
    new_values = learner.values(batch)
    assert not torch.allclose(new_values, batch.old_values)


def test_gspo_trains_with_its_papers_clip_range_and_aggregation(tok, make_model):
    """``policy_loss: gspo`` alone brings GSPO's clip range 3e-4 / 4e-4 and its sequence-mean aggregation
    (Zheng et al. 2025, arXiv:2507.18071) into Learner.update; a setting given explicitly wins, and the
    config holds what is in force (its dump is what a run logs as MLflow params)."""
    from agent_r1.algorithms import aggregate

    gspo = LearnerConfig(policy_loss="gspo")
    assert (gspo.clip_low, gspo.clip_high, gspo.loss_agg) == (3e-4, 4e-4, "seq-mean-token-mean")
    assert {k: gspo.model_dump()[k] for k in ("clip_low", "clip_high", "loss_agg")} == {
        "clip_low": 3e-4, "clip_high": 4e-4, "loss_agg": "seq-mean-token-mean"}
    mine = LearnerConfig(policy_loss="gspo", clip_high=0.2)
    assert (mine.clip_low, mine.clip_high, mine.loss_agg) == (3e-4, 0.2, "seq-mean-token-mean")
    assert (LearnerConfig().clip_low, LearnerConfig().loss_agg) == (0.2, "token-mean")  # ppo's
    # one step (ratio 1): the policy loss is the sequence mean of -A
    learner = Learner(make_model(seed=5), LearnerConfig(policy_loss="gspo", lr=1e-3), precision="fp32")
    batch = rl_batch(learner, tok)
    stats = learner.update(batch)
    adv, mask = batch.advantages, batch.loss_mask
    assert stats["policy/pg_loss"] == pytest.approx(float(aggregate(-adv, mask, "seq-mean-token-mean")), abs=1e-6)
    assert float(aggregate(-adv, mask, "seq-mean-token-mean")) != pytest.approx(float(aggregate(-adv, mask, "token-mean")),
                                                                                 abs=1e-3)
    # two epochs: after the first step the sequence ratios leave [1 - 3e-4, 1 + 4e-4], not [0.8, 1.2]
    clipfrac = {}
    for clip in (None, 0.2):
        kw = {} if clip is None else {"clip_low": clip, "clip_high": clip}
        learner = Learner(make_model(seed=5), LearnerConfig(policy_loss="gspo", lr=1e-3, ppo_epochs=2, **kw),
                          precision="fp32")
        clipfrac[clip] = learner.update(rl_batch(learner, tok))["policy/clipfrac"]
    assert clipfrac[None] > 0.1 and clipfrac[0.2] == 0, clipfrac


def test_rows_with_zero_advantage_are_skipped_without_changing_the_update(tok, make_model):
    """A GRPO group whose samples all got one reward has zero advantage: the update skips its
    rows (and build_train_batch computes their old log-probs), and the step equals the one over every row."""
    trajs = make_trajs(seed=6, n=8)
    for t in trajs[:4]:  # groups 0 and 1: every sample gets the same reward
        t.final_reward = 1.0
        for s in t.steps:
            s.reward = 0.0
    cfg = RLConfig(algorithm="grpo", group_size=2)
    results = []
    for skip in (True, False):
        learner = Learner(make_model(seed=11), LearnerConfig(lr=1e-2, mini_batches=2), precision="fp32")
        if not skip:  # the reference: every row counted as live
            learner.policy_rows = lambda b: torch.arange(len(b.input_ids))
        batch = build_train_batch(learner, trajs, cfg, tok.pad_token_id)
        dead = ~(batch.advantages != 0).any(1)
        assert dead[:4].all() and (~dead).any()  # one sequence per full-history trajectory
        if skip:  # no old log-probs were computed for the skipped rows
            assert batch.old_logprobs[dead].eq(0).all() and batch.old_logprobs[~dead].ne(0).any()
        stats = learner.update(batch, torch.Generator().manual_seed(0))
        results.append((stats, state(learner.model)))
    (skipped, after_skip), (full, after_full) = results
    assert skipped["update/live_share"] == pytest.approx(float((~dead).float().mean())) and full["update/live_share"] == 1
    assert skipped["update/tokens"] < full["update/tokens"]
    changed = [k for k in after_full if not torch.equal(after_full[k], state(make_model(seed=11))[k])]
    assert changed
    for k in after_full:  # atol: on an H100 the two summation orders differed by 3e-6 in one weight
        torch.testing.assert_close(after_skip[k], after_full[k], rtol=1e-4, atol=1e-5)


def test_no_row_is_skipped_when_a_kl_or_entropy_term_gives_it_a_gradient(tok, make_model):
    batch = batch_of(make_trajs(), tok.pad_token_id)
    batch.advantages = torch.zeros(batch.input_ids.shape)
    n = len(batch.input_ids)
    assert len(Learner(make_model(seed=1), LearnerConfig(), precision="fp32").policy_rows(batch)) == 0
    assert len(Learner(make_model(seed=1), LearnerConfig(entropy_coef=0.01), precision="fp32").policy_rows(batch)) == n
    with_kl = Learner(make_model(seed=1), LearnerConfig(kl_coef=0.1), reference=make_model(seed=1), precision="fp32")
    assert len(with_kl.policy_rows(batch)) == n


# ------------------------------------------------------------------------------- SFT batches


def test_length_grouped_batches_cover_an_epoch_once_with_little_padding():
    from agent_r1.sft import length_grouped_batches

    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(20, 200, (1003,), generator=g)
    batches = length_grouped_batches(lengths, 8, torch.Generator().manual_seed(1), window=16)
    rows = [r for b in batches for r in b]
    assert len(batches) == 1003 // 8 and all(len(b) == 8 for b in batches)
    assert len(set(rows)) == len(rows) == 1000  # every row at most once, the leftover 3 dropped

    def pad_share(bs):
        return 1 - sum(int(lengths[b].sum()) for b in bs) / sum(int(lengths[b].max()) * len(b) for b in bs)

    random_batches = torch.randperm(1000, generator=g).view(-1, 8).tolist()
    assert pad_share(batches) < 0.1 < 0.3 < pad_share(random_batches)
    # the same generator seed gives the same epoch (a resumed SFT sees the same batches) ...
    assert length_grouped_batches(lengths, 8, torch.Generator().manual_seed(1), window=16) == batches
    # ... and the order is not the sorted one: lengths of consecutive batches are mixed
    maxes = [int(lengths[b].max()) for b in batches]
    assert maxes != sorted(maxes) and maxes != sorted(maxes, reverse=True)
    # fewer rows than one batch: one short batch, as random batching gave
    assert sorted(length_grouped_batches(lengths[:3], 8, torch.Generator().manual_seed(1))[0]) == [0, 1, 2]


def test_a_single_step_update_needs_no_old_logprob_pass(tok, make_model):
    """One epoch, one mini-batch: build_train_batch computes no old log-probs, and the step equals the one
    with old log-probs recomputed by a separate forward pass (the ratio is 1 either way)."""
    trajs = make_trajs(seed=6, n=8)
    cfg = RLConfig(algorithm="grpo", group_size=2)
    learner = Learner(make_model(seed=11), LearnerConfig(lr=1e-2), precision="fp32")
    assert learner.single_step and not Learner(make_model(seed=11), LearnerConfig(mini_batches=2), precision="fp32").single_step
    batch = build_train_batch(learner, trajs, cfg, tok.pad_token_id)
    assert batch.old_logprobs is None
    learner.update(batch)
    reference = Learner(make_model(seed=11), LearnerConfig(lr=1e-2), precision="fp32")
    with_old = dataclasses.replace(batch, old_logprobs=reference.logprobs(batch))
    reference.update(with_old)
    changed = [k for k, v in state(learner.model).items() if not torch.equal(v, state(make_model(seed=11))[k])]
    assert changed
    for k, v in state(reference.model).items():
        torch.testing.assert_close(state(learner.model)[k], v, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------- LoRA


def test_lora_trains_only_adapters_and_saves_a_plain_merged_checkpoint(tok, make_model, tmp_path):
    before = state(make_model(seed=11))
    learner = Learner(make_model(seed=11), LearnerConfig(lr=1e-2, lora_rank=4, lora_alpha=8), precision="fp32")
    model = learner.model
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith(("lora_a", "lora_b")) for n in trainable)
    batch = rl_batch(learner, tok)
    # B starts at zero: the adapted model is the original one
    plain = make_model(seed=11)
    torch.testing.assert_close(learner.logprobs(batch), learner.logprobs(batch, model=plain))
    learner.update(batch)
    assert not torch.allclose(learner.logprobs(batch), batch.old_logprobs)  # the policy moved
    frozen = {k: v for k, v in state(model).items() if "lora_" not in k}
    assert all(torch.equal(v, before[k.replace(".base.", ".")]) for k, v in frozen.items())
    # the checkpoint is the original architecture with the adapters merged, and scores the same
    path = learner.save(tmp_path / "ckpt", tok)
    merged_state = loaded_state(path)
    assert merged_state.keys() == before.keys()
    assert "model.embed_tokens.weight" not in [k for k in before if not torch.equal(before[k], merged_state[k])]
    assert any(not torch.equal(before[k], merged_state[k]) for k in before if "q_proj" in k)
    reloaded = load_model(path)[0]
    torch.testing.assert_close(learner.logprobs(batch, model=reloaded), learner.logprobs(batch), rtol=1e-4, atol=1e-5)
    # the live model kept its adapters after the save
    assert any(n.endswith("lora_a") for n, _ in model.named_parameters())


def test_lora_with_zero3_is_refused(make_model):
    with pytest.raises(ValueError, match="ZeRO-3"):
        Learner(make_model(seed=12), LearnerConfig(lora_rank=4, zero_stage=3), precision="fp32")


# ------------------------------------------------------------------------------- shared prefix


def _shared_batch(vocab: int, prefix: int = 12, seed: int = 0):
    """Rows that start with the same ``prefix`` ids, then differ; right-padded; loss on the tail."""
    g = torch.Generator().manual_seed(seed)
    head = torch.randint(3, vocab, (prefix,), generator=g)
    rows = [torch.cat([head, torch.randint(3, vocab, (n,), generator=g)]) for n in (9, 5, 7)]
    rows.append(rows[0].clone())  # a sample identical to another: the shared part stops at the loss
    T = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), T), dtype=torch.long)
    mask = torch.zeros_like(ids)
    loss = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = r, 1
        loss[i, prefix + 1 : len(r)] = 1
    return ids, mask, loss


@pytest.mark.parametrize("arch", ["tiny", "llama"])
def test_shared_prefix_gives_the_same_logprobs_entropies_and_gradients(arch, make_model):
    from transformers import LlamaConfig, LlamaForCausalLM

    from agent_r1.learner.learner import shared_prefix_len

    if arch == "tiny":
        model = make_model(seed=1)
    else:  # SmolLM2's architecture
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2))
    ids, mask, loss = _shared_batch(model.config.vocab_size)
    assert shared_prefix_len(ids, mask, loss[:, 1:].bool()) == 12  # the last shared column's output is needed
    results = []
    for share in (False, True):
        model.zero_grad()
        logp, ent = token_logprobs(model, ids, mask, 0.9, with_entropy=True, positions=loss, share_prefix=share)
        ((logp * torch.linspace(0.5, 1.5, logp.shape[1])).sum() + ent.sum()).backward()
        results.append((logp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (lp0, e0, g0), (lp1, e1, g1) = results
    assert (lp0[loss.bool()] != 0).all()
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(e1, e0, atol=1e-5, rtol=1e-4)
    assert g0.keys() == g1.keys() and all(g0[n].abs().sum() > 0 for n in g0 if "embed" not in n)
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], atol=1e-5, rtol=1e-4, msg=n)


def test_shared_prefix_len_stops_at_padding_a_difference_and_the_first_needed_output():
    from agent_r1.learner.learner import shared_prefix_len

    ids = torch.tensor([[5, 6, 7, 8, 9, 0], [5, 6, 7, 8, 9, 4], [5, 6, 7, 1, 9, 4]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    none = torch.zeros((3, 5), dtype=torch.bool)
    assert shared_prefix_len(ids, mask, none) == 3  # row 2 differs at column 3
    assert shared_prefix_len(ids[:2], mask[:2], none) == 5  # row 0 is padded at column 5
    at = none.clone()
    at[1, 2] = True  # column 2's output predicts a loss token
    assert shared_prefix_len(ids, mask, at) == 2
    assert shared_prefix_len(ids[:1], mask[:1], none) == 0  # one row: nothing to share
    same = ids[1:2].repeat(2, 1)
    assert shared_prefix_len(same, torch.ones_like(same), torch.zeros((2, 5), dtype=torch.bool)) == 5  # one column left
