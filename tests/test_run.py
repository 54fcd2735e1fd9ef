"""Config validation, oracle demonstrations, and the default run end to end (tiny sizes)."""

import json
import statistics

import pytest
from transformers import AutoModelForCausalLM

from agent_r1.checkpoints import trained_settings
from agent_r1.config import ConfigError, load_config, parse_overrides
from agent_r1.context import ContextManager
from agent_r1.data.synthetic import WorldConfig, generate
from agent_r1.envs import MultiHopQAEnv
from agent_r1.models import train_tokenizer
from agent_r1.pipeline import STAGES, run_all
from agent_r1.run import tasks_for
from agent_r1.sft import demonstration
from agent_r1.tools import SearchIndex, make_search_tool
from agent_r1.trajectory import load_parquet
from tests.machine_metrics import of_the_run


def test_repo_pipelines_file_is_valid():
    cfg = load_config("default", "pipelines.yaml")
    assert cfg.name == "default" and cfg.rl.algorithm == "grpo"


@pytest.mark.parametrize(
    "override, key",
    [
        ("rl.bogus=1", "rl.bogus"),
        ("env.top_k=zero", "env.top_k"),
        ("sft.epochs=-1", "sft.epochs"),
        ("rl.learner.zero_stage=7", "rl.learner.zero_stage"),
    ],
)
def test_bad_config_values_are_named(override, key):
    with pytest.raises(ConfigError) as err:
        load_config("default", "pipelines.yaml", parse_overrides([override]))
    assert key in str(err.value) and "'default'" in str(err.value)


def test_unknown_algorithm_and_pipeline_are_named(tmp_path):
    with pytest.raises(ConfigError, match="rl.algorithm: .*'ppo2'.*grpo"):
        load_config("default", "pipelines.yaml", parse_overrides(["rl.algorithm=ppo2"]))
    (tmp_path / "p.yaml").write_text("pipelines:\n  a: {}\n")
    with pytest.raises(ConfigError, match="no pipeline named 'b'"):
        load_config("b", tmp_path / "p.yaml")
    with pytest.raises(ConfigError, match="must look like"):
        parse_overrides(["rl.iterations"])


def test_oracle_demonstration_is_tokenized_like_a_rollout():
    world = generate(WorldConfig(seed=3, n_films=8, n_directors=4, n_studios=2, n_cities=4))
    search = make_search_tool(SearchIndex(world.corpus), top_k=1)
    tok = train_tokenizer(list(world.corpus["text"]) + list(world.questions["question"]), vocab_size=400)
    task = tasks_for(world.questions[world.questions.split == "train"], [2], limit=1)[0]
    ctx = ContextManager(tok)
    env = MultiHopQAEnv(search_tool=search, system_prompt=None)
    demo = demonstration(env, task, ctx)
    assert len(demo.steps) == len(task["search_chain"]) + 1
    for step, entity in zip(demo.steps, task["search_chain"]):
        assert entity in tok.decode(step.action_ids) and step.action_ids[-1] == tok.eos_token_id
        # the observation is the real search result for that entity
        assert step.observation[0]["content"].startswith(f"(1) {entity}:")
    assert tok.decode(demo.steps[-1].action_ids[:-1]) == f"<answer>{task['answers'][0]}</answer>"
    # every step's context extends the previous context + action: one packed training sequence
    for prev, nxt in zip(demo.steps, demo.steps[1:]):
        assert nxt.context_ids[: len(prev.context_ids) + len(prev.action_ids)] == prev.context_ids + prev.action_ids
    # replaying the demonstration through the env gives the oracle's reward
    env.reset(task)
    for step in demo.steps:
        res = env.step(step.action_text)
    assert res.done and res.info.metrics["em"] == 1.0


# the tiny pipeline at test sizes (a run in well under a minute)
TINY_RUN = ["data.n_films=24", "data.n_directors=8", "data.n_studios=4", "sft.worlds=1", "sft.epochs=1.8", "rl.iterations=2",
            "rl.tasks_per_iteration=4", "rl.group_size=2", "eval.max_per_hop=4", "model.tiny.num_layers=1",
            "model.tiny.hidden_size=32", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
            "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400"]


def test_the_wall_time_table_has_a_row_per_stage_and_their_sum():
    """What `make run` prints at its end (flows/training.py): stage, seconds, the sum, the pipeline's wall time."""
    from agent_r1.pipeline.stages import timings_markdown

    text = timings_markdown({"prepare_s": 2.4, "sft_s": 177.2, "train_s": 735.0, "evaluate_s": 143.3, "register_s": 4.0,
                             "total_s": 1064.0})
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert rows == ["| prepare | 2 |", "| sft | 177 |", "| train | 735 |", "| evaluate | 143 |", "| register | 4 |",
                    "| sum of stages | 1062 |", "| pipeline (wall) | 1064 |"]


@pytest.mark.slow
def test_default_run_end_to_end_on_tiny_sizes(tmp_path):
    cfg = load_config("tiny", "pipelines.yaml", parse_overrides([f"output_dir={tmp_path}"] + TINY_RUN))
    out = run_all(cfg)
    results = out["eval"]
    # the one stage sequence, in STAGES' order (register needs MLflow tracking, off here)
    assert [k.removesuffix("_s") for k in out["timings"]] == [s for s in STAGES if s != "register"] + ["total"]
    written = json.loads((tmp_path / "metrics" / "eval.json").read_text())
    assert written == json.loads(json.dumps(results))
    card = json.loads((tmp_path / "metrics" / "model.json").read_text())  # what was trained, beside it
    assert card["name_or_path"].startswith("tiny") and card["parameters"] > 10_000
    assert card["precision"] == "fp32" and card["precision_setting"] == "auto"  # what it computed in, on any CPU
    assert not (tmp_path / "state" / "rl").exists()  # resume state is dropped once a stage is done
    assert set(written) == {"test", "test_1hop", "test_2hop", "test_3hop"}
    for split in written.values():
        assert set(split) == {"base_tool_call", "naive_rag", "sft", "grpo"}
        assert {"em", "f1", "n", "tool_calls", "format_error_rate", "turns"} <= set(split["sft"])
    assert written["test_2hop"]["grpo"]["n"] == 4
    history = json.loads((tmp_path / "metrics" / "train" / "grpo.json").read_text())
    assert [h["iteration"] for h in history] == [1, 2]
    for path in ("checkpoints/base", "checkpoints/sft", "rl/grpo"):
        AutoModelForCausalLM.from_pretrained(tmp_path / path)
        # the env settings it was trained with, which evaluation uses again
        assert trained_settings(tmp_path / path) == {"pipeline": "tiny", "env": cfg.env.model_dump(mode="json")}
    # the first iteration's rollout is stored, to read in pandas and replay
    stored = load_parquet(tmp_path / "rollouts" / "grpo" / "iteration_00001.parquet")
    assert len(stored) == cfg.rl.tasks_per_iteration * cfg.rl.group_size and all(t.stop_reason for t in stored)
    assert statistics.fmean(t.total_reward for t in stored) == pytest.approx(history[0]["reward_mean"])

    # the same machine, seed and config give the same metrics (wall times aside)
    again = run_all(load_config("tiny", "pipelines.yaml", parse_overrides([f"output_dir={tmp_path / 'again'}"] + TINY_RUN)))
    assert again["eval"] == results
    history_again = json.loads((tmp_path / "again" / "metrics" / "train" / "grpo.json").read_text())
    assert [of_the_run(h) for h in history_again] == [of_the_run(h) for h in history]


def _demo_setup(tmp_path, overrides):
    """A small world written under tmp_path, its training split, a tokenizer and an agent without a model."""
    from agent_r1.run import Agent, make_tools, prepare_data
    from agent_r1.data.synthetic import load_split

    cfg = load_config("tiny", "pipelines.yaml", parse_overrides(overrides + [f"output_dir={tmp_path}"]))
    data_dir = prepare_data(cfg)
    train = load_split(data_dir, "train")
    tok = train_tokenizer(list(train["question"]) * 3, vocab_size=400)
    return cfg, Agent(None, tok, make_tools(cfg, data_dir), cfg), tok, train


def test_demonstrations_from_fresh_worlds_do_not_reuse_the_training_split(tmp_path):
    from agent_r1.run import oracle_demonstrations

    # two-word names: every entity of every world is new (single-word names recur across
    # worlds, with their facts drawn afresh)
    small = ["data.n_films=12", "data.n_directors=4", "data.n_studios=3", "data.name_words=2", "sft.worlds=2"]
    cfg, agent, tok, train = _demo_setup(tmp_path, small)
    fresh = oracle_demonstrations(cfg, agent, agent.context(), train)
    own = oracle_demonstrations(cfg.model_copy(update={"sft": cfg.sft.model_copy(update={"worlds": 0})}), agent, agent.context(), train)
    assert {d.task_id for d in own} <= set(train["id"])
    questions = lambda demos: {tok.decode(d.steps[0].context_ids) for d in demos}
    assert len(fresh) > len(own)  # two whole worlds (both of their splits) vs one training split
    assert not questions(fresh) & questions(own)


def test_scarce_question_types_are_demonstrated_n_times_per_world(tmp_path):
    from agent_r1.run import oracle_demonstrations

    small = ["data.n_films=16", "data.n_directors=6", "data.n_studios=3", "sft.worlds=2", "sft.scarce={director_spouse: 3}"]
    cfg, agent, tok, train = _demo_setup(tmp_path, small)
    demos = oracle_demonstrations(cfg, agent, agent.context(), train)
    question = lambda d: tok.decode(d.steps[0].context_ids)
    scarce = [d for d in demos if "director of" in question(d) and "married to" in question(d)]
    assert len(scarce) == 3 * 2  # three per fresh world
    assert all(len(d.steps) == 3 for d in scarce)  # two searches, then the answer
    assert not any("director of" in question(d) and "born" in question(d) for d in demos)  # not asked for
    # the fully demonstrated types are all there: every one-hop question of both worlds
    assert sum(len(d.steps) == 2 for d in demos) > 50


def test_unknown_question_types_are_named():
    for override, key in (("sft.scarce={dirctor_spouse: 3}", "sft.scarce"), ("sft.qtypes=[studio_citty]", "sft.qtypes"),
                          ("rl.qtypes=[director_brithplace]", "rl.qtypes")):
        with pytest.raises(ConfigError, match=f"{key}: unknown question type"):
            load_config("default", "pipelines.yaml", parse_overrides([override]))
    with pytest.raises(ConfigError, match=r"sft.scarce: \['studio'\] already demonstrated in full"):
        load_config("default", "pipelines.yaml", parse_overrides(["sft.scarce={studio: 3}"]))
    with pytest.raises(ConfigError, match="sft.scarce.director_spouse: Input should be greater than 0"):
        load_config("default", "pipelines.yaml", parse_overrides(["sft.scarce={director_spouse: 0}"]))
