"""The config loader rejects every malformed pipelines file and every out-of-range or unknown
value with one message that names the file and the dotted key; nothing falls back silently."""

import pytest

from agent_r1.config import ConfigError, load_config, parse_overrides

GOOD = b"pipelines:\n  a:\n    rl: {iterations: 3}\n  b: {extends: a}\n"


@pytest.mark.parametrize("text, message", [
    (b"pipelines:\n  - a\n  - b\n", "'pipelines' must map pipeline names to their keys; found a list"),
    (b"pipelines:\n", "'pipelines' must map pipeline names to their keys; found nothing (null)"),
    (b"pipelines: {}\n", "'pipelines' must map pipeline names to their keys; found a mapping"),
    (b"pipelines:\n  a: just a string\n", "pipelines.a: must be a mapping of config keys; found a string"),
    (b"pipelines:\n  a: [1, 2]\n", "pipelines.a: must be a mapping of config keys; found a list"),
    (b"pipelines:\n  a: {extends: [default]}\n  default: {}\n", "pipelines.a.extends: must be one pipeline's name; found a list"),
    (b"pipelines:\n  a: {}\n  1: {}\n", "pipeline name 1 is not a string"),
    (b"- pipelines\n", "expected a mapping with one key, 'pipelines'; found a list"),
    (b"", "expected a mapping with one key, 'pipelines'; found nothing (null)"),
    (b"pipelines: {a: {}}\nextra: 1\n", "expected a mapping with one key, 'pipelines'; found ['extra', 'pipelines']"),
    (b"pipelines:\n  a: {rl: {iterations: 3}\n", "line 3 column 1: invalid YAML: expected ',' or '}'"),
    (b"pipelines:\n  a:\n\trl: {}\n", "line 3 column 1: invalid YAML: found character '\\t' that cannot start any token"),
    (b"pipelines:\n  a: {}\n---\npipelines: {}\n", "line 3 column 1: invalid YAML: but found another document"),
    (b"pipelines:\n  a: {name: caf\xe9}\n", "line 2: not UTF-8 text (byte 0xe9)"),
    (b"pipelines:\n  a:\n    rl: {iterations: 3}\n    rl: {group_size: 2}\n", "line 4: key 'rl' is given twice"),
    (b"pipelines:\n  a: {}\n  a: {}\n", "line 3: key 'a' is given twice"),
])
def test_malformed_pipelines_files_are_one_clear_error(tmp_path, text, message):
    f = tmp_path / "p.yaml"
    f.write_bytes(text)
    with pytest.raises(ConfigError) as err:
        load_config("a", f)
    assert str(err.value).startswith(f"{f}: {message}") and "\n" not in str(err.value)


def test_a_yaml_merge_key_may_be_overridden_and_a_good_file_loads(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_bytes(GOOD + b"  c:\n    rl: &r {iterations: 4, group_size: 2}\n  d:\n    rl:\n      <<: *r\n      iterations: 5\n")
    assert load_config("b", f).rl.iterations == 3
    assert (load_config("d", f).rl.iterations, load_config("d", f).rl.group_size) == (5, 2)


def test_a_missing_config_file_is_an_error_not_the_defaults(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=f"{tmp_path / 'nope.yaml'}: config file not found"):
        load_config("default", tmp_path / "nope.yaml")
    monkeypatch.chdir(tmp_path)  # no ./pipelines.yaml: no path means the built-in defaults
    assert load_config().name == "default"
    with pytest.raises(ConfigError, match="no pipelines file"):
        load_config("other")


@pytest.mark.parametrize("override, message", [
    ("model.tiny.vocab_size=-5", "model.tiny.vocab_size: must be >= 260, got -5"),
    ("model.tiny.num_heads=0", "model.tiny.num_heads: must be >= 1, got 0"),
    ("model.tiny.num_layers=0", "model.tiny.num_layers: must be >= 1"),
    ("model.tiny.num_kv_heads=0", "model.tiny.num_kv_heads: must be >= 1"),
    ("model.tiny.intermediate_size=0", "model.tiny.intermediate_size: must be >= 1"),
    ("model.tiny.hidden_size=130", "model.tiny.hidden_size: 130 must be num_heads (4) times an even head size"),
    ("model.tiny.hidden_size=12", "model.tiny.hidden_size: 12 must be num_heads (4) times an even head size"),
    ("model.tiny.num_kv_heads=3", "model.tiny.num_heads: 4 must be a multiple of num_kv_heads (3)"),
    ("model.tiny.rope_theta=.nan", "model.tiny.rope_theta: must be a finite number, got nan"),
    ("model.tiny.rope_theta=0", "model.tiny.rope_theta: must be > 0"),
    ("model.tiny.max_position_embeddings=512", "model.tiny.max_position_embeddings: 512 is shorter than env.max_context_tokens (1024)"),
    ("rl.learner.policy_loss=ppo2", "rl.learner.policy_loss: unknown 'ppo2'; known: gspo, ppo, vanilla"),
    ("rl.learner.loss_agg=mean", "rl.learner.loss_agg: unknown 'mean'; known: token-mean, seq-mean-token-mean"),
    ("rl.learner.kl_kind=k4", "rl.learner.kl_kind: unknown 'k4'; known: k1, k2, k3"),
    ("rl.learner.lr=.inf", "rl.learner.lr: must be a finite number, got inf"),
    ("rl.learner.clip_low=5", "rl.learner.clip_low: must be < 1, got 5.0"),
    ("rl.learner.dual_clip=0.5", "rl.learner.dual_clip: must be > 1 (or null to disable), got 0.5"),
    ("env.retrieval_bonus=.nan", "env.retrieval_bonus: Input should be a finite number"),
    ("env.tool_timeout_s=.inf", "env.tool_timeout_s: Input should be a finite number"),
    ("sft.epochs=.inf", "sft.epochs: Input should be a finite number"),
    ("eval.hops=[0,-1,99]", "eval.hops.0: Input should be greater than 0"),
    ("eval.hops=[2,99]", "eval.hops: no synthetic questions with [99] hops; available: [1, 2, 3]"),
    ("eval.hops=[]", "eval.hops: must name at least one hop count"),
    ("rl.hops=[4]", "rl.hops: no synthetic questions with [4] hops"),
    ("eval.split=nosuch", "eval.split: Input should be 'train', 'val' or 'test'"),
    ("registry.split=dev", "registry.split: Input should be 'train' or 'test'"),
    ("output_dir=''", "output_dir: '' is not a folder of its own"),
    ("output_dir=/", "output_dir: '/' is not a folder of its own"),
    ("output_dir=.", "output_dir: '.' is not a folder of its own"),
    ("methods=[grpo,grpo]", "methods: a method is listed twice"),
    ("data.source=hotpotqa", "data.path: must name a HotpotQA file or folder"),
])
def test_out_of_range_and_unknown_values_name_their_key(override, message):
    with pytest.raises(ConfigError) as err:
        load_config("tiny", "pipelines.yaml", parse_overrides([override, "sft.worlds=0"]))
    assert message in str(err.value) and "pipeline 'tiny' (pipelines.yaml)" in str(err.value)


def test_one_problem_is_one_line_and_several_are_listed():
    with pytest.raises(ConfigError) as err:
        load_config("default", "pipelines.yaml", parse_overrides(["rl.learner.kl_kind=k4"]))
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config("default", "pipelines.yaml", parse_overrides(["rl.learner.kl_kind=k4", "rl.learner.clip_low=2"]))
    assert str(err.value).splitlines()[1:] == ["  rl.learner.kl_kind: unknown 'k4'; known: k1, k2, k3",
                                               "  rl.learner.clip_low: must be < 1, got 2.0"]


def test_an_override_that_is_not_yaml_is_named():
    with pytest.raises(ConfigError, match=r"override 'rl.iterations=\[': .*invalid YAML"):
        parse_overrides(["rl.iterations=["])


def test_hotpotqa_hop_lists_must_select_its_two_hop_questions():
    hotpot = ["data.source=hotpotqa", "data.path=x", "sft.worlds=0"]
    assert load_config("default", "pipelines.yaml", parse_overrides(hotpot)).eval.hops == [1, 2, 3]  # 2 is there
    with pytest.raises(ConfigError, match=r"eval.hops: no hotpotqa questions with \[1, 3\] hops; available: \[2\]"):
        load_config("default", "pipelines.yaml", parse_overrides(hotpot + ["eval.hops=[1,3]"]))


def test_the_synthetic_world_has_one_set_of_defaults():
    from agent_r1.config import DataConfig
    from agent_r1.data.synthetic import WorldConfig

    assert DataConfig().world() == WorldConfig()


def test_the_learners_temperature_is_the_sampling_temperature():
    """rl.learner.temperature divides the logits of the update's log-probs: with another
    rl.temperature they are not those of the distribution the episodes were sampled from."""
    with pytest.raises(ConfigError) as err:
        load_config("tiny", "pipelines.yaml", parse_overrides(["rl.temperature=0.7"]))
    assert "\n" not in str(err.value)
    assert "rl.learner.temperature: 1.0 differs from rl.temperature (0.7); set both to the same value" in str(err.value)
    cfg = load_config("tiny", "pipelines.yaml", parse_overrides(["rl.temperature=0.7", "rl.learner.temperature=0.7"]))
    assert cfg.rl.learner.temperature == cfg.rl.temperature == 0.7


def test_every_pipeline_of_the_file_loads():
    """Each named pipeline passes every check (e.g. code sets both temperatures to 0.7)."""
    import yaml

    for name in yaml.safe_load(open("pipelines.yaml"))["pipelines"]:
        load_config(name, "pipelines.yaml")
