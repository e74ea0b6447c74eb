"""A really shifted wall clock for a process and its children, for tests and the chaos harness.

    from supervisor.chaos.wall_clock import available, shifted_env

    subprocess.Popen(argv, env=shifted_env(+30_000))     # time.time(), `date`: 30 s ahead

On PostgreSQL the database server's clock is the only clock that decides (SPEC section 7): a
supervisor whose host's wall clock runs 30 s ahead must never take over a lease that is live by
the server's clock, nor one 30 s behind take over 30 s late. Proving that needs the host's clock
itself to be wrong, as NTP gone bad or a virtual machine resumed from a snapshot makes it, for
every process of the host and every library in them (libpq, the standard library, the step
bodies), not a Python-level patch of `time.time` or a `clock=` handed in: those reach only the
code the patch knows about, so they prove only that the code the test author thought of ignores
the clock, which is the very thing in question.

So `shifted_env(offset_ms)` returns an environment that preloads a small shared library
(`wall_clock_shift.c`, beside this module) overriding `clock_gettime` for the wall clocks
(CLOCK_REALTIME, CLOCK_REALTIME_COARSE, CLOCK_TAI), `gettimeofday`, `time` and `timespec_get`,
adding the offset read once from $YIELDSTAR_WALL_CLOCK_OFFSET_MS. CLOCK_MONOTONIC and every other
clock pass through untouched: the runtime's timeouts and its estimate of the server's clock ride
on the monotonic clock, which a wrong wall clock does not move either. Nothing beyond gcc is
needed (libfaketime is not on a fresh machine).

The library is compiled at most once per process into a cache folder that only its owner may
read (`yieldstar-wall-clock-UID` under the system's temporary folder, or under a folder the
caller gives), named after a hash of its source, and written atomically (a temporary file, then
a rename), so two processes building it at once both end with a whole library. It needs a
Linux with glibc and gcc; `available()` says why not otherwise, and `library()` raises
`WallClockShimError` naming gcc when the build fails.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Mapping, Optional

OFFSET_VARIABLE = "YIELDSTAR_WALL_CLOCK_OFFSET_MS"
SOURCE = Path(__file__).with_name("wall_clock_shift.c")
COMPILER = "gcc"
FLAGS = ("-shared", "-fPIC", "-O2", "-Wall")
LIBRARIES = ("-ldl",)  # dlsym lives in libdl before glibc 2.34 (an empty stub after)
BUILD_TIMEOUT_S = 120

_built: dict[str, str] = {}  # cache folder -> the library built (or found) there by this process
_building = threading.Lock()


class WallClockShimError(RuntimeError):
    """Raised when the wall-clock library cannot be built or used on this machine."""


def available() -> Optional[str]:
    """None if a shifted wall clock can be given here, else why not."""
    if not sys.platform.startswith("linux"):
        return "the wall-clock shift is an LD_PRELOAD library for Linux"
    if platform.libc_ver()[0] != "glibc":
        return "the wall-clock shift needs glibc (its calls are found with dlsym(RTLD_NEXT))"
    if shutil.which(COMPILER) is None:
        return f"building the wall-clock shift needs {COMPILER}, which is not on PATH"
    if not SOURCE.is_file():
        return f"the wall-clock shift's source {SOURCE} is missing from this installation"
    return None


def shifted_env(offset_ms: int, env: Optional[Mapping[str, str]] = None, *,
                folder: Optional[str] = None) -> dict[str, str]:
    """A copy of `env` (default `os.environ`) whose processes see the wall clock `offset_ms`
    ahead (negative: behind): the library prepended to LD_PRELOAD, the offset set.

    Args:
        offset_ms: how far the wall clock is moved, in milliseconds.
        env: the environment to copy; `os.environ` when None.
        folder: where the cache folder is made; the system's temporary folder when None.
    """
    shifted = dict(os.environ if env is None else env)
    path = library(folder)
    preloaded = shifted.get("LD_PRELOAD", "").strip()
    shifted["LD_PRELOAD"] = f"{path} {preloaded}" if preloaded else path
    shifted[OFFSET_VARIABLE] = str(int(offset_ms))
    return shifted


def library(folder: Optional[str] = None) -> str:
    """The path of the built library, built first if this process has not built or found it."""
    cache = _cache_folder(folder)
    with _building:
        if cache not in _built:
            _built[cache] = _build(cache)
        return _built[cache]


def _cache_folder(folder: Optional[str]) -> str:
    """The owner-only cache folder under `folder`, made if missing; refused if anyone else could
    write to it (whoever can replace the library runs code in every shifted process)."""
    base = os.path.abspath(folder if folder is not None else tempfile.gettempdir())
    cache = os.path.join(base, f"yieldstar-wall-clock-{os.geteuid()}")
    try:
        os.mkdir(cache, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(cache)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise WallClockShimError(f"{cache} must be a folder owned by uid {os.geteuid()} that only its owner"
                                 f" may use (mode 0700), not a link or a shared folder")
    if any(c in cache for c in " :"):  # LD_PRELOAD separates its entries by spaces and colons
        raise WallClockShimError(f"{cache} cannot stand in LD_PRELOAD (it has a space or a colon)")
    return cache


def _build(cache: str) -> str:
    """Compile the library into `cache`, unless a library of the same source is already there."""
    why = available()
    if why is not None:
        raise WallClockShimError(why)
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(b"\0".join([source, " ".join(FLAGS + LIBRARIES).encode(),
                                        platform.machine().encode()])).hexdigest()[:16]
    path = os.path.join(cache, f"wall_clock_shift-{digest}.so")
    if os.path.isfile(path):  # built by this user before (renamed in whole, so it is whole)
        return path
    fd, partial = tempfile.mkstemp(prefix=".building-", suffix=".so", dir=cache)
    os.close(fd)
    try:
        try:
            built = subprocess.run([COMPILER, *FLAGS, "-o", partial, str(SOURCE), *LIBRARIES], capture_output=True,
                                   text=True, timeout=BUILD_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise WallClockShimError(f"{COMPILER} could not build the wall-clock shift from {SOURCE}: {exc}") from exc
        if built.returncode != 0:
            raise WallClockShimError(f"{COMPILER} could not build the wall-clock shift from {SOURCE}"
                                     f" (exit {built.returncode}): {built.stderr.strip()}")
        os.chmod(partial, 0o700)
        os.replace(partial, path)  # atomic: a reader sees no library or a whole one
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return path
