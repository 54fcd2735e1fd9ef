"""Context managers, the HF rollout engine, the agent loop, and token-in-token-out end to end."""

import json

import pytest
import torch

from agent_r1.config import RLConfig
from agent_r1.context import ContextManager, ObservationRenderer, SlidingWindow
from agent_r1.envs import MultiHopQAEnv, ToolEnv
from agent_r1.learner import token_logprobs
from agent_r1.models import cache_kwarg
from agent_r1.pipeline.rl_driver import build_train_batch
from agent_r1.rollout import HFEngine, SamplingParams, ScriptedEngine, run_episodes
from agent_r1.tools import SearchIndex, make_search_tool
from agent_r1.trajectory import collate, load_parquet, save_parquet, to_sequences

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where is the Louvre?"}]


def tool_msg(text):
    return [{"role": "tool", "name": "search", "content": text}]


# ------------------------------------------------------------------------------- context


def test_observation_renderer_ids_hold_content_and_end_with_generation_prompt(tok):
    r = ObservationRenderer(tok)
    ids = r.ids(tool_msg("(1) Louvre: an art museum in Paris."))
    text = tok.decode(ids, skip_special_tokens=False)
    assert "(1) Louvre: an art museum in Paris." in text
    assert text.lstrip().startswith("<|im_start|>tool\n")  # right after the action's end-of-turn token
    assert text.endswith("<|im_start|>assistant\n")
    assert ids[0] != tok.eos_token_id  # an ended action already holds its eos


def test_full_history_context_is_prompt_actions_and_observations(tok):
    cm = ContextManager(tok)
    ctx = cm.start(MESSAGES)
    prompt = list(ctx.prompt_ids)
    assert tok.decode(prompt, skip_special_tokens=False) == tok.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True
    )
    eos = tok.eos_token_id
    a0 = tok.encode("<tool_call>x</tool_call>") + [eos]
    a1 = tok.encode("<tool_call>y</tool_call>") + [eos]
    cm.observe(ctx, a0, tool_msg("first"))
    cm.observe(ctx, a1, tool_msg("second"))
    o0, o1 = cm.renderer.ids(tool_msg("first")), cm.renderer.ids(tool_msg("second"))
    ids = cm.context_ids(ctx)
    assert ids == prompt + a0 + o0 + a1 + o1
    # the pieces render the same text as the chat template applied to the whole conversation
    conv = MESSAGES + [
        {"role": "assistant", "content": "<tool_call>x</tool_call>"},
        *tool_msg("first"),
        {"role": "assistant", "content": "<tool_call>y</tool_call>"},
        *tool_msg("second"),
    ]
    assert tok.decode(ids, skip_special_tokens=False) == tok.apply_chat_template(
        conv, tokenize=False, add_generation_prompt=True
    )


def test_sliding_window_keeps_prompt_and_last_k_turns(tok):
    cm = SlidingWindow(tok, window=2)
    ctx = cm.start(MESSAGES)
    eos = tok.eos_token_id
    turns = []
    for k in range(4):
        a = tok.encode(f"call {k}") + [eos]
        cm.observe(ctx, a, tool_msg(f"obs {k}"))
        turns.append(a + cm.renderer.ids(tool_msg(f"obs {k}")))
    assert cm.context_ids(ctx) == ctx.prompt_ids + turns[2] + turns[3]
    with pytest.raises(ValueError, match="window"):
        SlidingWindow(tok, window=0)


def test_turn_cut_at_max_new_tokens_gets_eos_in_observation_not_action(tok):
    cm = ContextManager(tok)
    ctx = cm.start(MESSAGES)
    cut = tok.encode("<tool_call>{\"name")  # no eos: generation was cut off
    cm.observe(ctx, cut, tool_msg("Error: unclosed"))
    action, obs = ctx.turns[0]
    assert action == cut  # the action is left exactly as sampled
    assert obs == [tok.eos_token_id] + cm.renderer.ids(tool_msg("Error: unclosed"))
    ended = cut + [tok.eos_token_id]
    cm.observe(ctx, ended, tool_msg("ok"))
    assert ctx.turns[1] == (ended, cm.renderer.ids(tool_msg("ok")))


# ------------------------------------------------------------------------------- engine


def _contexts(tok):
    texts = ["the Louvre is in", "Which river flows through Vienna and Budapest?", "a", "Paris", "search answer"]
    return [tok.encode(t) for t in texts + ["museum of the city", "query name tool", "1989"]]


def test_hf_engine_batched_greedy_equals_sequential_and_logprobs_match_teacher_forcing(tok, make_model):
    model = make_model(seed=3, std=0.3)
    with torch.no_grad():  # make the end-of-turn token likely enough that some turns end early
        model.model.embed_tokens.weight[tok.eos_token_id] *= 2
    engine = HFEngine(model, tok, precision="fp32")
    contexts = _contexts(tok)
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    decode_rows = []
    model.register_forward_hook(lambda m, a, kw, out: decode_rows.append(len(kw["input_ids"])) if kw["input_ids"].shape[1] == 1 else None,
                                with_kwargs=True)
    gens = engine.generate(contexts, params)
    # the batch mixes turns that end early (once half have ended, they leave the batch) and turns cut at 8 tokens
    assert {g.finished for g in gens} == {True, False}
    assert decode_rows[0] == len(contexts) and decode_rows[-1] < len(contexts) // 2 + 1
    assert len({len(g.ids) for g in gens}) >= 2
    model.eval()
    for ctx, gen in zip(contexts, gens):
        x = torch.tensor([ctx])
        ref = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=8)
        ref_ids = ref[0, len(ctx) :].tolist()
        if tok.eos_token_id in ref_ids:
            ref_ids = ref_ids[: ref_ids.index(tok.eos_token_id) + 1]
        assert gen.ids == ref_ids
        assert gen.finished == (gen.ids[-1] == tok.eos_token_id)
        assert gen.finished or len(gen.ids) == 8
        assert len(gen.logprobs) == len(gen.ids)
        assert all(lp <= 0 for lp in gen.logprobs)
        full = torch.tensor([ctx + gen.ids])
        tf = token_logprobs(model, full, torch.ones_like(full))[0, len(ctx) :]
        assert torch.allclose(torch.tensor(gen.logprobs), tf, atol=1e-4)
    # small batches give the same result as one batch
    small = HFEngine(model, tok, max_batch_size=3, precision="fp32").generate(contexts, params)
    assert [g.ids for g in small] == [g.ids for g in gens]


def test_hf_engine_sampling_logprobs_are_the_tempered_distribution(tok, make_model):
    model = make_model(seed=3, std=0.3)
    engine = HFEngine(model, tok, precision="fp32")
    contexts = _contexts(tok)
    for temp in (1.0, 0.5):
        torch.manual_seed(0)
        gens = engine.generate(contexts, SamplingParams(temperature=temp, top_p=1.0, max_new_tokens=5))
        model.eval()
        for ctx, gen in zip(contexts, gens):
            full = torch.tensor([ctx + gen.ids])
            tf = token_logprobs(model, full, torch.ones_like(full), temperature=temp)[0, len(ctx) :]
            assert torch.allclose(torch.tensor(gen.logprobs), tf, atol=1e-4), temp


def test_sample_draws_tokens_with_the_tempered_nucleus_probabilities():
    from agent_r1.rollout.sampling import sample

    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0]).repeat(40_000, 1)
    torch.manual_seed(0)
    for params, kept in ((SamplingParams(temperature=0.5), 6), (SamplingParams(temperature=1.0, top_p=0.8), 3)):
        ids, lp = sample(logits, params)
        probs = torch.softmax(logits[0] / params.temperature, -1)
        probs[kept:] = 0  # top-p 0.8 keeps the 3 likeliest tokens (0.56 + 0.21 + 0.13 >= 0.8)
        probs /= probs.sum()
        freq = torch.bincount(ids, minlength=6) / len(ids)
        assert torch.allclose(freq, probs, atol=0.01), (params, freq, probs)  # 40k draws: 3 sigma < 0.008
        assert torch.allclose(lp, probs.log()[ids], atol=1e-5)
        assert freq[kept:].sum() == 0


class RecordingEngine(HFEngine):
    """HFEngine that records how many contexts each call got."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batch_sizes = []

    def generate(self, contexts, params):
        self.batch_sizes.append(len(contexts))
        return super().generate(contexts, params)


class TurnsEnv(ToolEnv):
    """No tools; every episode lasts the task's ``turns`` (a tiny random model never answers)."""

    def __init__(self):
        super().__init__([], max_turns=1)

    def reset(self, task):
        self.max_turns = task["turns"]
        return super().reset(task)


def test_run_episodes_drops_finished_episodes(tok, make_model):
    engine = RecordingEngine(make_model(seed=4), tok)
    tasks = [
        {"id": "a", "prompt": "go", "turns": 3},
        {"id": "b", "prompt": "go go", "turns": 1},
        {"id": "c", "prompt": "hi", "turns": 2},
    ]
    cm = ContextManager(tok)
    params = SamplingParams(temperature=1.0, max_new_tokens=4)
    trajs = run_episodes(engine, TurnsEnv, tasks, cm, params, group_ids=[5, 5, 6])
    assert engine.batch_sizes == [3, 2, 1]
    assert [len(t.steps) for t in trajs] == [3, 1, 2]
    assert [t.task_id for t in trajs] == ["a", "b", "c"] and [t.group_id for t in trajs] == [5, 5, 6]
    for t in trajs:
        assert t.stop_reason == "max_turns"
        for prev, nxt in zip(t.steps, t.steps[1:]):
            obs = cm.renderer.ids(prev.observation, action_ended=not prev.hit_max_new_tokens)
            assert nxt.context_ids == prev.context_ids + prev.action_ids + obs
        for s in t.steps:
            assert s.hit_max_new_tokens == (s.action_ids[-1] != tok.eos_token_id)
            assert s.format_error  # a random model's turn is neither a call nor an answer


def test_sliding_window_rollout_packs_one_sequence_per_step(tok, make_model):
    cm = SlidingWindow(tok, window=1)
    task = {"id": "a", "prompt": "go", "turns": 3}
    engine = RecordingEngine(make_model(seed=4), tok)
    (traj,) = run_episodes(engine, TurnsEnv, [task], cm, SamplingParams(max_new_tokens=4))
    s0, s1, s2 = traj.steps
    prompt = s0.context_ids
    obs = [cm.renderer.ids(s.observation, action_ended=not s.hit_max_new_tokens) for s in traj.steps]
    assert s1.context_ids == prompt + s0.action_ids + obs[0]
    assert s2.context_ids == prompt + s1.action_ids + obs[1]  # turn 0 has left the window
    seqs = to_sequences(traj)
    assert [q.ids for q in seqs] == [s.context_ids + s.action_ids for s in traj.steps]


def test_run_episodes_ends_an_episode_that_would_overflow_the_context(tok, make_model):
    engine = RecordingEngine(make_model(seed=4), tok)
    cm = ContextManager(tok)
    task = {"id": "a", "prompt": "go", "turns": 10}
    prompt_len = len(cm.start(TurnsEnv().reset(task)).prompt_ids)
    params = SamplingParams(temperature=1.0, max_new_tokens=4)
    # room for the first turn only: its observation (an error message) makes the next one overflow
    (traj,) = run_episodes(engine, TurnsEnv, [task], cm, params, max_context_tokens=prompt_len + 4 + 8)
    assert len(traj.steps) == 1 and engine.batch_sizes == [1]
    assert traj.stop_reason == "token_budget"


class FailingEnv(TurnsEnv):
    """TurnsEnv whose task can make ``reset`` or its n-th ``step`` raise (a broken env or task)."""

    def reset(self, task):
        if task.get("fail_reset"):
            raise KeyError("question")
        return super().reset(task)

    def step(self, action_text, context_tokens=None):
        if self.metrics["turns"] + 1 == self.task.get("fail_step"):
            raise ValueError("final reward: golds must hold at least one gold answer")
        return super().step(action_text, context_tokens)


def test_an_episode_whose_env_fails_is_ended_and_marked_and_the_batch_goes_on(tok, make_model, frozen_learner):
    from agent_r1.pipeline.rl_driver import rollout_stats

    engine = RecordingEngine(make_model(seed=4), tok)
    tasks = [{"id": "ok", "prompt": "go", "turns": 3}, {"id": "step", "prompt": "go", "turns": 3, "fail_step": 2},
             {"id": "reset", "prompt": "go", "turns": 3, "fail_reset": True}]
    trajs = run_episodes(engine, FailingEnv, tasks, ContextManager(tok), SamplingParams(max_new_tokens=4))
    ok, step, reset = trajs
    assert engine.batch_sizes == [2, 2, 1] and [len(t.steps) for t in trajs] == [3, 1, 0]
    assert ok.stop_reason == "max_turns"
    for t in (step, reset):
        assert t.stop_reason == "env_error" and t.final_reward == 0.0
    assert step.error == "ValueError: final reward: golds must hold at least one gold answer"
    assert reset.error == "KeyError: 'question'"
    assert rollout_stats(trajs)["env_errors"] == 2 / 3
    batch = build_train_batch(frozen_learner, trajs, RLConfig(), tok.pad_token_id)  # env errors are not trained on
    assert len(batch.input_ids) == 1
    with pytest.raises(RuntimeError, match="every episode of the batch ended with an environment error"):
        build_train_batch(frozen_learner, [step, reset], RLConfig(), tok.pad_token_id)


# ------------------------------------------------------------------------------- token in, token out

SEARCH_CALL = '{"name": "search", "arguments": {"query": "Mona Lisa"}}'


def test_token_in_token_out_from_rollout_to_learner_batch(
    tok, frozen_learner, corpus, tasks, split_ids, tmp_path
):
    model = frozen_learner.model
    search = make_search_tool(SearchIndex(corpus), top_k=1)
    # Episode 0's first turn is a search call written one character per token: decoding and
    # re-encoding it would merge tokens, so only a token-in-token-out path keeps these ids.
    forced = tok.encode("<tool_call>") + split_ids(tok, SEARCH_CALL) + tok.encode("</tool_call>")
    forced += [tok.eos_token_id]
    assert tok.encode(tok.decode(forced, skip_special_tokens=False)) != forced
    engine = ScriptedEngine(tok, [[forced, None, None, None]], model=model)
    cm = ContextManager(tok, tools=[search.schema])
    torch.manual_seed(0)
    trajs = run_episodes(
        engine,
        lambda: MultiHopQAEnv(search, max_turns=2, retrieval_bonus=0.5),
        [tasks[0], tasks[0], tasks[1], tasks[1]],
        cm,
        SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=len(forced)),  # (a turn is cut there)
        group_ids=[0, 0, 1, 1],
    )
    first = trajs[0].steps[0]
    assert first.action_ids == forced
    assert first.tool_calls == [{"name": "search", "arguments": {"query": "Mona Lisa"}}]
    assert first.reward == 0.5  # the search retrieved the gold "Mona Lisa" document
    assert "Mona Lisa" in first.observation[0]["content"]
    assert all(len(t.steps) == 2 for t in trajs)  # the random model never answers

    batch = build_train_batch(frozen_learner, trajs, RLConfig(algorithm="grpo", group_size=2), tok.pad_token_id)
    assert len(batch.input_ids) == len(trajs)  # full history: one row per trajectory
    # (every reward here is equal, so build_train_batch's old log-probs skipped all rows: recompute them)
    recomputed = frozen_learner.logprobs(batch)
    for i, t in enumerate(trajs):
        m = batch.action_mask[i].bool()
        sampled = [x for s in t.steps for x in s.action_ids]
        assert batch.input_ids[i][m].tolist() == sampled
        sample_lp = torch.tensor([x for s in t.steps for x in s.action_logprobs])
        assert torch.allclose(recomputed[i][m], sample_lp, atol=1e-4)
        assert torch.allclose(batch.sample_logprobs[i][m], sample_lp)
        # the row is exactly the last context the policy saw, plus its action
        n = int(batch.attention_mask[i].sum())
        assert batch.input_ids[i][:n].tolist() == t.steps[-1].context_ids + t.steps[-1].action_ids
    # a stored rollout replays to the same training tokens
    save_parquet(trajs, tmp_path / "rollout.parquet")
    replay = collate([q for t in load_parquet(tmp_path / "rollout.parquet") for q in to_sequences(t)], tok.pad_token_id)
    for f in ("input_ids", "attention_mask", "action_mask", "loss_mask", "token_rewards", "sample_logprobs", "group_ids"):
        assert torch.equal(getattr(replay, f), getattr(batch, f)), f
    # at least one sampled turn re-tokenizes differently too (random byte-level tokens merge)
    def reencoded(ids):
        return tok.encode(tok.decode(ids, skip_special_tokens=False))

    drift = [s for t in trajs for s in t.steps if reencoded(s.action_ids) != s.action_ids]
    assert len(drift) >= 2


# ------------------------------------------------------------------------------- KV reuse across turns


def _episodes(tok, model, cm, tasks, reuse: bool, max_new_tokens=4, seed=0):
    engine = HFEngine(model, tok, reuse_kv=reuse, precision="fp32")
    torch.manual_seed(seed)
    trajs = run_episodes(engine, TurnsEnv, tasks, cm, SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens))
    return trajs, engine.stats()


def _same_turns(a, b):
    for ta, tb in zip(a, b):
        assert [s.context_ids for s in ta.steps] == [s.context_ids for s in tb.steps]
        assert [s.action_ids for s in ta.steps] == [s.action_ids for s in tb.steps]
        for sa, sb in zip(ta.steps, tb.steps):
            assert torch.allclose(torch.tensor(sa.action_logprobs), torch.tensor(sb.action_logprobs), atol=1e-4)


def test_kv_reuse_prefills_only_appended_tokens_and_samples_the_same_ids(tok, make_model):
    """Episodes ending at different turns in one batch, some turns cut at max_new_tokens (their
    end-of-turn token is added as context): the same seed gives the same ids and log-probs with
    and without reuse, and each turn after the first prefills only what was appended."""
    model = make_model(seed=3, std=0.3)
    with torch.no_grad():  # make the end-of-turn token likely enough that some turns end early
        model.model.embed_tokens.weight[tok.eos_token_id] *= 2
    tasks = [{"id": "a", "prompt": "go", "turns": 3}, {"id": "b", "prompt": "go go", "turns": 1},
             {"id": "c", "prompt": "hi", "turns": 2}, {"id": "d", "prompt": "go", "turns": 3}]
    cm = ContextManager(tok)
    reused, stats = _episodes(tok, model, cm, tasks, reuse=True)
    full, full_stats = _episodes(tok, model, cm, tasks, reuse=False)
    _same_turns(reused, full)
    steps = [s for t in reused for s in t.steps]
    assert any(s.hit_max_new_tokens for s in steps) and any(not s.hit_max_new_tokens for s in steps)
    contexts = sum(len(s.context_ids) for s in steps)
    assert full_stats["prefill_tokens"] == contexts - len(reused[0].steps[0].context_ids)  # a and d share a prompt
    # with reuse a later turn prefills its last action id (never run) + the observation + header
    expected = sum(len(t.steps[0].context_ids) for t in reused[:3])
    for t in reused:
        for prev, nxt in zip(t.steps, t.steps[1:]):
            expected += len(nxt.context_ids) - len(prev.context_ids) - len(prev.action_ids) + 1
    assert stats["prefill_tokens"] == expected
    assert stats["prefill_reused_share"] == pytest.approx(1 - expected / contexts)


def test_kv_reuse_falls_back_to_a_full_prefill_after_a_context_rewrite(tok, make_model):
    """A sliding window drops turns from the context: nothing kept is a prefix of it any more."""
    model = make_model(seed=4)
    cm = SlidingWindow(tok, window=1)
    tasks = [{"id": "a", "prompt": "go", "turns": 3}]
    reused, stats = _episodes(tok, model, cm, tasks, reuse=True)
    full, _ = _episodes(tok, model, cm, tasks, reuse=False)
    _same_turns(reused, full)
    s0, s1, s2 = reused[0].steps
    # turn 1 still extends turn 0; turn 2 no longer holds turn 0's action: a full prefill
    assert stats["prefill_tokens"] == len(s0.context_ids) + (len(s1.context_ids) - len(s0.context_ids) - len(s0.action_ids) + 1) + len(s2.context_ids)


def test_kv_reuse_is_reset_between_batches_of_episodes(tok, make_model):
    model = make_model(seed=4)
    engine = HFEngine(model, tok, precision="fp32")
    ctx = tok.encode("the Louvre is in")
    params = SamplingParams(temperature=0.0, max_new_tokens=3)
    (g,) = engine.generate([ctx], params)
    engine.generate([ctx + g.ids + tok.encode(" ok")], params)
    assert engine.stats()["prefill_tokens"] == len(ctx) + len(tok.encode(" ok")) + 1
    engine.reset()
    assert engine.stats() == {"prefill_tokens": 0, "prefill_reused_share": 0.0}
    engine.generate([ctx + g.ids + tok.encode(" ok")], params)
    assert engine.stats()["prefill_reused_share"] == 0.0


def test_tiny_chat_template_puts_the_system_text_and_each_tool_on_its_own_line(tok):
    tools = [{"type": "function", "function": {"name": n, "parameters": {}}} for n in ("a", "b")]
    schema = [json.dumps(t) for t in tools]
    msgs = [{"role": "system", "content": "SYS"}, {"role": "user", "content": "hi"}]
    system = tok.apply_chat_template(msgs, tools=tools, tokenize=False).split("<|im_end|>")[0]
    assert system == "<|im_start|>system\nSYS\nTools:\n" + "\n".join(schema)
    system = tok.apply_chat_template(msgs[1:], tools=tools, tokenize=False).split("<|im_end|>")[0]
    assert system == "<|im_start|>system\nTools:\n" + "\n".join(schema)
    assert tok.apply_chat_template(msgs, tokenize=False).startswith("<|im_start|>system\nSYS<|im_end|>\n")


def test_growing_cache_gives_the_dynamic_caches_logits_across_growth_reorder_and_crop(make_model):
    from transformers import DynamicCache

    from agent_r1.rollout.kv_cache import GrowingLayer as _GrowingLayer, growing_cache as _growing_cache

    model = make_model(std=0.3).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 200, (3, 20), generator=g)
    steps = torch.randint(5, 200, (3, _GrowingLayer.SPARE + 10), generator=g)  # past one buffer growth
    out = {}
    with torch.no_grad():
        for name, cache in (("dynamic", DynamicCache()), ("growing", _growing_cache())):
            kw = cache_kwarg(model)  # cache (transformers >= 5.24) or past_key_values
            logits = [model(input_ids=ids, **{kw: cache}, use_cache=True).logits[:, -1]]
            for t in range(steps.shape[1]):
                if t == 5:
                    cache.reorder_cache(torch.tensor([2, 0, 0]))  # rows selected, as a group expands
                if t == 8:
                    cache.crop(-2)  # keys and values replaced from outside
                logits.append(model(input_ids=steps[:, t:t + 1], **{kw: cache}, use_cache=True).logits[:, -1])
            out[name] = (torch.stack(logits), type(cache.layers[0]))
    assert out["growing"][1] is _GrowingLayer and out["dynamic"][1] is not _GrowingLayer
    torch.testing.assert_close(out["growing"][0], out["dynamic"][0], rtol=0, atol=1e-5)


def test_prefill_groups_cut_sorted_rows_where_padding_costs_more_than_a_forward_pass():
    from agent_r1.rollout.prefill import prefill_groups as _prefill_groups

    groups = _prefill_groups([5, 300, 6, 310, 4, 7], overhead=64)
    assert sorted(sorted(g) for g in groups) == [[0, 2, 4, 5], [1, 3]]
    assert _prefill_groups([5, 300, 6], overhead=10_000) == [[0, 1, 2]]  # one group keeps the order
    assert sorted(map(sorted, _prefill_groups([9, 3, 9], overhead=0))) == [[0, 2], [1]]


def test_rows_of_very_different_lengths_are_prefilled_apart_and_decode_as_one_at_a_time(tok, make_model):
    """Short and long contexts (a group's shared prompt among them) go through separate prefill
    passes, then one decode cache; a second call reuses their kept caches, again in groups. Every
    context gets the ids and log-probs it gets alone."""
    model = make_model(seed=3, std=0.3)
    with torch.no_grad():
        model.model.embed_tokens.weight[tok.eos_token_id] *= 2
    long = tok.encode(" ".join(["the museum of the city by the river"] * 12))
    short = tok.encode("Paris")
    contexts = [short, long, short, tok.encode("a query"), long[:-3]]  # contexts 0 and 2 are one prompt
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    prefills = []
    model.register_forward_hook(lambda m, args, kw, out: prefills.append(kw["input_ids"].shape) if kw["input_ids"].shape[1] > 1 else None,
                                with_kwargs=True)
    engine = HFEngine(model, tok, precision="fp32")
    gens = engine.generate(contexts, params)
    assert sorted(tuple(s) for s in prefills) == [(2, 3), (2, len(long))]  # short and long apart, the shared prompt once
    alone = [HFEngine(model, tok, precision="fp32").generate([c], params)[0] for c in contexts]
    obs = [tok.encode(" ok" * k) for k in (1, 40, 2, 45, 1)]  # new tokens: short, long, short, long, short
    later = [c + g.ids + o for c, g, o in zip(contexts, gens, obs)]
    prefills.clear()
    before = engine.stats()["prefill_tokens"]
    later_gens = engine.generate(later, params)
    assert len(prefills) == 2  # the kept caches: only the last sampled id and the observation are prefilled
    assert engine.stats()["prefill_tokens"] - before == sum(len(o) + 1 for o in obs)
    for g, a, c in zip(gens + later_gens, alone + [HFEngine(model, tok, precision="fp32").generate([x], params)[0] for x in later], contexts + later):
        assert g.ids == a.ids, c
        assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(a.logprobs), atol=1e-4)


# ------------------------------------------------------------------------------- format errors in a row

def test_an_episode_ends_after_max_format_errors_in_a_row_for_a_model_and_a_baseline(tok):
    """env.max_format_errors (default 2): the episode whose last 2 turns were format errors ends there
    (stop reason format_errors, scored as no answer), an episode whose errors are not in a row goes on, and a
    policy without a model (play_policy, the random/oracle baselines) ends by the same rule; null: max_turns."""
    from agent_r1.config import EnvConfig
    from agent_r1.rollout import play_policy
    from agent_r1.tools import tool

    @tool(thread_safe=True)
    def lookup(city: str) -> str:
        """Look up a city.

        Args:
            city: The city's name.
        """
        return "12000"

    good = '<tool_call>{"name": "lookup", "arguments": {"city": "Lorvik"}}</tool_call>'
    tasks = [{"id": "bad", "question": "?"}, {"id": "mixed", "question": "?"}]
    script = [["oops", "oops"], ["oops", good], ["oops"], ["<answer>12000</answer>"]]  # 'bad' stops after 2 calls

    def play(max_format_errors, script):
        make_env = lambda: ToolEnv.from_config([lookup], EnvConfig(max_format_errors=max_format_errors))  # noqa: E731
        return run_episodes(ScriptedEngine(tok, script), make_env, tasks, ContextManager(tok), SamplingParams())

    bad, mixed = play(2, script)
    assert EnvConfig().max_format_errors == 2
    assert bad.stop_reason == "format_errors" and len(bad.steps) == 2 and all(s.format_error for s in bad.steps)
    assert bad.answer is None and bad.metrics["format_errors"] == 2 and bad.metrics["turns"] == 2
    assert mixed.stop_reason == "answer" and len(mixed.steps) == 4 and mixed.answer == "12000"
    for bad in play(None, ["oops"] * 4):  # no limit: env.max_turns (4) ends it
        assert bad.stop_reason == "max_turns" and len(bad.steps) == 4

    make_env = lambda: ToolEnv.from_config([lookup], EnvConfig())  # noqa: E731
    (baseline,) = play_policy(make_env, tasks[:1], lambda env, task, k: "")
    assert baseline.stop_reason == "format_errors" and len(baseline.steps) == 2
