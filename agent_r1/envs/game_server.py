"""The TextWorld game server: one process per trainer that has TextWorld loaded and forks one
process per game (agent_r1/envs/text_game.py starts it and talks to it).

Run as a script, ``python game_server.py <fd>``, so that it imports TextWorld and the standard
library only (not agent_r1's packages, not torch; agent_r1/lifetime.py is loaded by its path).
``<fd>`` is a SOCK_SEQPACKET socket to the trainer. Each message is ``play <game file>`` with one
socket attached: the server forks a process that plays that game over that socket and answers
with the process's pid; or ``kill <pid>``: the server SIGKILLs that game process if it has not
reaped it yet (it reaps its games only between messages, so the pid cannot have been reused). A
game process answers each command (a pickled string) with the game's state (a pickled dict), or
``{"error": ...}`` once and exits.

The server runs under agent_r1/lifetime.py's watchdog (it dies with the trainer, SIGKILL
included), exits when the trainer closes its socket, and every game process dies with the server
(PR_SET_PDEATHSIG), so a game that hangs never outlives the trainer. Its working folder is
removed as soon as it is entered: a game's ``save`` or ``script`` can write no file anywhere, and
no folder is left behind, however the trainer ends.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import sys
import tempfile
from multiprocessing.connection import Connection
from pathlib import Path

_spec = importlib.util.spec_from_file_location("agent_r1_lifetime", Path(__file__).resolve().parents[1] / "lifetime.py")
lifetime = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lifetime)


def _state(gs, done: bool = False) -> dict:
    return {"feedback": gs.feedback or "", "score": float(gs.score or 0), "max_score": float(gs.max_score or 0),
            "won": bool(gs.won), "lost": bool(gs.lost), "done": bool(done),
            "intermediate_reward": float(gs.intermediate_reward or 0),
            "admissible": list(gs.admissible_commands or []), "objective": gs.objective or ""}


def play(conn: Connection, game_path: str) -> None:
    """Start the game, then answer each command with the game's state until the socket closes."""
    import textworld

    infos = textworld.EnvInfos(admissible_commands=True, intermediate_reward=True, max_score=True, won=True,
                               lost=True, score=True, objective=True)
    try:
        env = textworld.start(game_path, request_infos=infos)
        conn.send(_state(env.reset()))
        while True:
            gs, _, done = env.step(conn.recv())
            conn.send(_state(gs, done=done))
    except EOFError:  # the trainer closed the socket
        return
    except Exception as e:  # noqa: BLE001 - reported to the trainer, which ends the episode
        conn.send({"error": f"{type(e).__name__}: {e}"[:500]})


def _reap(games: set[int]) -> None:
    """Reap the game processes that ended (their pids become free for reuse only now)."""
    while games:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            return
        games.discard(pid)


def main(fd: int) -> None:
    import textworld  # noqa: F401 - loaded once: every game process forks with it

    scratch = tempfile.mkdtemp(prefix="agent-r1-games-")
    os.chdir(scratch)
    os.rmdir(scratch)  # the working folder is gone: files a game writes by name fail, none are left
    control = socket.socket(fileno=fd)
    games: set[int] = set()
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(control, 4096, 1)
        except OSError:
            return
        if not msg:  # the trainer is gone
            return
        _reap(games)
        verb, _, arg = msg.decode().partition(" ")
        if verb == "kill":
            if int(arg) in games:
                os.kill(int(arg), signal.SIGKILL)
            continue
        server = os.getpid()
        pid = os.fork()
        if pid == 0:
            control.close()
            lifetime.die_with(server)
            play(Connection(fds[0]), arg)
            os._exit(0)
        games.add(pid)
        for f in fds:
            os.close(f)
        control.send(str(pid).encode())


if __name__ == "__main__":
    main(int(sys.argv[1]))
