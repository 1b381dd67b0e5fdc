"""The `replicas` topology spread over three test hosts, one nats-server of a three-member cluster on each.

Placement: no two replicas of a service share a host, and every host but one holds a gateway, so that a lost or
cut-off host always leaves a gateway for the test's clients and a replica of everything it held:

    h1: nats, gateway, decode        h2: nats, decode, vocoder        h3: nats, gateway, vocoder

Each service is started with the repo's own command and environment (compose/replicas.yml, as `voxmesh up` runs
it: `python -m services.cli serve <role>`, its own NATS user and password file), given every member's URL with its
own host's first, and binds nothing but its host's address (the gateways; the others listen nowhere). Provisioning
(`voxmesh provision`, three replicas of every stream) runs on h2 first. The vocoder's codec batching is off, as in
the one-host `replicas` tests: re-decoded audio then matches the first time's byte for byte.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import nats.errors
from nats.js.errors import ServiceUnavailableError

from services.mesh.compose_plan import ServicePlan, container_only_removed, load_plan
from services.mesh.resume_secret import ensure_resume_secret
from services.runtime.lifecycle import micro_name
from tests.support.mesh_client import NUM_PARTITIONS, replicas_serving, settled_replica_stats
from tests.support.host_cluster import MONITOR_PORT, HostCluster
from tests.support.host_process import HostProcess
from tests.support.netns_hosts import Hosts

PLACEMENT = (("gateway", "decode"), ("decode", "vocoder"), ("gateway", "vocoder"))
PROVISION_HOST = 1
GATEWAY_PORT = 8000
START_TIMEOUT_S = 240.0
# A partition may lack a live vocoder for a whole lease and an election across hosts before another claims it: the
# gateway's grace (5 s by default, made for one host) must outlast that, as a multi-host deployment's must.
MESH_ENV = {"VOXMESH_CODEC_BATCHING": "false", "VOXMESH_VOCODER_GRACE_S": "20"}
_INHERITED_CREDENTIALS = ("VOXMESH_NATS_PASSWORD", "VOXMESH_NATS_TOKEN", "VOXMESH_NATS_CREDS_FILE",
                          "VOXMESH_NATS_URL", "VOXMESH_NATS_USER")


@dataclass
class HostMesh:
    """The hosts, their cluster, and each service process by name (`gateway@h1`, `decode@h2`...)."""

    hosts: Hosts
    cluster: HostCluster
    model_dir: Path
    state_dir: Path
    services: dict[str, HostProcess] = field(default_factory=dict)
    first_connections: list[list[dict]] = field(default_factory=list)  # each member's clients once all served

    def gateway_urls(self) -> list[str]:
        return [f"http://{self.hosts[i].address}:{GATEWAY_PORT}" for i, roles in enumerate(PLACEMENT)
                if "gateway" in roles]

    def gateway_url_of(self, index: int) -> str:
        return f"http://{self.hosts[index].address}:{GATEWAY_PORT}"

    def on_host(self, index: int) -> dict[str, HostProcess]:
        suffix = f"@{self.hosts[index].name}"
        return {name: process for name, process in self.services.items() if name.endswith(suffix)}

    def environment(self, plan: ServicePlan, index: int) -> dict[str, str]:
        """`plan`'s environment for a process on host `index`, as `voxmesh up` gives it, with this cluster's URLs
        (its own host's member first) and its own NATS user."""
        role = plan.command[2] if plan.command[1] == "serve" else "provision"
        env = {key: value for key, value in os.environ.items() if key not in _INHERITED_CREDENTIALS}
        env.update(container_only_removed(plan.environment))
        env.update(MESH_ENV, PYTHONUNBUFFERED="1")
        env.update({
            "VOXMESH_NATS_URL": ",".join(self.cluster.urls(first=index)),
            "VOXMESH_NATS_USER": role,
            "VOXMESH_NATS_PASSWORD_FILE": str(self.cluster.auth.password_file(role)),
            "VOXMESH_MODEL_DIR": str(self.model_dir),
            "VOXMESH_HOST": self.hosts[index].address,
            "VOXMESH_PORT": str(GATEWAY_PORT),
            "VOXMESH_STREAM_REPLICAS": str(len(self.hosts.hosts)),
        })
        if role == "gateway":
            env["VOXMESH_RESUME_SECRET_FILE"] = str(ensure_resume_secret(self.state_dir))
        return env

    def start(self) -> None:
        plan = load_plan("replicas")
        provision = plan.one_shot[0]
        step = HostProcess("provision", self.hosts[PROVISION_HOST], _local(provision.command),
                           self.environment(provision, PROVISION_HOST))
        if step.process.wait(120) != 0:
            raise RuntimeError(f"provisioning failed:\n{step.tail()}")
        by_role = {service.command[2]: service for service in plan.services}
        for index, roles in enumerate(PLACEMENT):
            for role in roles:
                self.start_service(by_role[role], index)
        asyncio.run(self.wait_serving())
        self.first_connections = [connections(host.address) for host in self.hosts.hosts]

    def start_service(self, plan: ServicePlan, index: int) -> HostProcess:
        name = f"{plan.command[2]}@{self.hosts[index].name}"
        self.services[name] = HostProcess(name, self.hosts[index], _local(plan.command), self.environment(plan, index))
        return self.services[name]

    async def wait_serving(self, avoiding: tuple[int, ...] = ()) -> None:
        """Until both gateways answer /ready, two decode replicas hold live leases, and each of the two vocoders
        serves its share of the partitions (no hand-off under way). A JetStream call that finds no leader (a
        member back from a partition forces elections with its higher term) is asked again, within the bound."""
        urls = self.cluster.operator_urls(avoiding)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                await asyncio.gather(*(self._ready(url) for url in self.gateway_urls()),
                                     replicas_serving(urls, "decode", 2), replicas_serving(urls, "vocoder", 2))
                await settled_replica_stats(urls, micro_name("vocoder"), 2, _each_serves_its_share)
                return
            except (nats.errors.TimeoutError, ServiceUnavailableError, nats.errors.NoRespondersError):
                if time.monotonic() > deadline:
                    raise

    async def _ready(self, gateway_url: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        async with httpx.AsyncClient(timeout=5.0) as client:
            while time.monotonic() < deadline:
                try:
                    if (await client.get(f"{gateway_url}/ready")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                self._check_alive()
                await asyncio.sleep(0.25)  # a readiness probe's interval, as `voxmesh up` waits for its gateway
        raise RuntimeError(f"{gateway_url} was not ready within {START_TIMEOUT_S}s")

    def _check_alive(self) -> None:
        for name, process in self.services.items():
            if not process.running():
                raise RuntimeError(f"{name} exited during start-up:\n{process.tail()}")

    def stop(self) -> None:
        for process in self.services.values():
            process.stop(timeout_s=15)
        self.cluster.stop()


def connections(address: str) -> list[dict]:
    """The client connections one member holds (its monitoring endpoint, on its host's address)."""
    reply = httpx.get(f"http://{address}:{MONITOR_PORT}/connz", params={"auth": "true", "limit": 1024}, timeout=10)
    reply.raise_for_status()
    return reply.json().get("connections") or []


def _each_serves_its_share(stats: dict[str, dict]) -> bool:
    served = sorted(partition for data in stats.values() for partition in data["partitions"])
    return served == list(range(NUM_PARTITIONS)) and all(len(data["partitions"]) == NUM_PARTITIONS // 2
                                                         for data in stats.values())


def _local(command: tuple[str, ...]) -> list[str]:
    """`voxmesh ...` as this interpreter runs it (no PATH lookup, the worktree's code)."""
    return [sys.executable, "-m", "services.cli", *command[1:]]
