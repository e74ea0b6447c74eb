"""The private folder of this user's nudge and outcome sockets: which one, and why.

A socket is only as private as its folder: whoever owns the folder can put a socket of its own
in the place of ours, read the ids every announcement names, or take the nudges. So the folder
must be one that no other user can have made first, and every process of the user (a service,
a cron job and ssh without a login session have no `XDG_RUNTIME_DIR`) must find the same one.
The candidates, in order; the first usable one is taken, once per process:

    1. $XDG_RUNTIME_DIR/yieldstar   when the variable is set to an absolute path
    2. /run/user/<uid>/yieldstar    where a login session's XDG_RUNTIME_DIR points: a cron job
                                    finds the folder of the user's login shell without it
    3. <home>/.yieldstar            the home of the password database, not $HOME (which the
                                    processes of one user need not share); gpg-agent falls
                                    back the same way, from /run/user to ~/.gnupg
    4. /tmp/yieldstar-<uid>         anyone can make it first: refused when someone did
    -  none                         no sockets: nothing is sent, and idle supervisors and
                                    waiting clients find new work and outcomes by polling

Candidates 1 to 3 sit in an *anchor* (the runtime folder, or the home) that must be a folder of
this user that no one else may write, below folders that belong to root or this user and that no
one else may write either (a sticky one, like /tmp, excepted: there others cannot rename what is
not theirs). Candidate 4's anchor is /tmp, checked as such a folder above. Then, for every
candidate, the folder itself is made owner-only, or found: it must be a real folder (lstat: a
planted symlink is refused, never followed) of this user with no group or other permission.
Paths are resolved first, so the folder used is the one checked, and the deepest socket
(`<folder>/<24 hex>/outcomes/<pid>-<n>.sock`) must stay within AF_UNIX's 107 bytes.

With no usable folder, each process that looks says so once, with the fix (remove the squatted
folder, or set XDG_RUNTIME_DIR to a private folder), and carries on: a nudge or an announcement
is a hint, and the commit it follows has happened. (A supervisor's workers leave it to their
supervisor: see `LOGGER`.) A process keeps the folder it chose, or its lack of one, until it
exits: a supervisor started before the fix polls until it is restarted. Processes that chose
different folders (one started in a login session, one before it began) do not hear each other
either; each finds the other's changes at its next poll.

A home shared by several hosts (NFS) is shared by their sockets too: a nudge from one host to a
socket of another is refused, and the socket removed as a dead one's, so supervisors on both
fall back to polling for that ledger path. Such hosts want XDG_RUNTIME_DIR set to a folder of
their own.
"""

from __future__ import annotations

import functools
import logging
import os
import pwd
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Optional

#: The logger of the one warning this module gives; a supervisor's workers quiet it, since their
#: supervisor (of the same user and environment) gives it once for all of them.
LOGGER = "yieldstar.notifications"
log = logging.getLogger(LOGGER)

SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes, the last a NUL
# The deepest socket below a folder: a 7-digit pid (pid_max is at most 2**22) and a count of up
# to 10 digits (`nudge.OutcomeListener`).
DEEPEST_SOCKET = "/" + "0" * 24 + "/outcomes/" + "4194304-" + "9" * 10 + ".sock"
FOLDER_MAX = SOCKET_PATH_MAX - len(DEEPEST_SOCKET)  # 49 bytes


class NoPrivateFolder(PermissionError):
    """Raised when a socket is asked for but this user has no usable folder (see the module)."""


@dataclass(frozen=True)
class PassedOver:
    """A candidate folder that was not used: why, and what would make it usable (or None)."""

    folder: str
    why: str
    fix: Optional[str] = None


@dataclass(frozen=True)
class Choice:
    """The folder chosen (None when no candidate is usable) and the candidates passed over."""

    folder: Optional[str]
    passed_over: tuple[PassedOver, ...]


def choose(uid: int, environ: Mapping[str, str], home: Optional[str], *, run_user: str = "/run/user",
           tmp: str = "/tmp") -> Choice:
    """Take the first usable candidate for user `uid`, making its folder if missing.

    Args:
        environ: where XDG_RUNTIME_DIR is looked up.
        home: the user's home from the password database; None when the user has no entry.
        run_user, tmp: the system's folders (a test's stand-ins).
    """
    passed: list[PassedOver] = []
    for candidate in _candidates(uid, environ, home, run_user, tmp):
        if isinstance(candidate, str):
            refused = _too_long(candidate) or _unsafe_folder(candidate, uid)
            if refused is None:
                return Choice(candidate, tuple(passed))
            candidate = refused
        if all(p.folder != candidate.folder for p in passed):  # XDG_RUNTIME_DIR is /run/user/<uid>
            passed.append(candidate)
    return Choice(None, tuple(passed))


def describe(choice: Choice) -> str:
    """The warning for a choice without a folder: what is wrong, the fix, and what it costs."""
    last = choice.passed_over[-1]
    earlier = "; ".join(p.why for p in choice.passed_over[:-1])
    return (f"no private folder for this user's sockets: {last.why}; "
            + (f"{last.fix}, or " if last.fix else "") + "set XDG_RUNTIME_DIR to a private folder of this user"
            + (f" (passed over too: {earlier})" if earlier else "")
            + ". No nudges or outcome announcements are sent: supervisors and waiting clients of this user"
              " find new work and outcomes by polling")


def socket_root() -> str:
    """The folder of this user's sockets (see the module).

    Raises:
        NoPrivateFolder: no candidate is usable; the first call of the process logged why.
    """
    choice = _chosen()
    if choice.folder is None:
        raise NoPrivateFolder(f"no private folder for this user's sockets: {choice.passed_over[-1].why}")
    return choice.folder


@functools.lru_cache(maxsize=1)
def _chosen() -> Choice:
    """This process's choice, made at its first nudge, announcement or listener; a choice
    without a folder is logged here, once."""
    uid = os.geteuid()
    try:
        home: Optional[str] = pwd.getpwuid(uid).pw_dir
    except KeyError:
        home = None
    choice = choose(uid, os.environ, home)
    if choice.folder is None:
        log.warning("%s", describe(choice), extra={"event": "no_socket_folder"})
    return choice


def _candidates(uid: int, environ: Mapping[str, str], home: Optional[str], run_user: str,
                tmp: str) -> Iterator[str | PassedOver]:
    """Each candidate folder in order (resolved), or why it is passed over before it is looked at."""
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime and not os.path.isabs(runtime):
        yield PassedOver(os.path.join(runtime, "yieldstar"), f"XDG_RUNTIME_DIR ({runtime}) is not an absolute path")
    elif runtime:
        yield _in_anchor(runtime, "yieldstar", uid, "XDG_RUNTIME_DIR ")
    yield _in_anchor(os.path.join(run_user, str(uid)), "yieldstar", uid)
    if home:
        yield _in_anchor(home, ".yieldstar", uid, "the home ")
    else:
        yield PassedOver("~/.yieldstar", f"uid {uid} has no home in the password database")
    real = _real(tmp)
    folder = os.path.join(real or tmp, f"yieldstar-{uid}")
    why = f"{tmp} does not exist" if real is None else _unsafe_above(real, uid)
    yield folder if why is None else PassedOver(folder, why)


def _in_anchor(anchor: str, name: str, uid: int, what: str = "") -> str | PassedOver:
    """The folder `name` in `anchor` (resolved), if `anchor` may hold this user's folder: a folder of
    this user that no one else may write, below folders no one else may rename. `what` is what
    the messages call the anchor, before its path."""
    real = _real(anchor)
    folder, shown = os.path.join(real or anchor, name), what + anchor
    if real is None:
        return PassedOver(folder, f"{shown} does not exist")
    try:
        info = os.stat(real)
    except OSError as exc:
        return PassedOver(folder, f"cannot check {shown}: {exc.strerror}")
    if not stat.S_ISDIR(info.st_mode):
        return PassedOver(folder, f"{shown} is not a folder")
    if info.st_uid != uid:
        return PassedOver(folder, f"{shown} belongs to {_user(info.st_uid)}")
    if info.st_mode & 0o022:
        return PassedOver(folder, f"{shown} may be written by other users (mode {stat.S_IMODE(info.st_mode):04o})")
    why = _unsafe_above(os.path.dirname(real), uid)
    return folder if why is None else PassedOver(folder, why)


def _real(path: str) -> Optional[str]:
    try:
        return os.path.realpath(path, strict=True)
    except OSError:
        return None


def _unsafe_above(real: str, uid: int) -> Optional[str]:
    """Why another user could rename `real` (a resolved folder) or a folder above it; None when
    none could: each belongs to root or this user, and no one else may write it unless sticky."""
    folder = real
    while True:
        try:
            info = os.lstat(folder)
        except OSError as exc:
            return f"cannot check {folder}: {exc.strerror}"
        if info.st_uid not in (0, uid):
            return f"{folder} belongs to {_user(info.st_uid)}"
        if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
            return f"{folder} may be written by other users (mode {stat.S_IMODE(info.st_mode):04o})"
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def _too_long(folder: str) -> Optional[PassedOver]:
    if len(os.fsencode(folder)) > FOLDER_MAX:
        return PassedOver(folder, f"{folder} is too long for socket paths (more than {FOLDER_MAX} bytes)")
    return None


def _unsafe_folder(folder: str, uid: int) -> Optional[PassedOver]:
    """Make `folder` owner-only if missing; why it is not this user's private folder, or None."""
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass  # checked below, without following it if it is a link
    except OSError as exc:
        return PassedOver(folder, f"cannot make {folder}: {exc.strerror}")
    try:
        info = os.lstat(folder)
    except OSError as exc:
        return PassedOver(folder, f"cannot check {folder}: {exc.strerror}")
    fix = f"remove {folder}"
    if stat.S_ISLNK(info.st_mode):
        return PassedOver(folder, f"{folder} is a symlink", fix)
    if not stat.S_ISDIR(info.st_mode):
        return PassedOver(folder, f"{folder} is not a folder", fix)
    if info.st_uid != uid:
        return PassedOver(folder, f"{folder} was made by {_user(info.st_uid)}, not by this user", fix)
    if info.st_mode & 0o077:
        return PassedOver(folder, f"{folder} is open to other users (mode {stat.S_IMODE(info.st_mode):04o})",
                          f"chmod 700 {folder}")
    return None


def _user(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
