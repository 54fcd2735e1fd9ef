"""Pipeline stages without an orchestrator: resume after a kill, baselines, comparisons, config
inheritance, HotpotQA preparation, retrieval recall and transcripts."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from agent_r1.config import ConfigError, load_config, method_name, parse_method, parse_overrides
from agent_r1.envs import MultiHopQAEnv, NaiveRAGEnv
from agent_r1.evaluate import retrieval_recall
from agent_r1.pipeline import stages
from agent_r1.pipeline.control import control
from agent_r1.pipeline.rl_driver import RLFiles, RLTrainer, for_method, matched_method, rl_methods, rl_seconds
from agent_r1.pipeline.state import history_path
from agent_r1.tools import SearchIndex, make_search_tool
from agent_r1.trajectory import Step, Trajectory
from agent_r1.transcripts import transcript

from conftest import CORPUS, TASKS

HOTPOTQA = Path(__file__).resolve().parents[1] / "data" / "hotpotqa"  # shipped with the project

TINY = [
    "data.n_films=24", "data.n_directors=8", "data.n_studios=4", "sft.worlds=1", "sft.epochs=1.8", "rl.iterations=4",
    "rl.tasks_per_iteration=2", "rl.group_size=2", "eval.max_per_hop=3", "model.tiny.num_layers=1",
    "model.tiny.hidden_size=32", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
    "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400",
]


def tiny_cfg(tmp_path, *extra):
    return load_config("tiny", "pipelines.yaml", parse_overrides([f"output_dir={tmp_path}", *TINY, *extra]))


def weights(path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "model.safetensors"))


# ------------------------------------------------------------------------------ resume
def _sft_killed_after_its_first_state(cfg) -> None:
    """The SFT stage of ``cfg``, stopped by an exception right after it wrote its first resumable state."""
    import agent_r1.pipeline.stages as st

    class Killed(Exception):
        pass

    state, real = cfg.out / "state" / "sft", st.sft_loop

    def dying_loop(*args, on_step=None, **kw):
        def wrapped(step, total, m):
            stop = on_step(step, total, m)
            if (state / "meta.json").exists():
                raise Killed
            return stop
        return real(*args, on_step=wrapped, **kw)

    st.sft_loop = dying_loop
    try:
        with pytest.raises(Killed):
            stages.sft(cfg)
    finally:
        st.sft_loop = real


def test_sft_resumed_from_its_last_state_matches_an_uninterrupted_run(tmp_path):
    a = tiny_cfg(tmp_path / "a", "sft.checkpoint_every=5")
    stages.prepare(a)
    stages.sft(a)
    assert not (a.out / "state" / "sft").exists()  # dropped once the stage is done

    b = tiny_cfg(tmp_path / "b", "sft.checkpoint_every=5")
    stages.prepare(b)
    state = b.out / "state" / "sft"

    _sft_killed_after_its_first_state(b)  # as if the process died right after the state at step 5 was written
    assert json.loads((state / "meta.json").read_text())["step"] == 5
    assert not (b.out / "checkpoints" / "sft").exists()
    stages.sft(b)  # resumes at step 5
    wa, wb = weights(a.out / "checkpoints" / "sft"), weights(b.out / "checkpoints" / "sft")
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-6)


def test_a_named_model_s_sft_state_is_its_weights_and_adam_moments_only_and_resumes(tmp_path):
    """A save costs what a resume needs: for a model of model.name_or_path (its tokenizer is the model's,
    loaded again on resume) the state holds the weights and the optimizer's two moments per weight, no
    copy of the tokenizer, and the resumed run ends where the uninterrupted one did."""
    tiny = tiny_cfg(tmp_path / "tiny", "sft.epochs=0.05")
    stages.prepare(tiny)
    stages.sft(tiny)  # writes checkpoints/base: the untrained tiny model as a model folder
    base = str(stages.checkpoint_dir(tiny, "base"))
    n_params = sum(v.numel() for v in weights(base).values())

    def cfg(name):
        return tiny_cfg(tmp_path / name, f"model.name_or_path={base}", "sft.checkpoint_every=5")

    a, b = cfg("a"), cfg("b")
    for c in (a, b):
        stages.prepare(c)
    stages.sft(a)
    state = b.out / "state" / "sft"

    _sft_killed_after_its_first_state(b)
    files = {str(f.relative_to(state)): f.stat().st_size for f in state.rglob("*") if f.is_file()}
    assert set(files) == {"meta.json", "policy/mp_rank_00_model_states.pt"}
    assert 3 * 4 * n_params <= sum(files.values()) < 3 * 4 * n_params * 1.1  # fp32 weights + 2 Adam moments
    stages.sft(b)  # resumes at step 5, the tokenizer from the model's folder
    wa, wb = weights(a.out / "checkpoints" / "sft"), weights(b.out / "checkpoints" / "sft")
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-6)


def test_rl_resumes_after_its_last_state_and_a_changed_config_starts_afresh(tmp_path):
    cfg = tiny_cfg(tmp_path, "rl.checkpoint_every=2")
    stages.prepare(cfg)
    stages.sft(cfg)
    trainer = RLTrainer.from_config(cfg)
    for _ in range(3):  # the state is saved after iteration 2; iteration 3 is lost in the "crash"
        trainer.step()
    del trainer
    resumed = RLTrainer.from_config(cfg)
    assert resumed.iteration == 2 and [h["iteration"] for h in resumed.history] == [1, 2]
    resumed.run()
    history = json.loads((cfg.out / "metrics" / "train" / "grpo.json").read_text())
    assert [h["iteration"] for h in history] == [1, 2, 3, 4]

    # a re-run after a crash in a later stage skips the finished ones (same config)
    sft_weights = cfg.out / "checkpoints" / "sft" / "model.safetensors"
    mtime = sft_weights.stat().st_mtime_ns
    stages.sft(cfg)
    assert sft_weights.stat().st_mtime_ns == mtime
    rl_weights = cfg.out / "rl" / "grpo" / "model.safetensors"
    mtime = rl_weights.stat().st_mtime_ns
    assert RLFiles.of(cfg).complete() and stages.train(cfg) == [cfg.out / "rl" / "grpo"]
    assert rl_weights.stat().st_mtime_ns == mtime  # skipped: finished under this config

    changed = cfg.model_copy(update={"rl": cfg.rl.model_copy(update={"tasks_per_iteration": 3})})
    t = RLTrainer.from_config(changed)
    for _ in range(2):
        t.step()
    assert RLTrainer.from_config(changed.model_copy(update={"seed": 1})).iteration == 0  # other seed: fresh


def test_rl_trains_on_the_configured_question_types_only(tmp_path):
    cfg = tiny_cfg(tmp_path, "rl.hops=[]", "rl.qtypes=[director_birthplace]")
    stages.prepare(cfg)
    stages.sft(cfg)
    train = pd.read_parquet(cfg.out / "data" / "train.parquet")
    trainer = RLTrainer.from_config(cfg)
    assert {t["qtype"] for t in trainer.tasks} == {"director_birthplace"}
    assert len(trainer.tasks) == (train["qtype"] == "director_birthplace").sum()
    with pytest.raises(ValueError, match=r"no training questions with rl.hops=\[\] or rl.qtypes=\[\]"):
        RLTrainer.from_config(tiny_cfg(tmp_path, "rl.hops=[]"))


# ------------------------------------------------------------------------------ comparison
@pytest.mark.parametrize("algorithm, loss_mask, adv_mask, process_rewards, name", [
    ("gae", True, True, True, "ppo"), ("grpo", False, True, True, "grpo_no_loss_mask"),
    ("reinforce_pp_baseline", True, False, True, "reinforce_pp_baseline_no_adv_mask"), ("rloo", True, True, True, "rloo"),
    ("grpo", True, True, False, "grpo_outcome"), ("step_gae", False, True, False, "ppo_step_no_loss_mask_outcome"),
])
def test_method_names_round_trip(algorithm, loss_mask, adv_mask, process_rewards, name):
    assert method_name(algorithm, loss_mask, adv_mask, process_rewards) == name
    assert parse_method(name) == {"algorithm": algorithm, "loss_mask": loss_mask, "adv_mask": adv_mask,
                                  "process_rewards": process_rewards, "demos": None}


def test_pipelines_extend_each_other_and_methods_are_checked(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("pipelines:\n  base: {rl: {iterations: 7, learner: {lr: 0.1}}, output_dir: x}\n"
                 "  cmp: {extends: base, rl: {learner: {mini_batches: 3}}, methods: [ppo, rloo_no_adv_mask]}\n"
                 "  bad: {extends: nope}\n  loop1: {extends: loop2}\n  loop2: {extends: loop1}\n")
    cfg = load_config("cmp", f)
    assert (cfg.rl.iterations, cfg.rl.learner.lr, cfg.rl.learner.mini_batches) == (7, 0.1, 3)
    assert cfg.output_dir == "outputs/cmp"  # not inherited
    assert rl_methods(cfg) == ["ppo", "rloo_no_adv_mask"]
    assert for_method(cfg, "rloo_no_adv_mask").rl.adv_mask is False
    with pytest.raises(ConfigError, match="extends 'nope'"):
        load_config("bad", f)
    with pytest.raises(ConfigError, match="cycle"):
        load_config("loop1", f)
    with pytest.raises(ConfigError, match="methods: unknown method 'ppo2'"):
        load_config("cmp", f, parse_overrides(["methods=[ppo2]"]))


# ------------------------------------------------------------------------------ baselines
def test_a_second_evaluation_reuses_the_untrained_baselines_and_a_changed_key_recomputes(tmp_path, monkeypatch, caplog):
    """The untrained baselines' scores come from the score cache on a second evaluation (no episode
    run, the same numbers and transcripts, a log line); a change in the model's files, the settings of an
    episode, the tasks (eval.seed draws them; the run's seed does not) or eval.cache_baselines: false
    scores them again."""
    import logging

    from safetensors.torch import save_file

    from agent_r1.pipeline import score_cache

    monkeypatch.setenv("AGENT_R1_CACHE", str(tmp_path / "cache"))
    runs = []  # (method, number of tasks) of every evaluation that played episodes
    real_model, real_policy = stages._evaluate_model, stages.play_policy

    def counted_model(cfg, method, src, tools, tasks, *a):
        runs.append((method, len(tasks)))
        return real_model(cfg, method, src, tools, tasks, *a)

    def counted_policy(make_env, tasks, turn):
        runs.append(("oracle", len(tasks)))
        return real_policy(make_env, tasks, turn)

    monkeypatch.setattr(stages, "_evaluate_model", counted_model)
    monkeypatch.setattr(stages, "play_policy", counted_policy)
    cfg = tiny_cfg(tmp_path / "run", "sft.epochs=0.05", "eval.baselines=[base_tool_call, oracle]")
    stages.prepare(cfg)
    stages.sft(cfg)
    base = stages.checkpoint_dir(cfg, "base")
    checkpoints = {"base_tool_call": str(base), "oracle": ""}

    def evaluate(c=cfg):
        runs.clear()
        with caplog.at_level(logging.INFO, logger=score_cache.__name__):
            caplog.clear()
            out = stages.evaluate(c, checkpoints=checkpoints)
        return out, sorted(m for m, _ in runs), sum("cached score used" in r.message for r in caplog.records)

    first, ran, hits = evaluate()
    assert ran == ["base_tool_call", "oracle"] and hits == 0 and len(list((tmp_path / "cache" / "scores").glob("*.json"))) == 2
    written = (cfg.out / "metrics" / "eval.json").read_text()
    second, ran, hits = evaluate()
    assert ran == [] and hits == 2 and second == first
    assert (cfg.out / "metrics" / "eval.json").read_text() == written

    assert evaluate(cfg.model_copy(update={"env": cfg.env.model_copy(update={"max_new_tokens": 7})}))[1] == \
        ["base_tool_call", "oracle"]  # the settings of an episode
    assert evaluate(tiny_cfg(tmp_path / "run", "sft.epochs=0.05", "eval.baselines=[base_tool_call, oracle]",
                             "seed=1"))[1:] == ([], 2)  # another run seed: the same tasks (eval.seed draws them)
    assert evaluate(tiny_cfg(tmp_path / "run", "sft.epochs=0.05", "eval.baselines=[base_tool_call, oracle]",
                             "eval.seed=1", "eval.max_per_hop=5"))[1] == ["base_tool_call", "oracle"]  # another draw
    assert evaluate(tiny_cfg(tmp_path / "run", "sft.epochs=0.05", "eval.baselines=[base_tool_call, oracle]",
                             "eval.cache_baselines=false"))[1] == ["base_tool_call", "oracle"]
    w = weights(base)
    name = next(iter(w))
    save_file({**w, name: w[name] + 0.01}, str(base / "model.safetensors"), metadata={"format": "pt"})
    assert evaluate()[1:] == (["base_tool_call"], 1)  # the model's files changed; the oracle has no model


def test_naive_rag_puts_the_question_s_passages_in_the_prompt_and_takes_one_answer_turn():
    from agent_r1.envs.qa import NAIVE_RAG_SYSTEM_PROMPT

    search = make_search_tool(SearchIndex(CORPUS), top_k=2)
    env = NaiveRAGEnv(search, system_prompt="the agent's prompt")
    task = TASKS[1]  # "Which river flows through Vienna?"
    messages = env.reset(task)
    assert messages[0] == {"role": "system", "content": NAIVE_RAG_SYSTEM_PROMPT}  # its own prompt, not the agent's
    assert [m["role"] for m in messages] == ["system", "user"]  # no tool call, no tool message
    user = messages[1]["content"]
    assert "(1) Danube:" in user and user.endswith(f"Question: {task['question']}")
    assert env.metrics["tool_calls"] == 0 and env.found_gold == {"Danube"}
    res = env.step("<answer>Danube</answer>")
    assert res.done and res.info.metrics["em"] == 1.0 and res.info.metrics["search_recall"] == 1.0
    env.reset(task)
    res = env.step("\n Danube\nIt flows through Vienna.")  # no tag: the first non-blank line answers
    assert res.done and res.info.answer == "Danube" and res.info.metrics["em"] == 1.0
    env.reset(task)
    res = env.step('<tool_call>{"name": "search", "arguments": {"query": "Danube"}}</tool_call>')
    assert res.done and res.info.metrics["em"] == 0.0 and res.info.tool_calls == []  # no search: one turn
    assert MultiHopQAEnv(search).max_turns > 1


def test_eval_summaries_break_em_down_by_question_type():
    from agent_r1.evaluate import summarize_by_hops
    from agent_r1.trajectory import Trajectory

    def episode(em):
        return Trajectory("t", 0, metrics={"em": em}, metric_aggs={"em": "mean"})

    tasks = [{"hops": 1, "qtype": "director"}, {"hops": 2, "qtype": "studio_city_of_film"},
             {"hops": 2, "qtype": "studio_city_of_film"}, {"hops": 2, "qtype": "director_birthplace"}]
    s = summarize_by_hops([episode(1.0), episode(1.0), episode(0.0), episode(0.0)], tasks)
    assert s["2hop"]["em"] == 0.3333
    assert s["2hop"]["em_by_qtype"] == {"director_birthplace": 0.0, "studio_city_of_film": 0.5}
    assert s["all"]["em_by_qtype"]["director"] == 1.0 and len(s["all"]["em_by_qtype"]) == 3


def test_retrieval_recall_by_question_type():
    index = SearchIndex(CORPUS)
    tasks = [
        {"question": "Which river flows through Vienna?", "gold_titles": ["Danube"], "qtype": "bridge"},
        {"question": "Where is the Mona Lisa kept?", "gold_titles": ["Mona Lisa", "Louvre"], "qtype": "comparison"},
    ]
    r = retrieval_recall(index, tasks, ks=(1, 5))
    assert r["bridge"] == {"recall@1": 1.0, "recall@5": 1.0, "n": 1}
    assert r["comparison"]["recall@1"] == 0.5  # one of its two gold documents at k=1
    assert r["all"]["recall@1"] == pytest.approx(0.75) and r["all"]["n"] == 2


def test_hotpotqa_folder_is_prepared_with_train_and_test_splits(tmp_path):
    cfg = load_config("default", "pipelines.yaml", parse_overrides(
        [f"output_dir={tmp_path}", "data.source=hotpotqa", f"data.path={HOTPOTQA}", "sft.worlds=0", "sft.hops=[2]"]))
    info = stages.prepare(cfg)
    assert info["train_questions"] == 300 and info["test_questions"] == 300
    from agent_r1.data.synthetic import load_corpus, load_split

    corpus = load_corpus(tmp_path / "data")
    assert corpus["title"].is_unique and corpus["doc_id"].is_unique
    titles = set(corpus["title"])
    for split in ("train", "test"):
        assert all(set(g) <= titles for g in load_split(tmp_path / "data", split)["gold_titles"])
    with pytest.raises(ConfigError, match="sft.worlds"):
        load_config("default", "pipelines.yaml", parse_overrides(["data.source=hotpotqa", "sft.worlds=2"]))


def test_transcript_shows_turns_observations_and_score():
    traj = Trajectory("q1", 0, steps=[
        Step([1], [2], [0.0], action_text='<tool_call>{"name": "search"}</tool_call>',
             observation=[{"role": "tool", "name": "search", "content": "(1) Danube: a river"}], reward=0.2),
        Step([1], [2], [0.0], action_text="<answer>Danube</answer>", format_error=False),
    ], final_reward=1.0, answer="Danube", metrics={"em": 1.0, "f1": 1.0, "tool_calls": 1})
    text = transcript(traj, TASKS[1])
    assert "Which river flows through Vienna?" in text and "**Gold:** Danube" in text
    assert "> **search:** (1) Danube: a river" in text and "step reward +0.20" in text
    assert "**Answer:** 'Danube' · EM 1" in text


def test_comparison_table_orders_baselines_first_and_averages_domains():
    from agent_r1.evaluate import comparison_markdown

    m = lambda em: {"em": em, "f1": em + 0.1, "tool_calls": 1.5, "format_error_rate": 0.25}
    results = {"test_2hop": {"rloo": m(0.4), "naive_rag": m(0.1), "ppo_no_adv_mask": m(0.3)},
               "test_3hop": {"rloo": m(0.2), "naive_rag": m(0.0), "ppo_no_adv_mask": m(0.1)}}
    lines = comparison_markdown(results, "test_2hop", "test_3hop").splitlines()
    assert [line.split(" | ")[0][2:] for line in lines[2:]] == ["naive_rag", "rloo", "ppo_no_adv_mask"]
    assert lines[3] == "| rloo | 0.400 | 0.500 | 0.200 | 0.300 | 0.300 | 1.50 | 0.750 |"


def test_the_control_budget_is_rl_s_recorded_training_time(tmp_path):
    # read from the method's history, so a control after a skipped (complete) or resumed train
    # stage still gets RL's time, not the few seconds the skipped stage took
    cfg = tiny_cfg(tmp_path)
    path = history_path(cfg, cfg.rl.method)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps([{"iteration": i, "time/iteration_s": 2.5} for i in range(1, 5)]))
    assert rl_seconds(cfg) == 10.0


def test_the_control_matches_the_first_trained_method_when_rl_algorithm_is_not_one(tmp_path):
    # textworld's rl.algorithm is step_gae (ppo_step); a run of methods=[grpo_outcome, rft] matches grpo_outcome
    cfg = tiny_cfg(tmp_path, "methods=[grpo_outcome, rft]", "rl.algorithm=gae")
    with pytest.raises(ConfigError, match=r"grpo_outcome has no training record .*--seconds"):
        rl_seconds(cfg)
    path = history_path(cfg, "grpo_outcome")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps([{"iteration": 1, "time/iteration_s": 7.0}]))
    assert matched_method(cfg) == "grpo_outcome" and rl_seconds(cfg) == 7.0
    assert matched_method(tiny_cfg(tmp_path, "methods=[ppo, grpo]", "rl.algorithm=grpo")) == "grpo"  # rl.algorithm's when trained


def test_register_takes_the_first_trained_method_when_rl_algorithm_is_not_one(tmp_path, tok, make_model):
    from agent_r1.learner.learner import save_hf_checkpoint
    from agent_r1.pipeline.state import checkpoint_dir
    from agent_r1.tracking import Tracker

    cfg = tiny_cfg(tmp_path, "methods=[grpo+member, grpo+relift]", "rl.algorithm=grpo", "rl.demo_pool=all")
    for method, em in (("grpo+member", 0.25), ("grpo+relift", 0.5)):  # what train and evaluate leave
        save_hf_checkpoint(make_model(seed=0), checkpoint_dir(cfg, method), tok)
    (cfg.out / "metrics").mkdir(parents=True)
    (cfg.out / "metrics" / "eval.json").write_text(json.dumps({"test": {"sft": {"em": 0.1}, "grpo+member": {"em": 0.25},
                                                                         "grpo+relift": {"em": 0.5}}}))
    tracker = Tracker(f"sqlite:///{tmp_path}/m.db", experiment="test")
    run = tracker.start_pipeline_run("p", {})
    out = stages.register(cfg, tracker, run)  # not test/grpo/em: grpo was not trained
    assert out["score"] == 0.25 and out["alias"] == "champion"
    assert tracker.alias_version(cfg.registry.model_name, "champion")["tags"]["method"] == "grpo+member"


@pytest.mark.slow
def test_control_stops_at_its_time_budget(tmp_path):
    import time

    cfg = tiny_cfg(tmp_path, "sft.epochs=0.05")
    stages.prepare(cfg)
    stages.sft(cfg)
    t0 = time.perf_counter()
    out = control(cfg, seconds=1.0)
    assert time.perf_counter() - t0 < 30  # one step past the budget, not a whole pass
    assert (out / "model.safetensors").exists() and out == cfg.out / "checkpoints" / "sft_control"


def test_a_single_hotpotqa_file_prepares_a_test_split_only(tmp_path):
    cfg = load_config("default", "pipelines.yaml", parse_overrides(
        [f"output_dir={tmp_path}", "data.source=hotpotqa", f"data.path={HOTPOTQA / 'dev.jsonl'}", "sft.worlds=0"]))
    info = stages.prepare(cfg)
    assert info["test_questions"] == 300 and "train_questions" not in info
    assert not (tmp_path / "data" / "train.parquet").exists()


def test_a_tiny_vocabulary_the_text_cannot_fill_is_rejected(tmp_path):
    cfg = tiny_cfg(tmp_path, "model.tiny.vocab_size=4096")  # 24 films give ~720 BPE tokens
    stages.prepare(cfg)
    with pytest.raises(ConfigError, match=r"model.tiny.vocab_size: 4096 tokens asked, .* only \d+ .* at most \d+"):
        stages.sft(cfg)
    assert not (cfg.out / "checkpoints" / "sft").exists()
