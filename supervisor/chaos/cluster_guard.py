"""The guard of a throwaway PostgreSQL cluster (`cluster.Cluster`): a small process that stops
the server and removes its folder when the process that started the cluster is gone without
doing so itself (a test run killed, a benchmark interrupted), so that no server outlives it.

    python -m supervisor.chaos.cluster_guard FOLDER DATA PG_CTL [RUNUSER...]

It waits on its stdin, a pipe whose other end only the cluster's owner holds: "done" there (a
clean `Cluster.stop`) ends it quietly; the end of the pipe without it (the owner died: the
kernel closed its end) stops the server at once and removes the folder. It runs in a session of
its own, so a signal to the owner's process group does not take it along.
"""

from __future__ import annotations

import shutil
import subprocess
import sys


def main(argv: list[str]) -> int:
    folder, data, *pg_ctl = argv
    said = sys.stdin.buffer.read()
    if said.strip() == b"done":
        return 0
    subprocess.run([*pg_ctl, "-D", data, "-m", "immediate", "-w", "stop"], stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
