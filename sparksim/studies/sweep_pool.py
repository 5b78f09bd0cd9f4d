"""Local worker processes for sweeps: they leave Ctrl-C to the parent and never outlive it.

Ctrl-C in a terminal sends SIGINT to every process of the foreground group, so workers
ignore it: the parent alone decides to stop, and nothing prints a KeyboardInterrupt
traceback from inside a point. A parent killed outright (`kill -9`, the OOM killer, a
cancelled CI job) cannot stop its pool, so each worker also ends itself when its parent
dies: at once through Linux's PR_SET_PDEATHSIG, and elsewhere (or if that call fails)
through a thread that watches the parent.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
WATCH_INTERVAL_S = 0.5  # how often the watchdog looks for its parent


def _parent_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def _watch_parent(parent_pid: int, first_ppid: int) -> None:
    """Exit the worker as soon as its parent is gone (runs as a daemon thread)."""
    while True:
        # Under fork and spawn the parent is the sweep; under forkserver it is the server,
        # which itself exits with the sweep: either change means this worker is an orphan.
        if os.getppid() != first_ppid or not _parent_alive(parent_pid):
            os._exit(1)
        time.sleep(WATCH_INTERVAL_S)


def init_worker(parent_pid: int) -> None:
    """Make this worker ignore Ctrl-C and die with the sweep `parent_pid` (a pool initializer)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watchdog below still covers it
    first_ppid = os.getppid()
    if not _parent_alive(parent_pid):  # it died before the line above could take effect
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent_pid, first_ppid), daemon=True,
                     name="sparksim-parent-watch").start()


def start_pool(num_workers: int) -> ProcessPoolExecutor:
    """Return a pool of `num_workers` processes set up by `init_worker`."""
    return ProcessPoolExecutor(max_workers=num_workers, initializer=init_worker,
                               initargs=(os.getpid(),))


def stop_pool(pool: ProcessPoolExecutor) -> None:
    """Drop queued points and end running workers now (after Ctrl-C or a failed point)."""
    # A running point cannot be cancelled and may take minutes; its result would be lost
    # anyway, so its worker is terminated. There is no public handle on the workers before
    # Python 3.14, and shutdown() drops this one, so they are taken first.
    procs = list((pool._processes or {}).values())
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.join(timeout=5)
    # The pool's manager thread sees its workers gone, fails the futures left and closes its
    # wakeup pipe; shutdown(wait=True) then joins it. It must be joined here: at exit Python
    # writes to every live manager's pipe without the pool's lock, and a manager closing that
    # pipe at the same moment makes the write fail with a traceback after Ctrl-C's one line
    # (seen in CI). A first shutdown(wait=False) would forget the thread, so there is one call.
    pool.shutdown(wait=True, cancel_futures=True)
