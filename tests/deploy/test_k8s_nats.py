"""The NATS StatefulSet is the cluster the official NATS Helm chart renders (3 servers, routes through the headless
service, JetStream on a volume each, probes on the monitor's /healthz) with voxmesh's users and store key from the
Secret that `voxmesh provision --write-nats-config` fills, and a real nats-server accepts its configuration as the
pod would see it."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from services.bus.embedded import find_nats_server
from tests.support.kustomize import OVERLAYS, one, rendered
from tests.support.pod_specs import container, environment, literal_values

CONFIG_DIR = "/etc/nats-config"


def nats_parts(overlay: str):
    objects = rendered(overlay)
    return objects, one(objects, "StatefulSet", "nats"), container(objects, "nats")


def option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_three_servers_routed_to_each_other_with_jetstream_on_a_volume_each(overlay):
    objects, nats, found = nats_parts(overlay)
    replicas = nats["spec"]["replicas"]
    assert replicas == 3
    config = one(objects, "ConfigMap", "nats-config")["data"]["nats.conf"]
    routes = re.findall(r"nats://[^\s\]]+", config)
    ports = found.ports()
    assert routes == [f"nats://nats-{i}.{nats['spec']['serviceName']}:{ports['cluster']}" for i in range(replicas)]
    assert re.search(r"^\s*no_advertise: true$", config, re.M)  # clients reconnect through the Service
    assert re.search(rf"^port: {ports['nats']}$", config, re.M)
    assert re.search(rf"^http_port: {ports['monitor']}$", config, re.M)
    assert re.search(r"^server_name: \$SERVER_NAME$", config, re.M)
    [server_name] = [e for e in found.spec["env"] if e["name"] == "SERVER_NAME"]
    assert server_name["value"] == "$(POD_NAME)"  # nats-0...: what KEDA matches the consumer's leader against
    args = found.command
    assert option(args, "--config") == f"{CONFIG_DIR}/nats.conf" and "--jetstream" in args
    [claim] = nats["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in found.spec["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == option(args, "--store_dir")  # file storage, on the volume
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert found.spec["livenessProbe"]["httpGet"] == {"path": "/healthz?js-enabled-only=true", "port": "monitor"}
    provision = literal_values(environment(objects, container(objects, "voxmesh-provision")))
    assert int(provision["VOXMESH_STREAM_REPLICAS"]) == replicas


def _config_folder(overlay: str, secret_dir, target) -> list[str]:
    """The pod's /etc/nats-config laid out in `target` from the projected volume's sources: the ConfigMap's items
    from the rendered ConfigMap, the Secret's from `secret_dir`. Returns the container's arguments pointed there."""
    objects, nats, found = nats_parts(overlay)
    [volume] = [v for v in nats["spec"]["template"]["spec"]["volumes"] if v["name"] == "config"]
    for source in volume["projected"]["sources"]:
        if "configMap" in source:
            data = one(objects, "ConfigMap", source["configMap"]["name"])["data"]
            for item in source["configMap"]["items"]:
                (target / item["path"]).write_text(data[item["key"]])
        else:
            assert source["secret"]["name"] == "voxmesh-nats"
            for item in source["secret"]["items"]:
                (target / item["path"]).write_bytes((secret_dir / item["key"]).read_bytes())
    return [str(target / "nats.conf") if arg == f"{CONFIG_DIR}/nats.conf" else arg for arg in found.command]


def test_a_nats_server_accepts_the_configuration_with_the_secret_provision_writes(tmp_path):
    secret_dir, folder = tmp_path / "secret", tmp_path / "nats-config"
    folder.mkdir()
    done = subprocess.run([sys.executable, "-m", "services.cli", "provision", "--write-nats-config", str(secret_dir)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    args = _config_folder(OVERLAYS[0], secret_dir, folder)
    args[args.index("--store_dir") + 1] = str(tmp_path / "data")
    server = [str(find_nats_server()), *args, "-t"]
    env = {"SERVER_NAME": "nats-0", "PATH": "/usr/bin:/bin"}
    checked = subprocess.run(server, capture_output=True, text=True, timeout=60, env=env)
    assert checked.returncode == 0 and "is valid" in checked.stdout + checked.stderr, checked.stderr
    (folder / "voxmesh.conf").unlink()  # without the Secret's part the server refuses to start
    checked = subprocess.run(server, capture_output=True, text=True, timeout=60, env=env)
    assert checked.returncode != 0 and "voxmesh.conf" in checked.stderr, checked.stderr
