"""The messages a supervisor and its child exchange over the child's pipe.

Plain tuples, tag first: they are pickled on every delivery, so they stay small.

parent -> child                          child -> parent
("run", execution_id, token,            ("ready", pid, error or None,   once, after loading the app
  expires, claimed_at, start)              storage kind or None)         and opening the ledger
("beat", expires or None)                ("alive",)                      answers every beat
("exit",)   finish and exit              ("done", execution_id, token, outcome, ms)

A "ready" with an error and a storage kind (`StorageError.kind`) says the ledger could not be
opened for a lasting reason (a corrupt or unsafe file), not that the app is broken.

`claimed_at` is the ledger time (ms) of the claim that made the delivery: the child never reads
a time earlier than that one when it decides whether a timer is due, so a child whose clock
lags the one that decided the execution was claimable does not find the timer early and spin.
`start` is (workflow, input JSON) on an execution's first delivery, which the child then need not
read from the ledger, and None on every later one (see `Claimed`).
A supervisor that finds a lease lost kills the child: it may be inside a step calling the
outside world, and a message it would read only after that step is no way to stop it.
"""

RUN = "run"
BEAT = "beat"
EXIT = "exit"

READY = "ready"
ALIVE = "alive"
DONE = "done"

# Exit codes of a child process, so the supervisor's log can tell why a child went away.
EXIT_OK = 0
EXIT_APP_FAILED = 3  # the user's app could not be imported
EXIT_PARENT_GONE = 4  # the supervisor died, froze or closed the pipe: stopped writing and left
EXIT_LEDGER_UNUSABLE = 5  # the ledger cannot be opened until an operator acts (corrupt, unsafe, ...)
EXIT_CODES = {EXIT_OK: "exited", EXIT_APP_FAILED: "could not load the app", EXIT_PARENT_GONE: "lost its supervisor",
              EXIT_LEDGER_UNUSABLE: "could not open the ledger"}
