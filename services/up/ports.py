"""The ports `embedfleet up` is given (--port, and --metrics-port where fixed), checked before anything
starts, and, for one that is taken, the process that holds it.

A check is no reservation: the gateway binds its port a few seconds later and may still find it taken
(by a process that bound it meanwhile); `up` then words the gateway's death with the same lookup.
The holder is found as ``ss -p`` finds it: the socket's inode in /proc/net/tcp{,6}, then the process
with a file descriptor on that socket (where /proc lets this user read it).
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

from embedfleet.services.up.lock import command_line
from embedfleet.shared.config.option import ConfigError

_LISTEN = "0A"  # a socket's state in /proc/net/tcp: TCP_LISTEN


def check_ports(host: str, port: int, metrics_host: str, metrics_port: int) -> None:
    """Raise ConfigError, naming who holds it, for a port the gateway could not listen on."""
    for flag, address, number in (("--port", host, port), ("--metrics-port", metrics_host, metrics_port)):
        if number == 0:  # --metrics-port 0: none (up gives each service a free one of its own)
            continue
        taken = port_taken(address, number, flag)
        if taken:
            prefix = "" if flag == "--port" else f"{flag}: "
            raise ConfigError(f"{prefix}{taken}: stop it, or give up another {flag}")


def port_taken(host: str, port: int, flag: str = "--port") -> str | None:
    """'port P on H is in use by pid N (command line)' when ``host``:``port`` cannot be listened on
    because a socket holds it; None when it can. Other failures (an address not of this machine, a
    privileged port, a name that does not resolve) raise ConfigError naming ``flag``."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"{flag} {port} on {host}: {exc.strerror}") from None
    for family, kind, proto, _, address in addresses:
        # as the gateway's server binds: SO_REUSEADDR (a closed connection's TIME_WAIT is no holder), and
        # an IPv6 socket for IPv6 alone
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return f"port {port} on {host} is in use by {holder(port)}"
                raise ConfigError(f"{flag} {port}: cannot listen on {host}:{port} ({exc.strerror or exc})") from None
    return None


def holder(port: int) -> str:
    """'pid N (command line)' of a process holding TCP ``port`` (listening first), else 'another process'."""
    inodes = _socket_inodes(port)
    if inodes:
        for pid in _pids():
            for fd in _fds(pid):
                try:
                    link = os.readlink(fd)
                except OSError:
                    continue
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    command = command_line(int(pid))
                    return f"pid {pid} ({command})" if command else f"pid {pid}"
    return "another process (none this user may see)"


def _socket_inodes(port: int) -> set[str]:
    """The inodes of the TCP sockets bound to ``port``: listening ones, else any."""
    listening: set[str] = set()
    other: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
            fields = row.split()
            if len(fields) > 9 and int(fields[1].rsplit(":", 1)[1], 16) == port and fields[9] != "0":
                (listening if fields[3] == _LISTEN else other).add(fields[9])
    return listening or other


def _pids() -> list[str]:
    try:
        return sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int)
    except OSError:
        return []


def _fds(pid: str) -> list[str]:
    try:
        return [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:  # gone, or another user's
        return []
