"""The textworld environment against real TextWorld games made by tw-make (agent_r1/envs/text_game.py,
agent_r1/data/text_games.py): game generation, rewards, commands that would crash the interpreter,
a game engine killed or hung mid-episode, no process outliving the trainer, and 20+ turn episodes
under the window and summary contexts."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("textworld")

from agent_r1.context import SlidingWindow, Summary  # noqa: E402
from agent_r1.data import task_records  # noqa: E402
from agent_r1.data.text_games import GamesConfig, game_seed, write_text_games  # noqa: E402
from agent_r1.envs import TextWorldEnv  # noqa: E402
from agent_r1.envs.text_game import GameEngine, GameEngineError, clean_feedback, parse_command  # noqa: E402
from agent_r1.models import train_tokenizer  # noqa: E402
from agent_r1.rollout import SamplingParams, ScriptedEngine, play_policy, run_episodes  # noqa: E402
from agent_r1.trajectory import to_sequences  # noqa: E402
from tests.procs import group, group_ends  # noqa: E402


# the textworld-tiny pipeline's games (data.games), but 3 train games, and data seed 7
GAMES = GamesConfig(train_games=3, test_games=2, train_quest_lengths=[1, 2], test_quest_lengths=[3])
SETTINGS = ["data.seed=7", "data.games.train_games=3"]  # textworld-tiny with these makes GAMES with data seed 7


@pytest.fixture(scope="module")
def games(tmp_path_factory) -> Path:
    """Three train games (quests of 1 and 2) and two test games (quests of 3)."""
    return write_text_games(GAMES, data_seed=7, out=tmp_path_factory.mktemp("games"))


def tasks(games: Path, split: str) -> list[dict]:
    return task_records(pd.read_parquet(games / f"{split}.parquet"))


def make_env(games: Path, **kw) -> TextWorldEnv:
    env = TextWorldEnv([], **({"max_turns": 30} | kw))
    env.data_dir = games
    return env


def pids_alive(pids) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
            if state != "Z":
                alive.append(pid)
        except (ProcessLookupError, FileNotFoundError):
            pass
    return alive


def test_the_games_are_generated_with_disjoint_seeds_and_longer_test_quests(games):
    train, test = tasks(games, "train"), tasks(games, "test")
    assert [t["hops"] for t in train] == [1, 2, 1] and [t["hops"] for t in test] == [3, 3]
    assert {t["seed"] for t in train}.isdisjoint({t["seed"] for t in test})
    assert test[0]["seed"] == game_seed(7, "test", 0) != game_seed(7, "train", 0)
    for t in train + test:
        assert (games / t["game"]).exists() and not Path(t["game"]).is_absolute()  # relative: the data folder moves
        assert len(t["walkthrough"]) >= t["hops"]


def test_the_walkthrough_wins_with_the_games_process_rewards(games):
    task = tasks(games, "test")[0]
    env = make_env(games, process_reward=0.5)
    messages = env.reset(task)
    assert "Admissible commands:" in messages[-1]["content"] and "$$" not in messages[-1]["content"]  # no banner
    rewards = []
    for k, command in enumerate(task["walkthrough"]):
        res = env.step(command)
        rewards.append(res.reward)
        assert res.done == (k == len(task["walkthrough"]) - 1)
    assert rewards == [0.5] * len(rewards)  # +1 per step towards the quest, scaled
    assert res.info.stop_reason == "won" and res.info.final_reward == 1.0
    assert res.info.metrics == {"won": 1.0, "score_fraction": 1.0, "invalid_commands": 0.0,
                                "process_reward": float(len(rewards))}
    assert env.engine is None  # the game's process ended with the episode


def test_bad_commands_are_counted_and_never_crash_the_interpreter(games):
    env = make_env(games, max_turns=10)
    env.reset(tasks(games, "train")[0])
    empty = env.step("   \n ")
    assert empty.info.format_error and "Error: write one game command" in empty.observation[0]["content"]
    for turn in ["xyzzy", "\\q", "é\x00\x14 ☃ go", "take\\n everything " * 20]:  # frotz escapes, non-ASCII, long
        res = env.step(turn)
        assert not res.done and res.observation[0]["role"] == "user"
    res = env.end("max_turns")
    assert res.info.metrics["invalid_commands"] == 4 and env.metrics["format_errors"] == 1
    assert parse_command('> "Go North."\nsecond line') == "Go North"


def test_clean_feedback_drops_the_prompt_and_status_line():
    raw = "\n-= Pantry =-\nA pantry.\n\n\n\n>                         -= Pantry =-0/3"
    assert clean_feedback(raw) == "-= Pantry =-\nA pantry."


def test_a_game_engine_killed_or_hung_mid_episode_ends_only_its_episode(games):
    """Two episodes; after the first turn one engine is killed (or stopped: it never answers);
    that episode ends with env_error, the other plays on and wins."""
    task = tasks(games, "train")[0]
    made: list[TextWorldEnv] = []

    def factory():
        made.append(make_env(games, max_turns=6, step_timeout_s=2))
        return made[-1]

    tok = train_tokenizer(["go take open look"], vocab_size=300)
    for sig in (signal.SIGKILL, signal.SIGSTOP):
        made.clear()

        class Killer(ScriptedEngine):
            def generate(self, contexts, params):
                if self.calls == 1:
                    os.kill(made[0].engine.pid, sig)
                return super().generate(contexts, params)

        engine = Killer(tok, ["look"] + list(task["walkthrough"]))  # each turn, for every episode still running
        trajs = run_episodes(engine, factory, [task, task], SlidingWindow(tok, window=2), SamplingParams(max_new_tokens=40))
        assert trajs[0].stop_reason == "env_error" and "game engine" in trajs[0].error
        assert trajs[1].stop_reason == "won", trajs[1].error


def test_no_game_process_or_folder_outlives_a_killed_trainer(games):
    """The game server and its games die with a SIGKILLed trainer (its watchdog ends the group),
    and no games folder is left: the server's working folder was removed as it was entered."""
    task = tasks(games, "train")[0]
    script = textwrap.dedent(f"""
        import os
        from agent_r1.envs import TextWorldEnv
        envs = []
        for _ in range(3):
            env = TextWorldEnv([], max_turns=5)
            env.reset({{"id": "x", "game": {str(games / task["game"])!r}, "walkthrough": []}})
            envs.append(env)
        from agent_r1.envs import text_game
        print(text_game._SERVER.process.pid, *[e.engine.pid for e in envs], flush=True)
        os.read(0, 1)
    """)
    before = set(Path(tempfile.gettempdir()).glob("agent-r1-games-*"))  # the other worker makes agent-r1-model-* folders
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    watchdog, *game_pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(group(watchdog)) == 5 and len(pids_alive(game_pids)) == 3  # the watchdog, the server, 3 games
    [server] = [p for p in group(watchdog) if p != watchdog and p not in game_pids]
    workdir = os.readlink(f"/proc/{server}/cwd")
    assert workdir.endswith(" (deleted)") and Path(workdir).name.startswith("agent-r1-games-")
    proc.kill()
    proc.wait()
    assert group_ends(watchdog), f"left: {group(watchdog)}"
    assert not set(Path(tempfile.gettempdir()).glob("agent-r1-games-*")) - before


def test_commands_about_the_game_itself_are_refused(games):
    """`restart` then `yes` would start the game over under a score that no longer counts: the
    walkthrough would then win with score 0 and a final reward of 0.5. Refused, it wins with 1.0.
    A game's own `save` fails: its working folder is gone."""
    task = tasks(games, "test")[0]
    env = make_env(games)
    env.reset(task)
    first, *rest = task["walkthrough"]
    assert env.step(first).reward == 1.0
    for command in ["restart", "yes", "Save", "script on", "quit", "y", "undo"]:
        res = env.step(command)
        assert res.reward == 0.0 and not res.done
        if command not in ("yes", "y"):
            assert res.observation[0]["content"].startswith(f"`{command}` is a command about the game itself, not "
                                                            "played here; write a game command.")
    for command in rest:
        res = env.step(command)
    assert res.info.stop_reason == "won" and res.info.final_reward == 1.0
    assert res.info.metrics["score_fraction"] == 1.0 and res.info.metrics["invalid_commands"] == 7
    engine = GameEngine(games / task["game"])
    engine.start()
    assert "Save failed" in engine.step("save")["feedback"]
    engine.close()


@pytest.mark.parametrize("context", ["window", "summary"])
def test_a_25_turn_episode_trains_on_the_tokens_the_policy_saw(games, context):
    task = tasks(games, "test")[0]
    tok = train_tokenizer(["go north south east west look inventory take open close"], vocab_size=400)
    ctx = SlidingWindow(tok, window=2) if context == "window" else Summary(tok, budget=300, keep=2)
    engine = ScriptedEngine(tok, ["look", "inventory"] * 12 + ["look"])
    trajs = run_episodes(engine, lambda: make_env(games, max_turns=25), [task], ctx, SamplingParams(max_new_tokens=8))
    traj = trajs[0]
    assert traj.stop_reason == "max_turns" and len(traj.steps) == 25
    rows = to_sequences(traj, 0)
    assert len(rows) == 25  # not one prefix chain: one row per step
    for step, row in zip(traj.steps, rows):
        assert row.ids == step.context_ids + step.action_ids  # exactly what the policy saw, then its action
        assert sum(row.action) == len(step.action_ids)
    assert max(len(s.context_ids) for s in traj.steps) < 2 * len(traj.steps[2].context_ids)  # bounded, not growing


def test_each_step_records_the_state_it_started_from(games):
    task = tasks(games, "test")[0]
    tok = train_tokenizer(["look inventory"], vocab_size=300)
    engine = ScriptedEngine(tok, [["look", "inventory"], "look", "look"])
    a, b = run_episodes(engine, lambda: make_env(games, max_turns=3), [task, task], SlidingWindow(tok, window=1),
                        SamplingParams(max_new_tokens=8), group_ids=[0, 0])
    keys = [s.state_key for s in a.steps]
    assert keys[0] == b.steps[0].state_key and "Admissible commands:" in keys[0]  # the same game starts the same
    assert keys[1] == keys[2] != keys[0]  # after "look" and after a second "look": the same state
    assert b.steps[1].state_key != keys[1]  # after "inventory": another observation
    assert all(k == " ".join(k.split()) for k in keys)


def test_the_random_and_oracle_baselines(games):
    from agent_r1.pipeline.stages import policy_turns

    test = tasks(games, "test")
    oracle = play_policy(lambda: make_env(games, max_turns=8), test, policy_turns("oracle", 0))
    assert [t.stop_reason for t in oracle] == ["won", "won"]
    rand = play_policy(lambda: make_env(games, max_turns=8), test, policy_turns("random", 0))
    assert all(len(t.steps) <= 8 and t.metrics["invalid_commands"] == 0 for t in rand)  # admissible only


def test_a_missing_game_file_is_an_episode_error(games, tmp_path):
    env = make_env(tmp_path)
    with pytest.raises(FileNotFoundError, match="run the prepare stage"):
        env.reset({"id": "x", "game": "games/nope.z8", "walkthrough": []})
    with pytest.raises(GameEngineError, match="game engine"):
        bad = tmp_path / "bad.z8"
        bad.write_bytes(b"not a game")
        env.reset({"id": "x", "game": str(bad), "walkthrough": []})


@pytest.mark.slow
def test_the_textworld_tiny_pipeline_trains_both_methods_and_scores_the_baselines(games, tmp_path):
    """`agent-r1 train -p textworld-tiny` on the module's tw-make games (a copy in its data folder,
    made for the settings the run asks for: kept, not made again), walkthrough SFT, PPO on step-level
    GAE with the game's process rewards and GRPO on the final reward alone, evaluated beside the
    random, base-model and walkthrough baselines."""
    import json

    shutil.copytree(games, tmp_path / "data")
    stamp = tmp_path / "data" / "games" / "settings.json"
    made = stamp.stat().st_mtime_ns
    sets = [x for s in [f"output_dir={tmp_path}", *SETTINGS] for x in ("-s", s)]
    out = subprocess.run([sys.executable, "-m", "agent_r1.cli", "train", "-p", "textworld-tiny", "--no-track", *sets],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert stamp.stat().st_mtime_ns == made  # the prepare stage asked for these games: kept
    test = json.loads((tmp_path / "metrics" / "eval.json").read_text())["test"]
    assert set(test) == {"random", "base_tool_call", "oracle", "sft", "ppo_step", "grpo_outcome"}
    assert test["oracle"]["won"] == 1.0 and test["oracle"]["score_fraction"] == 1.0
    assert test["random"]["invalid_commands"] == 0.0
    assert all({"won", "score_fraction", "invalid_commands", "turns"} <= set(m) for m in test.values())
    for method in ("ppo_step", "grpo_outcome"):
        history = json.loads((tmp_path / "metrics" / "train" / f"{method}.json").read_text())
        assert len(history) == 2 and "won" in history[0]


def test_config_errors_name_the_setting():
    from agent_r1.config import ConfigError, load_config, parse_overrides

    def load(name, *overrides):
        return load_config(name, "pipelines.yaml", parse_overrides(["output_dir=/tmp/x", *overrides]))

    cfg = load("textworld")
    assert cfg.env.name == "textworld" and cfg.methods == ["ppo_step", "grpo_outcome"]
    for name, override, message in (
        ("tiny", "eval.baselines=[random]", "random picks among the turns an environment lists"),
        ("textworld", "data.games.world_sizes=3", "world_sizes"),
        ("textworld", "data.games.test_games=0", "test_games"),
    ):
        with pytest.raises((ConfigError, ValueError), match=message):
            load(name, override)


def test_games_made_for_the_same_settings_are_kept(games):
    before = {p.name: p.stat().st_mtime_ns for p in (games / "games").iterdir()}
    write_text_games(GAMES.model_copy(), data_seed=7, out=games)
    assert {p.name: p.stat().st_mtime_ns for p in (games / "games").iterdir()} == before
