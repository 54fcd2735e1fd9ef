"""The ``textworld`` environment: play a text game, one command per turn, rewarded by the game.

Games are TextWorld games (``tw-make``, agent_r1/data/text_games.py; ``pip install -e
".[textworld]"``). A task row names its game file (``game``, relative to the prepared data's
folder) and its walkthrough. Each turn the model writes one game command as plain text: the
turn's first non-blank line is the command (``go east``, ``take red key``). A plain command and
not a tool call: an episode is 20+ turns, and the hermes wrapper would cost ~20 tokens a turn,
the game's own parser already judges the command, and an untrained chat model writes commands
without being taught a format. An empty turn is a format error.

- Observations: the game's feedback, cleaned of the banner, the ``>`` prompt and the status line,
  as a user message; with ``admissible_commands`` on, followed by the commands the game accepts.
- Step reward: the game's intermediate reward (+1 a step towards the quest, -1 a step away,
  0 neither) times ``process_reward``.
- Final reward: half for winning, half for the score as a fraction of the maximum.
- Commands about the game itself (``restart``, ``quit``, ``save``, ``restore``, ``undo``,
  ``script``, ...: `META_COMMANDS`) never reach the game: they would reset the score under a game
  that still counts as won, or write files. The observation says so; the turn counts as an
  invalid command and earns no reward.
- An episode ends when the game is won or lost (``stop_reason`` ``won`` / ``lost``) or at
  ``max_turns``.

Every game runs in its own process, forked from a server process that has TextWorld loaded
(agent_r1/envs/game_server.py: a few ms a game). A game engine that raises, dies or does not
answer within ``step_timeout_s`` is killed, and its episode ends with an environment error
(``stop_reason="env_error"``); the run goes on. A game process ends with its episode; the server
and every game process die with the trainer (agent_r1/lifetime.py), and the server leaves no
folder behind (agent_r1/envs/game_server.py).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import re
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path

from agent_r1 import lifetime
from agent_r1.envs.metrics import Metric
from agent_r1.envs.tool_env import EnvStep, StepInfo, ToolEnv

SYSTEM_PROMPT = ("You are playing a text adventure game. Reach the goal the game gives you. Reply with exactly one "
                 "game command per turn, such as: go north, take key, open chest, unlock door with key.")
# Inform 7's out-of-world commands (first words): the game itself, not its world
META_COMMANDS = frozenset({"restart", "quit", "q", "save", "restore", "undo", "oops", "script", "transcript",
                           "unscript", "noscript", "verbose", "brief", "superbrief", "notify", "version"})
INSTALL_HINT = 'the textworld environment needs TextWorld: pip install -e ".[textworld]"'


class GameEngineError(RuntimeError):
    """A game engine raised, died or hung; its episode ends with this error."""


@functools.cache
def textworld_available() -> bool:
    return importlib.util.find_spec("textworld") is not None


# ------------------------------------------------------------------------------ the engine process
class _GameServer:
    """The game server process (agent_r1/envs/game_server.py, under agent_r1/lifetime.py's
    watchdog), started on the first game."""

    def __init__(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        script = str(Path(__file__).with_name("game_server.py"))
        self.process = lifetime.start([sys.executable, script, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, grace_s=5.0)
        theirs.close()
        self.sock = ours
        self.sock.settimeout(120)  # the first game waits for TextWorld's import
        self.lock = threading.Lock()

    def fork(self, game_path: str) -> tuple[int, Connection]:
        """A new game process playing ``game_path``: its pid and the connection to it."""
        ours, theirs = socket.socketpair()
        try:
            with self.lock:
                socket.send_fds(self.sock, [f"play {game_path}".encode()], [theirs.fileno()])
                pid = int(self.sock.recv(64) or b"0")
        except (OSError, ValueError) as e:
            ours.close()
            raise GameEngineError(f"the game server is gone ({type(e).__name__}: {e}; exit code {self.process.poll()})") from None
        finally:
            theirs.close()
        if not pid:
            ours.close()
            raise GameEngineError(f"the game server is gone (exit code {self.process.poll()})")
        return pid, Connection(ours.detach())

    def kill(self, pid: int) -> None:
        """SIGKILL game process `pid`, by the server that forked it (it alone knows that the pid
        is still that game's); nothing when the server is gone (its games went with it)."""
        with contextlib.suppress(OSError), self.lock:
            self.sock.send(f"kill {pid}".encode())

    def close(self) -> None:
        self.sock.close()
        lifetime.stop(self.process, grace_s=5.0)


_SERVER_LOCK = threading.Lock()
_SERVER: _GameServer | None = None


def _server() -> _GameServer:
    """This process's game server (restarted if it died)."""
    global _SERVER
    with _SERVER_LOCK:
        if _SERVER is None or _SERVER.process.poll() is not None:
            _SERVER = _GameServer()
            atexit.register(_SERVER.close)
        return _SERVER


class GameEngine:
    """One game in its own process; `start` and `step` return the game's state (a dict)."""

    def __init__(self, game_path: str | Path, step_timeout_s: float = 10.0, start_timeout_s: float = 60.0):
        self.path, self.step_timeout_s, self.start_timeout_s = str(Path(game_path).resolve()), step_timeout_s, start_timeout_s
        self.server: _GameServer | None = None
        self.pid: int | None = None
        self.conn: Connection | None = None

    def start(self) -> dict:
        self.server = _server()
        self.pid, self.conn = self.server.fork(self.path)
        return self._receive(self.start_timeout_s, "start")

    def step(self, command: str) -> dict:
        if self.conn is None:
            raise GameEngineError("the game engine is closed")
        try:
            self.conn.send(command)
        except (OSError, ValueError) as e:
            self._fail(f"the game engine is gone ({type(e).__name__}: {e})")
        return self._receive(self.step_timeout_s, f"the command {command!r}")

    def _receive(self, timeout: float, what: str) -> dict:
        try:
            reply = self.conn.recv() if self.conn.poll(timeout) else None
        except (EOFError, OSError):
            self._fail(f"the game engine died during {what}")
        if reply is None:
            self._fail(f"the game engine did not answer {what} within {timeout:g} s; killed it")
        if "error" in reply:
            self._fail(f"the game engine failed on {what}: {reply['error']}")
        return reply

    def _fail(self, message: str):
        self.close()
        raise GameEngineError(message)

    def close(self) -> None:
        """Stop the game process (idempotent)."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.pid is not None:
            self.server.kill(self.pid)
            self.pid = None


# ------------------------------------------------------------------------------ text
_BANNER_LINE = re.compile(r"^[\s_|\\$/<>()=-]*$")


def clean_feedback(text: str) -> str:
    """The game's text without its ASCII-art banner, ``>`` prompt lines (with the status line
    ``-= Room =-score/moves`` printed on them) and runs of blank lines."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    lines = [ln for ln in lines if not ln.lstrip().startswith(">") and not (ln.strip() and _BANNER_LINE.match(ln))]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def parse_command(action_text: str) -> str:
    """The command in a turn: its first non-blank line in printable ASCII (the Z-machine's input:
    other characters crash its interpreter, and a backslash starts one of its own commands, so they
    become spaces), without quotes, a leading ``>`` or a final period, spaces collapsed, at most
    100 characters; "" for a blank turn."""
    printable = re.sub(r"[^\x20-\x5b\x5d-\x7e\n]", " ", action_text)  # and no backslash: frotz's escape
    line = next((ln for ln in printable.splitlines() if ln.strip()), "")
    line = " ".join(line.strip().lstrip(">").strip().strip("\"'`").rstrip(".").split())
    return line[:100]


# ------------------------------------------------------------------------------ the environment
class TextWorldEnv(ToolEnv):
    """A TextWorld game (see the module docstring); settings from ``env.kwargs``:
    ``admissible_commands`` (list them in each observation, default on), ``process_reward``
    (scale of the game's intermediate reward, default 1.0; 0: the final reward alone),
    ``step_timeout_s`` (default 10)."""

    TASK_FIELDS = ("game", "walkthrough")
    DEFAULT_TOOLS: list = []
    DEFAULT_SYSTEM_PROMPT = SYSTEM_PROMPT
    METRICS = {
        "won": Metric("games won"),
        "score_fraction": Metric("the game's score as a fraction of its maximum"),
        "invalid_commands": Metric("commands the game did not list as admissible, per episode"),
        "process_reward": Metric("the game's intermediate rewards summed over the episode (unscaled)"),
    }

    def __init__(self, tools, *, admissible_commands: bool = True, process_reward: float = 1.0,
                 step_timeout_s: float = 10.0, **kw):
        super().__init__(tools, **kw)
        if not textworld_available():
            raise ImportError(INSTALL_HINT)
        self.show_admissible, self.process_scale, self.step_timeout_s = admissible_commands, process_reward, step_timeout_s
        self.engine: GameEngine | None = None
        self.state: dict = {}
        self.invalid = 0
        self.progress = 0.0

    def game_path(self, task: dict) -> Path:
        path = Path(task["game"])
        if not path.is_absolute() and self.data_dir is not None:
            path = Path(self.data_dir) / path
        if not path.exists():
            raise FileNotFoundError(f"task {task.get('id')!r}: game file {path} not found (run the prepare stage)")
        return path

    def reset(self, task: dict) -> list[dict]:
        self.close()
        self.task, self.done = task, False
        self.metrics = dict.fromkeys(ToolEnv.METRICS, 0)
        self.invalid, self.progress = 0, 0.0
        self.engine = GameEngine(self.game_path(task), self.step_timeout_s)
        self.state = self.engine.start()
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + [{"role": "user", "content": self._observation_text()}]

    def _observation_text(self) -> str:
        text = clean_feedback(self.state["feedback"]) or "Nothing happens."
        if self.show_admissible:
            text += "\n\nAdmissible commands: " + ", ".join(self.state["admissible"])
        return text

    def state_key(self) -> str:
        """The observation of the current state (the game's last feedback, and the admissible commands when
        they are shown), whitespace collapsed."""
        return " ".join(self._observation_text().split())

    def admissible_turns(self) -> list[str]:
        """The commands the game accepts now (the ``random`` baseline picks one)."""
        return list(self.state.get("admissible", []))

    def step(self, action_text: str, context_tokens: int | None = None) -> EnvStep:
        if self.done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        self.metrics["turns"] += 1
        info = StepInfo()
        if None not in (self.max_context_tokens, context_tokens) and context_tokens >= self.max_context_tokens:
            return self._finish([], 0.0, info, "token_budget", action_text)
        command = parse_command(action_text)
        if not command:
            info.format_error = True
            info.errors.append("write one game command")
            self.metrics["format_errors"] += 1
            reward, observation = self.format_penalty, [{"role": "user", "content": "Error: write one game command, "
                                                          "such as: go north\n\n" + self._observation_text()}]
        elif command.split()[0].lower() in META_COMMANDS:
            self.invalid += 1
            refused = f"`{command}` is a command about the game itself, not played here; write a game command."
            reward, observation = 0.0, [{"role": "user", "content": refused + "\n\n" + self._observation_text()}]
        else:
            admissible = {c.lower() for c in self.state["admissible"]}
            self.invalid += command.lower() not in admissible
            self.state = self.engine.step(command)
            self.progress += self.state["intermediate_reward"]
            reward = self.process_scale * self.state["intermediate_reward"]
            if self.state["done"]:
                return self._finish([], reward, info, "won" if self.state["won"] else "lost", action_text)
            observation = [{"role": "user", "content": self._observation_text()}]
        if self.metrics["turns"] >= self.max_turns:
            return self._finish(observation, reward, info, "max_turns", action_text)
        return EnvStep(observation, reward, False, info)

    def _finish(self, observation, reward, info, stop_reason, action_text) -> EnvStep:
        self.close()
        return super()._finish(observation, reward, info, stop_reason, action_text)

    def final_reward(self, answer: str | None, action_text: str) -> tuple[float, dict[str, float]]:
        won = float(self.state.get("won", False))
        top = self.state.get("max_score", 0.0)
        fraction = self.state.get("score", 0.0) / top if top else won
        metrics = {"won": won, "score_fraction": fraction, "invalid_commands": self.invalid, "process_reward": self.progress}
        return 0.5 * won + 0.5 * fraction, metrics

    def oracle_turns(self, task: dict) -> list[str]:
        """The game's walkthrough."""
        return list(task["walkthrough"])

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def __del__(self):
        self.close()

