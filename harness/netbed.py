"""A partition test bed: hosts in Linux network namespaces, joined by one switch.

:class:`NetBed` gives every host (a worker, the lease store, the broker) a
network namespace of its own with one address, and cuts, slows and heals the
links between them, with nftables rules inside the namespaces: a real
network fault, seen by the kernel's TCP as a partition would be (no reset,
no refusal: packets vanish, connections hang, retransmissions resume after
a heal).

Layout of a bed of index *k* (0..199, one per live bed on the machine)::

    root ns: clnet<k>c 10.213.<k>.1/24  (the controller: the test process)
      |  veth
    clnet<k>-switch: bridge br0 (no address)
      |  veth h<n>        one per host
    clnet<k>-<host>: eth0 10.213.<k>.<10+n>/24, lo up

Guarantees:

* **Traffic stays inside the bed.** The addresses are in 10.213.<k>.0/24
  only; host namespaces have no route but that subnet's (no default route),
  the switch namespace has no address at all, and the root namespace gains
  one connected route, to its end of the controller's veth. Nothing the bed
  makes can send to any other address.
* **Beds running side by side never meet.** A bed takes its index *k* with
  an exclusive ``flock`` on ``/run/celery-leader-netbed/<k>.lock``, held for
  its life: its subnet, namespace names and the one root-namespace interface
  name (``clnet<k>c``, within Linux's 15-character limit) are its own, across
  pytest-xdist workers and separate test runs.
* **Nothing outlives it.** :meth:`close` kills what still runs in its
  namespaces (processes started there by the test) and deletes the
  namespaces (their veths go with them) and the controller's veth. A bed
  left by a dead run (its lock is free again) is swept by the next
  :meth:`start` on the machine (:func:`sweep_leftovers`), before any index
  is reused.
* **Faults are exact and undone by :meth:`heal`.** :meth:`cut` drops every
  packet between two hosts both ways, :meth:`cut_one_way` only what one
  sends to the other (what the other sends still arrives; TCP between them
  stalls all the same, its acknowledgements being lost),
  :meth:`isolate` every packet of a host but the controller's, :meth:`lose`
  a share of the packets a host sends, at random, :meth:`slow` delays a
  host's TCP connections to one server (through a relay: the test
  machines' kernel has no ``netem``). All are rules in the hosts' own
  namespaces: the switch and the root namespace are never filtered.

Assumptions:

* root (``CAP_NET_ADMIN`` and ``CAP_SYS_ADMIN`` for ``ip netns``), and the
  ``ip`` and ``nft`` commands (iproute2, nftables) with a kernel that has
  nftables' filter and NAT hooks and veth; :meth:`start` fails with a
  message naming what is missing. ``./run.sh test`` installs nftables.
* **The controller is outside the fault model.** The test process (sending
  tasks, reading the lease) and the servers it runs in the root namespace
  (the run history) are reached through the controller's address, which
  :meth:`isolate` spares: a host cut off can still record what it does, as
  the chaos suite's history is never faulted. A real dead host would not.
* Clocks: every namespace shares the machine's clocks (network namespaces
  do not separate time), so the rows that processes in different hosts
  write on CLOCK_MONOTONIC compare directly.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.proxy import FaultProxy

#: The private range: 10.213.<bed index>.0/24, used only inside the beds' namespaces.
NET_PREFIX = "10.213"
#: Namespace names and the controller's interface start with this and the bed's index.
NAME_PREFIX = "clnet"
MAX_BEDS = 200
LOCK_DIR = Path("/run/celery-leader-netbed")
#: The controller's address in its bed (10.213.<k>.1); hosts count from 10.
CONTROLLER_HOST = 1
FIRST_HOST = 10
COMMANDS = ("ip", "nft")

#: A table of two filter chains in each host's namespace; faults add drop rules to it.
NFT_TABLE = """
table inet netbed {
    chain input { type filter hook input priority 0; policy accept; }
    chain output { type filter hook output priority 0; policy accept; }
    chain relay { type nat hook output priority -100; policy accept; }
}
"""


class NetBedError(RuntimeError):
    """The bed cannot be built here (not root, a command missing) or a command failed."""


def _run(*args: str, input: str | None = None) -> str:
    """Run a command of the bed's; raise NetBedError with its output when it fails."""
    proc = subprocess.run(
        list(args), input=input, capture_output=True, text=True, timeout=30, check=False
    )
    if proc.returncode != 0:
        raise NetBedError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def check_requirements() -> None:
    """Fail (never skip) when the bed cannot be built: not root, or a command missing."""
    if os.geteuid() != 0:
        raise NetBedError(
            "the partition test bed needs root (network namespaces, nftables); "
            "CI runs the tests as root"
        )
    missing = [name for name in COMMANDS if shutil.which(name) is None]
    if missing:
        raise NetBedError(
            f"the partition test bed needs {', '.join(missing)}: install iproute2 and "
            "nftables (./run.sh test does)"
        )


def _namespaces() -> list[str]:
    out = _run("ip", "netns", "list")
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _index_of(namespace: str) -> int | None:
    """The bed index of one of the beds' namespace names, else None."""
    head = namespace.split("-", 1)[0]
    number = head.removeprefix(NAME_PREFIX)
    if head == number or not number.isdigit():
        return None
    return int(number)


def _lock(index: int) -> int | None:
    """An fd holding bed *index*'s lock, or None when a live bed holds it."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK_DIR / f"{index}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _remove(index: int, namespaces: list[str]) -> None:
    """Delete bed *index*'s namespaces and root interface; kill what still runs in them.

    The caller holds the index's lock: no live bed owns these.
    """
    mine = [ns for ns in namespaces if _index_of(ns) == index]
    for namespace in mine:
        pids = subprocess.run(
            ["ip", "netns", "pids", namespace], capture_output=True, text=True, check=False
        ).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
    for namespace in mine:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)
    subprocess.run(
        ["ip", "link", "del", f"{NAME_PREFIX}{index}c"], capture_output=True, check=False
    )


def sweep_leftovers() -> list[int]:
    """Remove what beds of dead runs left (their lock is free); the indexes swept."""
    namespaces = _namespaces()
    links = _run("ip", "-o", "link", "show").split("\n")
    indexes = {i for i in map(_index_of, namespaces) if i is not None}
    for line in links:
        parts = line.split(":")
        if len(parts) > 1:
            name = parts[1].strip().split("@", 1)[0]
            if name.startswith(NAME_PREFIX) and name.endswith("c"):
                number = name[len(NAME_PREFIX) : -1]
                if number.isdigit():
                    indexes.add(int(number))
    swept = []
    for index in sorted(indexes):
        fd = _lock(index)
        if fd is None:
            continue  # a live bed
        try:
            _remove(index, namespaces)
            swept.append(index)
        finally:
            os.close(fd)
    return swept


@dataclass(frozen=True)
class Host:
    """One host of a bed: its namespace, its address, its interface and the switch's end."""

    name: str
    namespace: str
    address: str
    port_name: str  # the veth end in the switch namespace


class NetBed:
    """Hosts *names* in namespaces of their own, joined by a switch; see the module docstring."""

    def __init__(self, names: list[str]) -> None:
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"hosts={names!r}: give one or more distinct names")
        for name in names:
            if not name.isalnum():
                raise ValueError(f"host name {name!r}: letters and digits only")
        self.names = list(names)
        self.index: int | None = None
        self._lock_fd: int | None = None
        self.hosts: dict[str, Host] = {}
        self._proxies: list[FaultProxy] = []  # the relays of slow()

    # -- building ---------------------------------------------------------------

    def start(self) -> NetBed:
        """Take a free index, sweep dead beds' leftovers, build the namespaces and links."""
        check_requirements()
        sweep_leftovers()
        for index in range(MAX_BEDS):
            fd = _lock(index)
            if fd is not None:
                self.index, self._lock_fd = index, fd
                break
        else:
            raise NetBedError(f"all {MAX_BEDS} bed indexes are in use")
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    @property
    def subnet(self) -> str:
        return f"{NET_PREFIX}.{self.index}"

    @property
    def switch(self) -> str:
        return f"{NAME_PREFIX}{self.index}-switch"

    @property
    def controller(self) -> str:
        """The test process's address in the bed (root namespace)."""
        return f"{self.subnet}.{CONTROLLER_HOST}"

    @property
    def controller_link(self) -> str:
        return f"{NAME_PREFIX}{self.index}c"

    def _build(self) -> None:
        assert self.index is not None
        _remove(self.index, _namespaces())  # a dead run's bed of this index, if the sweep raced
        _run("ip", "netns", "add", self.switch)
        self._ns(self.switch, "ip", "link", "set", "lo", "up")
        self._ns(self.switch, "ip", "link", "add", "br0", "type", "bridge")
        self._ns(self.switch, "ip", "link", "set", "br0", "up")
        # The controller: a veth from the root namespace to the switch.
        _run(
            "ip", "link", "add", self.controller_link, "type", "veth",
            "peer", "name", "ctl", "netns", self.switch,
        )  # fmt: skip
        _run("ip", "addr", "add", f"{self.controller}/24", "dev", self.controller_link)
        _run("ip", "link", "set", self.controller_link, "up")
        self._ns(self.switch, "ip", "link", "set", "ctl", "master", "br0", "up")
        for n, name in enumerate(self.names):
            host = Host(
                name=name,
                namespace=f"{NAME_PREFIX}{self.index}-{name}",
                address=f"{self.subnet}.{FIRST_HOST + n}",
                port_name=f"h{n}",
            )
            _run("ip", "netns", "add", host.namespace)
            _run(
                "ip", "link", "add", "eth0", "netns", host.namespace, "type", "veth",
                "peer", "name", host.port_name, "netns", self.switch,
            )  # fmt: skip
            self._ns(self.switch, "ip", "link", "set", host.port_name, "master", "br0", "up")
            self._ns(host.namespace, "ip", "link", "set", "lo", "up")
            self._ns(host.namespace, "ip", "addr", "add", f"{host.address}/24", "dev", "eth0")
            self._ns(host.namespace, "ip", "link", "set", "eth0", "up")
            self._ns(host.namespace, "nft", "-f", "-", input=NFT_TABLE)
            self.hosts[name] = host

    def _ns(self, namespace: str, *args: str, input: str | None = None) -> str:
        return _run("ip", "netns", "exec", namespace, *args, input=input)

    # -- using -------------------------------------------------------------------

    def address(self, name: str) -> str:
        return self.hosts[name].address

    def wrapper(self, name: str) -> list[str]:
        """The command prefix that runs a command inside host *name*'s namespace."""
        return ["ip", "netns", "exec", self.hosts[name].namespace]

    # -- faults ------------------------------------------------------------------

    def _rules(self, name: str, rules: list[str]) -> None:
        script = "".join(f"add rule inet netbed {rule}\n" for rule in rules)
        self._ns(self.hosts[name].namespace, "nft", "-f", "-", input=script)

    def cut(self, a: str, b: str) -> None:
        """Drop every packet between hosts *a* and *b*, both ways."""
        peer = self.address(b)
        self._rules(a, [f"output ip daddr {peer} drop", f"input ip saddr {peer} drop"])

    def cut_one_way(self, a: str, b: str) -> None:
        """Drop every packet *a* sends to *b*; *b*'s packets still reach *a*."""
        self._rules(a, [f"output ip daddr {self.address(b)} drop"])

    def isolate(self, name: str) -> None:
        """Drop every packet of host *name* but those to and from the controller."""
        self._rules(
            name,
            [
                f"output ip daddr != {self.controller} drop",
                f"input ip saddr != {self.controller} drop",
            ],
        )

    def lose(self, name: str, percent: float, to: str | None = None) -> None:
        """Drop *percent* % of the packets host *name* sends (to every host, or to *to*),
        at random, each packet on its own."""
        if not 0 < percent <= 100:
            raise ValueError(f"percent={percent!r}: between 0 (excluded) and 100")
        match = f"ip daddr {self.address(to)} " if to is not None else ""
        share = round(percent * 100)  # numgen draws 0..9999 per packet: hundredths of a percent
        draw = f"numgen random mod 10000 < {share} " if share < 10000 else ""
        self._rules(name, [f"output {match}{draw}drop"])

    def slow(self, name: str, to: str, port: int, delay_ms: float) -> FaultProxy:
        """Add *delay_ms* to each round trip of host *name*'s TCP connections to *to*:*port*.

        The kernel of the test machines has no ``netem`` qdisc (``tc qdisc add
        ... netem`` answers "Specified qdisc kind is unknown"), so the delay is
        a relay: a NAT rule in *name*'s namespace sends its new connections to
        *to*:*port* to a :class:`harness.proxy.FaultProxy` on the controller's
        address, which forwards each chunk half the delay late, each way. The
        connections *name* had open to *to*:*port* are cut (their packets
        dropped), as a link that turned slow would hold them until the client
        gives up; the client's next connections are the slow ones. *to* sees
        them come from the controller's address, so a :meth:`cut` between *name*
        and *to* would not stop the relayed connections: heal before cutting.
        :meth:`heal` closes the relay (its connections end: the client
        reconnects, directly).
        """
        proxy = FaultProxy(port, target_host=self.address(to), listen_host=self.controller)
        proxy.set_mode("delay", delay=delay_ms / 2000)
        self._proxies.append(proxy)
        target = f"ip daddr {self.address(to)} tcp dport {port}"
        self._rules(
            name,
            [
                f"relay {target} dnat ip to {self.controller}:{proxy.port}",
                f"output {target} drop",  # the connections opened before: not redirected
            ],
        )
        return proxy

    def heal(self) -> None:
        """Undo every fault: no drop rule and no netem left in any host."""
        for host in self.hosts.values():
            self._ns(host.namespace, "nft", "flush", "table", "inet", "netbed")
        proxies, self._proxies = self._proxies, []
        for proxy in proxies:
            proxy.close()

    # -- teardown ----------------------------------------------------------------

    def close(self) -> None:
        """Kill what runs in the bed's namespaces, delete them and the controller's veth."""
        for proxy in self._proxies:
            proxy.close()
        self._proxies = []
        if self.index is not None:
            try:
                _remove(self.index, _namespaces())
            finally:
                if self._lock_fd is not None:
                    os.close(self._lock_fd)
                    self._lock_fd = None
                self.index = None
                self.hosts = {}

    def __enter__(self) -> NetBed:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()
