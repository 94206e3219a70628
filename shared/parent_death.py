"""Children that die with their supervisor: `embedfleet up` killed outright (SIGKILL, the OOM killer, a
runner's timeout) must not leave its nats-server and services running as orphans.

On Linux the kernel sends a child a signal when its parent dies (``prctl(PR_SET_PDEATHSIG)``), set in
the child between fork and exec (the setting survives exec). Two traps: the signal follows the death
of the parent *thread* that forked, so the supervisor must start its children from a thread that lives
as long as it does (`up` starts them from its main thread); and the parent may die before the child
has set it, so the child checks that its parent is still the one that forked it and, if not, ends at
once. Elsewhere (macOS, Windows) nothing is set: a child outlives a killed supervisor there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen`` that has the child sent ``sig`` when this process dies
    (SIGTERM: a service then stops as on any SIGTERM); None where the platform has no such call."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def in_child() -> None:  # runs in the forked child, before exec: only async-signal-safe work
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the call: no signal will ever come
            os._exit(1)

    return in_child
