"""The TextWorld game server: one process per trainer that has TextWorld loaded and forks one
process per game (agent_r1/envs/text_game.py starts it and talks to it).

Run as a script, ``python game_server.py <fd>``, so that it imports TextWorld and the standard
library only (not agent_r1, not torch). ``<fd>`` is a SOCK_SEQPACKET socket to the trainer: each
message is a game file's path with one socket attached; the server forks a process that plays
that game over that socket and answers with the process's pid. The game process answers each
command (a pickled string) with the game's state (a pickled dict), or ``{"error": ...}`` once and
exits. The server exits when the trainer closes its socket or dies, and every game process dies
with the server (PR_SET_PDEATHSIG), so a game that hangs never outlives the trainer.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
from multiprocessing.connection import Connection


def _die_with_parent() -> None:
    """SIGKILL this process when its parent dies (Linux), and at once if it already has."""
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)


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


def main(fd: int) -> None:
    import textworld  # noqa: F401 - loaded once: every game process forks with it

    _die_with_parent()
    control = socket.socket(fileno=fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # game processes are reaped by the kernel
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(control, 4096, 1)
        except OSError:
            return
        if not msg:  # the trainer is gone
            return
        pid = os.fork()
        if pid == 0:
            control.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _die_with_parent()
            play(Connection(fds[0]), msg.decode())
            os._exit(0)
        for f in fds:
            os.close(f)
        control.send(str(pid).encode())


if __name__ == "__main__":
    main(int(sys.argv[1]))
