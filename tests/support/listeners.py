"""The listening TCP sockets of processes, read from /proc (what `ss -ltnp` shows, without psutil).

/proc/net/tcp and tcp6 list every socket of the network namespace with its inode; a
process's /proc/<pid>/fd links name the inodes it holds (``socket:[<inode>]``).
"""
from __future__ import annotations

import ipaddress
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

LISTEN = "0A"  # the kernel's TCP_LISTEN state, as /proc/net/tcp writes it
LOOPBACK = {"127.0.0.1", "::1"}


@dataclass(frozen=True)
class Listener:
    pid: int
    address: str  # "127.0.0.1", "::", "0.0.0.0", "::ffff:127.0.0.1" ...
    port: int
    command: str  # the process's command line, for the assertion message

    @property
    def on_loopback(self) -> bool:
        ip = ipaddress.ip_address(self.address)
        mapped = getattr(ip, "ipv4_mapped", None)
        return (mapped or ip).is_loopback


def _address(hex_address: str, family: int) -> str:
    raw = bytes.fromhex(hex_address)
    # The kernel prints each 32-bit word in host byte order.
    words = struct.unpack(f"<{len(raw) // 4}I", raw)
    return socket.inet_ntop(family, struct.pack(f">{len(words)}I", *words))


def listening_inodes() -> dict[int, tuple[str, int]]:
    """inode -> (address, port) of every listening TCP socket of this network namespace."""
    found = {}
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != LISTEN:
                continue
            hex_address, hex_port = fields[1].split(":")
            found[int(fields[9])] = (_address(hex_address, family), int(hex_port, 16))
    return found


def descendants(root: int) -> set[int]:
    """``root`` and every process below it (from /proc/<pid>/stat's parent field)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in found]
        found.update(children)
        frontier.extend(children)
    return found


def listeners(pids: set[int]) -> list[Listener]:
    """The listening TCP sockets the processes ``pids`` hold now."""
    inodes = listening_inodes()
    found = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # it exited meanwhile
            continue
        links = []
        for fd in fds:
            try:
                links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:  # closed meanwhile
                pass
        for link in links:
            if link.startswith("socket:[") and (inode := int(link[8:-1])) in inodes:
                address, port = inodes[inode]
                found.append(Listener(pid, address, port, command.strip()))
    return found
