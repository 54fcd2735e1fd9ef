"""HFEngine against ReferenceEngine (one context at a time, a full forward pass per sampled id): the
same ids and log-probs for a seed, with prefix reuse on and off, rows of very different lengths,
duplicate contexts, and a second call that extends the first one's contexts; and the parts
HFEngine is built of (the KV store, the prefill plan)."""

import pytest
import torch

from agent_r1.learner import token_logprobs
from agent_r1.rollout import HFEngine, SamplingParams
from agent_r1.rollout.kv_store import Kept, KVStore
from agent_r1.rollout.prefill import plan_prefill
from agent_r1.rollout.reference import ReferenceEngine

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)
TEMPERED = SamplingParams(temperature=1.0, max_new_tokens=8)
NUCLEUS = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=8)


@pytest.fixture(scope="module")
def model(tok, make_model):
    model = make_model(seed=3, std=0.3)
    with torch.no_grad():  # make the end-of-turn token likely enough that some turns end early
        model.model.embed_tokens.weight[tok.eos_token_id] *= 2
    return model


def _contexts(tok):
    long = tok.encode(" ".join(["the museum of the city by the river"] * 12))
    short = tok.encode("Paris")
    # 0 and 2 are one context, 1 and 5 too; 3 is short, 4 long: prefilled in separate groups
    return [short, long, short, tok.encode("a query"), long[:-3], long]


def _later(tok, contexts, gens):
    """Each context extended by its turn and an observation of 1 to 45 tokens."""
    obs = [tok.encode(" ok" * k) for k in (1, 40, 2, 45, 1, 3)]
    return [c + g.ids + o for c, g, o in zip(contexts, gens, obs)], obs


def _run(engine, contexts, params, seed):
    torch.manual_seed(seed)
    return engine.generate(contexts, params)


def _assert_same(fast, ref):
    assert [g.ids for g in fast] == [g.ids for g in ref]
    assert [g.finished for g in fast] == [g.finished for g in ref]
    for f, r in zip(fast, ref):
        torch.testing.assert_close(torch.tensor(f.logprobs), torch.tensor(r.logprobs), rtol=0, atol=2e-5)


class _Passes:
    """Records the input shape [rows, columns] of every forward pass of ``model``."""

    def __init__(self, model):
        self.shapes, self.model = [], model

    def __enter__(self):
        self.hook = self.model.register_forward_hook(
            lambda m, args, kw, out: self.shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
        return self

    def __exit__(self, *exc):
        self.hook.remove()

    @property
    def prefills(self):
        return [s for s in self.shapes if s[1] > 1]

    @property
    def decode_rows(self):
        return [s[0] for s in self.shapes if s[1] == 1]


@pytest.mark.parametrize("params", [GREEDY, TEMPERED, NUCLEUS], ids=["greedy", "tempered", "nucleus"])
@pytest.mark.parametrize("reuse", [True, False], ids=["reuse", "no-reuse"])
def test_fast_engine_samples_the_reference_engines_ids_and_logprobs(tok, model, params, reuse):
    fast = HFEngine(model, tok, precision="fp32", reuse_kv=reuse)
    ref = ReferenceEngine(model, tok, precision="fp32")
    contexts = _contexts(tok)
    with _Passes(model) as passes:
        first = _run(fast, contexts, params, seed=1)
    _assert_same(first, _run(ref, contexts, params, seed=1))
    # the batch exercised what the reference lacks: one prefill per group of unique rows (short and
    # long apart, each duplicate once), and rows leaving the decode batch once half have ended
    assert sorted(passes.prefills) == [(2, 3), (2, len(contexts[1]))]
    assert {g.finished for g in first} == {True, False} and len({len(g.ids) for g in first}) > 1
    assert passes.decode_rows and passes.decode_rows[-1] < len(contexts)

    later, obs = _later(tok, contexts, first)
    before = fast.stats()["prefill_tokens"]
    with _Passes(model) as passes:
        second = _run(fast, later, params, seed=2)
    _assert_same(second, _run(ref, later, params, seed=2))
    prefilled = fast.stats()["prefill_tokens"] - before
    if reuse:  # the kept caches: only each turn's last id (never run) and the observation are prefilled
        assert prefilled == sum(len(o) + 1 for o in obs) and len(passes.prefills) == 2  # short and long apart
        assert max(s[1] for s in passes.prefills) == max(len(o) for o in obs) + 1
    else:
        assert prefilled == sum(map(len, set(map(tuple, later))))  # identical contexts once


def test_batch_splits_and_duplicates_do_not_change_what_is_sampled(tok, model):
    """Each context draws from its own generator: smaller batches sample the same ids, and two copies
    of one context are two draws."""
    contexts = _contexts(tok)
    one = _run(HFEngine(model, tok, precision="fp32"), contexts, TEMPERED, seed=5)
    split = _run(HFEngine(model, tok, max_batch_size=2, precision="fp32"), contexts, TEMPERED, seed=5)
    _assert_same(split, one)
    _assert_same(one, _run(ReferenceEngine(model, tok, precision="fp32"), contexts, TEMPERED, seed=5))
    assert any(one[i].ids != one[j].ids for i, j in ((0, 2), (1, 5)))
    assert [g.ids for g in _run(HFEngine(model, tok, precision="fp32"), contexts, TEMPERED, seed=6)] != [g.ids for g in one]


def test_an_eos_id_set_after_construction_is_the_one_that_ends_turns(tok, model):
    """bench/rollout.py forces every turn to max_new_tokens by giving the engine an eos no token has."""
    engine = HFEngine(model, tok, precision="fp32")
    assert any(g.finished for g in engine.generate(_contexts(tok), GREEDY))
    engine.eos_id = -1
    assert all(len(g.ids) == GREEDY.max_new_tokens and not g.finished for g in engine.generate(_contexts(tok), GREEDY))


def test_reference_engine_is_greedy_decoding_and_teacher_forced_logprobs(tok, model):
    contexts = _contexts(tok)[:4]
    ref = ReferenceEngine(model, tok, precision="fp32")
    model.eval()
    for ctx, gen in zip(contexts, ref.generate(contexts, GREEDY)):
        x = torch.tensor([ctx])
        ids = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=8)[0, len(ctx):].tolist()
        assert gen.ids == (ids[: ids.index(tok.eos_token_id) + 1] if tok.eos_token_id in ids else ids)
    for ctx, gen in zip(contexts, _run(ref, contexts, SamplingParams(temperature=0.5, max_new_tokens=8), seed=0)):
        full = torch.tensor([ctx + gen.ids])
        tf = token_logprobs(model, full, torch.ones_like(full), temperature=0.5)[0, len(ctx):]
        torch.testing.assert_close(torch.tensor(gen.logprobs), tf, rtol=0, atol=1e-5)
        assert gen.finished == (gen.ids[-1] == tok.eos_token_id) and (gen.finished or len(gen.ids) == 8)
    assert ref.stats() == {"prefill_tokens": 2 * sum(map(len, contexts)), "prefill_reused_share": 0.0}


# ------------------------------------------------------------------------------- the parts


def _kept(ids):
    return Kept(list(ids), [])


def test_kv_store_matches_the_longest_kept_prefix_a_context_extends():
    store = KVStore()
    store.keep([_kept([1, 2]), _kept([1, 2, 3, 4]), _kept([1, 5, 6])])
    assert store.match([1, 2, 3, 4, 9]).ids == [1, 2, 3, 4]
    assert store.match([1, 2, 3, 9]).ids == [1, 2]
    assert store.match([1, 2, 3, 4]).ids == [1, 2]  # a context must extend a kept sequence
    assert store.match([2, 1, 2, 3]) is None
    store.keep([_kept([7, 8])])  # a call's sequences replace the last call's
    assert store.match([1, 2, 3, 4, 9]) is None and store.match([7, 8, 9]).ids == [7, 8]
    store.count(10, 4)
    store.count(10, 1)
    assert store.stats() == {"prefill_tokens": 5, "prefill_reused_share": 0.75}
    store.reset()
    assert store.match([7, 8, 9]) is None and store.stats() == {"prefill_tokens": 0, "prefill_reused_share": 0.0}
    off = KVStore(enabled=False)
    off.keep([_kept([7, 8])])
    assert off.match([7, 8, 9]) is None


def test_prefill_plan_computes_identical_rows_once_and_groups_them_by_new_tokens():
    short, long = [1, 2, 3], list(range(10, 210))
    kept = _kept(long[:150])
    contexts = [short, long, short, long, [4]]
    plan = plan_prefill(contexts, [None, kept, None, None, None])
    # long with its kept prefix and long without are different rows; the two shorts are one
    assert plan.row_of == [0, 1, 0, 2, 3] and [r.new for r in plan.rows] == [3, 50, 200, 1]
    assert plan.prefill_tokens == 254 and plan.width == 200 and not plan.direct
    groups = sorted(plan.groups, key=lambda g: g.new)
    assert [sorted(g.rows) for g in groups] == [[0, 3], [1], [2]]
    assert [(g.width, g.new, g.cached) for g in groups] == [(3, 3, 0), (200, 50, 150), (200, 200, 0)]
    flat = [r for g in plan.groups for r in g.rows]
    assert [flat[k] for k in plan.logit_rows()] == plan.row_of
    ids, mask, pos = plan.layout(pad_id=0)
    assert ids[0, -3:].tolist() == short and mask[0].sum() == 3 and pos[0, -3:].tolist() == [0, 1, 2]
    assert pos[0, 0] == 0 and ids[0, 0] == 0  # padding: masked, position 0
    single = plan_prefill([short, [5, 6]], [None, None])
    assert single.direct and single.groups[0].rows == [0, 1] and single.logit_rows() == [0, 1]
