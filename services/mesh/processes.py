"""Local child processes of `voxmesh up`: started from a launch plan, restarted as compose would, none left behind.

Children get SIGTERM when this process dies for any reason (Linux parent-death signal, `services.bus.parent_death`),
so even a `kill -9` of `voxmesh up` leaves no service running (nor its embedded nats-server: `services.bus.embedded`).
A service that exits while the mesh runs is restarted when its compose `restart` policy says so (as `docker compose`
would); one that keeps dying, or has no restart policy, stops the mesh: a half mesh serves nothing right.
"""

from __future__ import annotations

from collections.abc import Callable

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from services.mesh.compose_plan import ServicePlan
from services.bus.parent_death import die_with_parent

log = logging.getLogger(__name__)

MAX_RESTARTS = 5  # within RESTART_WINDOW_S, then the mesh gives up
RESTART_WINDOW_S = 60.0


def local_command(command: tuple[str, ...]) -> list[str]:
    """The compose command as run here: `voxmesh ...` through this interpreter (no PATH lookup needed)."""
    if command and command[0] == "voxmesh":
        return [sys.executable, "-m", "services.cli", *command[1:]]
    return list(command)


@dataclass
class Child:
    name: str
    plan: ServicePlan
    env: dict[str, str]
    process: subprocess.Popen
    restarts: list[float] = field(default_factory=list)


class ProcessGroup:
    """The mesh's processes. `wake` is set when the mesh must stop (a child died past its restart policy)."""

    def __init__(self, wake: threading.Event) -> None:
        self.children: list[Child] = []
        self.wake = wake
        self.exited_child: Child | None = None
        self._stopping = False
        self._lock = threading.Lock()

    def run_one_shot(self, plan: ServicePlan, env: dict[str, str], timeout_s: float) -> None:
        """Run a one-shot step (provisioning) to completion; raise with its output if it fails."""
        result = subprocess.run(local_command(plan.command), env=env, capture_output=True, text=True,
                                timeout=timeout_s, preexec_fn=die_with_parent)
        if result.returncode != 0:
            raise RuntimeError(f"{plan.name} exited with {result.returncode}:\n{result.stderr[-4000:]}")

    def start(self, plan: ServicePlan, env: dict[str, str],
              replica_env: Callable[[int], dict[str, str]] = lambda _replica: {}) -> None:
        """Start every replica of `plan`; replica k's environment is `env` plus `replica_env(k)` (its GPU)."""
        for index in range(plan.replicas):
            name = plan.name if plan.replicas == 1 else f"{plan.name}-{index}"
            child_env = {**env, **replica_env(index)}
            child = Child(name, plan, child_env, self._spawn(plan, child_env))
            self.children.append(child)
            log.info("started %s (pid %d)", name, child.process.pid)
            threading.Thread(target=self._watch, args=(child,), name=f"watch-{name}", daemon=True).start()

    @staticmethod
    def _spawn(plan: ServicePlan, env: dict[str, str]) -> subprocess.Popen:
        # A session of its own: a terminal's Ctrl-C reaches only `voxmesh up`, which then
        # stops the children once, in order, instead of every process at the same time.
        return subprocess.Popen(local_command(plan.command), env=env, stdin=subprocess.DEVNULL,
                                preexec_fn=die_with_parent, start_new_session=True)

    def _watch(self, child: Child) -> None:
        while True:
            code = child.process.wait()
            with self._lock:
                if self._stopping:
                    return
                if not self._may_restart(child, code):
                    log.error("%s exited with code %s; stopping the mesh", child.name, code)
                    self.exited_child = child
                    self.wake.set()
                    return
                child.restarts.append(time.monotonic())
                child.process = self._spawn(child.plan, child.env)
                log.warning("%s exited with code %s; restarted it (pid %d)", child.name, code, child.process.pid)

    @staticmethod
    def _may_restart(child: Child, code: int) -> bool:
        policy = child.plan.restart
        if policy in ("always", "unless-stopped") or (policy == "on-failure" and code != 0):
            recent = [t for t in child.restarts if time.monotonic() - t < RESTART_WINDOW_S]
            child.restarts = recent
            return len(recent) < MAX_RESTARTS
        return False

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM every child (they drain), wait, then SIGKILL whatever is still there."""
        with self._lock:
            self._stopping = True
        for child in self.children:
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        for child in self.children:
            try:
                child.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %ss; killing it", child.name, timeout_s)
                child.process.kill()
                child.process.wait()


def child_environment(base: dict[str, str], overrides: dict[str, str]) -> dict[str, str]:
    """This process's environment, then the compose file's, then the local overrides (NATS URL, model, port)."""
    env = dict(os.environ)
    env.update(base)
    env.update(overrides)
    return env
