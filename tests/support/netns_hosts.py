"""Hosts for tests as Linux network namespaces (root only): each with its own address on one bridge.

The bridge lives in a namespace of its own (the "switch"); each host namespace gets a veth pair whose other end is a
port of that bridge, created directly in the two namespaces (nothing passes through the machine's own namespace).
The subnet is one that appears nowhere in the machine's routes or addresses (checked at run time among a few
candidates; refused if all collide). The test process reaches the hosts through one more veth into the switch: the
only thing it adds to its own namespace, with an address in the test subnet, removed with the rest.

`Hosts.create()` builds it all; `Hosts.destroy()` kills every process left in the host namespaces and deletes every
namespace and link (idempotent). Faults: `cut(host)` / `mend(host)` take a host's bridge port down / up;
`freeze(host)` / `thaw(host)` SIGSTOP / SIGCONT every process in it; `isolate(host)` / `rejoin(host)` drop / allow
its traffic with the other hosts (the test process still reaches it).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import signal
import subprocess
from dataclasses import dataclass

PREFIX = "vmhost"
"""Every namespace this helper makes is named `<PREFIX>-<token>-<role>`: a session-end check looks for leftovers."""

CANDIDATE_SUBNETS = ("10.250.77.0/24", "10.251.77.0/24", "172.31.250.0/24", "192.168.250.0/24", "10.199.77.0/24")
CLIENT_OCTET = 254
BRIDGE = "br0"


class NetnsError(RuntimeError):
    """An `ip` command failed, or no test subnet is free."""


def ip(*args: str, check: bool = True) -> str:
    """Run `ip ARGS...`; its output (NetnsError with its message when it fails and `check`)."""
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def networks_in_use() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Every destination of the machine's IPv4 and IPv6 routes (all tables but the default route) and every network
    of its addresses."""
    found = []
    for family in ("-4", "-6"):
        for line in ip(family, "-o", "route", "show", "table", "all").splitlines():
            destination = line.split()[0] if line.split() else ""
            if destination in ("default", "unreachable", "local", "broadcast", "multicast", "anycast"):
                destination = line.split()[1] if destination != "default" and len(line.split()) > 1 else ""
            try:
                found.append(ipaddress.ip_network(destination, strict=False))
            except ValueError:
                continue
        for line in ip(family, "-o", "addr", "show").splitlines():
            words = line.split()
            if "inet" in words or "inet6" in words:
                found.append(ipaddress.ip_interface(words[words.index("inet6" if "inet6" in words else "inet") + 1])
                             .network)
    return found


def free_subnet() -> ipaddress.IPv4Network:
    """The first candidate subnet that overlaps nothing the machine routes or holds."""
    used = [network for network in networks_in_use() if network.version == 4 and network.prefixlen > 0]
    for candidate in map(ipaddress.IPv4Network, CANDIDATE_SUBNETS):
        if not any(candidate.overlaps(network) for network in used):
            return candidate
    raise NetnsError(f"every candidate test subnet {CANDIDATE_SUBNETS} collides with this machine's routes")


def leftover_namespaces() -> list[str]:
    """Namespaces named with this helper's prefix that exist now."""
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.startswith(PREFIX + "-")]


@dataclass(frozen=True)
class Host:
    """One host: its namespace and its address."""

    name: str
    namespace: str
    address: str
    port: str  # its veth end on the bridge, in the switch namespace

    def command(self, *argv: str) -> list[str]:
        """`argv` run inside this host (`ip netns exec` sets the namespace and execs: the pid is argv's)."""
        return ["ip", "netns", "exec", self.namespace, *argv]


class Hosts:
    """`count` hosts (h1, h2, ...) on one bridge, and the test process's own link to it."""

    def __init__(self, count: int) -> None:
        self.token = secrets.token_hex(3)
        self.subnet = free_subnet()
        base = f"{PREFIX}-{self.token}"
        self.switch = f"{base}-sw"
        addresses = list(self.subnet.hosts())
        self.hosts = [Host(f"h{i + 1}", f"{base}-h{i + 1}", str(addresses[i]), f"h{i + 1}") for i in range(count)]
        self.client_address = str(addresses[CLIENT_OCTET - 1])
        self.client_link = f"vmh{self.token}"  # in the test process's namespace; at most 15 characters
        self._isolated: set[str] = set()

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def create(self) -> Hosts:
        try:
            self._create()
        except BaseException:
            self.destroy()
            raise
        return self

    def _create(self) -> None:
        prefix = self.subnet.prefixlen
        ip("netns", "add", self.switch)
        ip("-n", self.switch, "link", "add", BRIDGE, "type", "bridge")
        ip("-n", self.switch, "link", "set", BRIDGE, "up")
        for host in self.hosts:
            ip("netns", "add", host.namespace)
            ip("-n", host.namespace, "link", "set", "lo", "up")
            ip("-n", self.switch, "link", "add", host.port, "type", "veth", "peer", "name", "eth0", "netns",
               host.namespace)
            ip("-n", self.switch, "link", "set", host.port, "master", BRIDGE, "up")
            ip("-n", host.namespace, "addr", "add", f"{host.address}/{prefix}", "dev", "eth0")
            ip("-n", host.namespace, "link", "set", "eth0", "up")
        ip("-n", self.switch, "link", "add", "client", "type", "veth", "peer", "name", self.client_link, "netns",
           str(os.getpid()))
        ip("-n", self.switch, "link", "set", "client", "master", BRIDGE, "up")
        ip("addr", "add", f"{self.client_address}/{prefix}", "dev", self.client_link)
        ip("link", "set", self.client_link, "up")

    def pids(self, host: Host) -> list[int]:
        """Every process in `host`'s namespace."""
        return [int(pid) for pid in ip("netns", "pids", host.namespace, check=False).split()]

    def freeze(self, host: Host) -> list[int]:
        """SIGSTOP every process of `host` (alive but silent); returns them."""
        frozen = self.pids(host)
        for pid in frozen:
            _signal(pid, signal.SIGSTOP)
        return frozen

    def thaw(self, host: Host) -> None:
        for pid in self.pids(host):
            _signal(pid, signal.SIGCONT)

    def thaw_all(self) -> None:
        """SIGCONT everything, mend every port and drop every filter: the hosts as created."""
        for host in self.hosts:
            self.thaw(host)
            self.mend(host)
            if host.namespace in self._isolated:
                self.rejoin(host)

    def cut(self, host: Host) -> None:
        """Take `host`'s bridge port down: nothing reaches it, it reaches nothing."""
        ip("-n", self.switch, "link", "set", host.port, "down")

    def mend(self, host: Host) -> None:
        ip("-n", self.switch, "link", "set", host.port, "up")

    def isolate(self, host: Host) -> None:
        """Drop `host`'s traffic with every other host (a filter in its own namespace); the test process, in the
        test subnet too, still reaches it."""
        for other in self.hosts:
            if other is not host:
                self._filter(host, "-I", other.address)
        self._isolated.add(host.namespace)

    def rejoin(self, host: Host) -> None:
        for other in self.hosts:
            if other is not host:
                self._filter(host, "-D", other.address)
        self._isolated.discard(host.namespace)

    @staticmethod
    def _filter(host: Host, action: str, peer: str) -> None:
        for chain, direction in (("INPUT", "-s"), ("OUTPUT", "-d")):
            subprocess.run(host.command("iptables", action, chain, direction, peer, "-j", "DROP"), check=True,
                           capture_output=True, timeout=30)

    def destroy(self) -> None:
        """Kill every process left in a host namespace, delete every namespace and the test process's link."""
        for host in self.hosts:
            for pid in self.pids(host):
                _signal(pid, signal.SIGKILL)
                _signal(pid, signal.SIGCONT)
        ip("link", "del", self.client_link, check=False)
        for namespace in [host.namespace for host in self.hosts] + [self.switch]:
            ip("netns", "del", namespace, check=False)
        left = [name for name in leftover_namespaces() if name.startswith(f"{PREFIX}-{self.token}-")]
        if left:
            raise NetnsError(f"namespaces left behind: {left}")


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
