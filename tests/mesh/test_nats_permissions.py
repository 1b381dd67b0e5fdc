"""The NATS users `voxmesh up` makes: strangers refused, each service refused outside its subjects, only provision
administers streams and the bucket, the observer only reads. A real nats-server with the written authorization."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.js import api

from messages import subjects
from messages.key_limits import LIMITS_BUCKET
from messages.streams import BUCKET, REQUESTS_STREAM, USAGE_STREAM, BusConfig
from services.bus.embedded import EmbeddedNats
from services.bus.nats_auth import NatsAuth, write_auth
from services.bus.provision import provision

MODEL = "tiny"
VIOLATION_TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def auth(tmp_path_factory) -> NatsAuth:
    return write_auth(tmp_path_factory.mktemp("nats-auth"))


@pytest.fixture(scope="module")
def server(auth: NatsAuth, tmp_path_factory) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(tmp_path_factory.mktemp("store"), config_file=auth.config_file) as running:
        yield running


class User:
    """A connection as one user, with the permission violations the server reported to it."""

    def __init__(self) -> None:
        self.violations: asyncio.Queue[str] = asyncio.Queue()
        self.nc: Client | None = None

    async def connect(self, server: EmbeddedNats, auth: NatsAuth, name: str) -> Client:
        async def on_error(error: Exception) -> None:
            await self.violations.put(str(error))

        self.nc = await nats.connect(server.url, user=name, password=auth.password(name), error_cb=on_error,
                                     allow_reconnect=False)
        return self.nc

    async def next_violation(self) -> str:
        """The next violation the server reported, lower case (as nats-py hands it on)."""
        return (await asyncio.wait_for(self.violations.get(), VIOLATION_TIMEOUT_S)).lower()


@pytest.fixture
async def as_user(server, auth) -> AsyncIterator:
    opened: list[User] = []

    async def open_as(name: str) -> User:
        user = User()
        await user.connect(server, auth, name)
        opened.append(user)
        return user

    yield open_as
    for user in opened:
        await user.nc.close()


@pytest.fixture
async def provisioned(as_user) -> None:
    admin = await as_user("provision")
    await provision(admin.nc.jetstream(), BusConfig(models=(MODEL,), num_partitions=2))


async def test_a_connection_without_credentials_or_with_a_wrong_password_is_refused(server):
    with pytest.raises(nats.errors.Error):
        await nats.connect(server.url, allow_reconnect=False, connect_timeout=5)
    with pytest.raises(nats.errors.Error):
        await nats.connect(server.url, user="gateway", password="not-its-password", allow_reconnect=False,
                           connect_timeout=5)


async def test_a_service_with_refused_credentials_stops_at_once_and_says_why(server, auth):
    """The service's own connect (it retries a server that is not up yet for a minute) gives up on the first
    authorization violation, naming the credentials, instead of retrying silently until its timeout."""
    from services.bus.connection import CredentialsRefused, connect

    with pytest.raises(CredentialsRefused) as refused:
        await asyncio.wait_for(connect(server.url, "decode-test", user="decode", password="not-its-password",
                                       initial_timeout_s=60.0), 20.0)
    assert "refused this service's credentials" in str(refused.value) and "VOXMESH_NATS_USER" in str(refused.value)
    good = await connect(server.url, "decode-test", user="decode", password=auth.password("decode"))
    await good.close()


@pytest.mark.parametrize(("name", "subject"), [
    ("gateway", subjects.codes(0, "r1")), ("gateway", subjects.audio("r1")),
    ("decode", subjects.request(MODEL)), ("decode", subjects.audio("r1")),
    ("vocoder", subjects.request(MODEL)), ("vocoder", subjects.codes(0, "r1")),
    ("colocated", subjects.request(MODEL)),
    ("prefill", subjects.prefill_request(MODEL)), ("prefill", subjects.codes(0, "r1")),
    ("prefill", subjects.audio("r1")), ("prefill", subjects.event("r1", "started")),
    ("gateway", subjects.kv_transfer("prefill-1")), ("vocoder", subjects.kv_transfer("prefill-1")),
    ("mtp", subjects.request(MODEL)), ("mtp", subjects.codes(0, "r1")), ("mtp", subjects.audio("r1")),
    ("mtp", subjects.event("r1", "started")), ("mtp", subjects.mtp_step("mtp-b")),
    ("gateway", subjects.mtp_step("mtp-a")), ("vocoder", subjects.mtp_step("mtp-a")),
    ("observer", subjects.request(MODEL)), ("observer", subjects.event("r1", "started")),
    ("observer", subjects.audio("r1")),
    # only the gateway records usage
    *((name, subjects.usage("r1")) for name in ("decode", "vocoder", "colocated", "prefill", "mtp", "observer")),
    # operator actions are bus endpoints: only the operator may ask a replica to drain
    ("gateway", subjects.admin("decode", "decode-1", "drain")),
    ("vocoder", subjects.admin("decode", "decode-1", "drain")),
    ("observer", subjects.admin("decode", "decode-1", "drain")),
])
async def test_a_service_may_not_publish_outside_its_subjects(as_user, name, subject):
    user = await as_user(name)
    await user.nc.publish(subject, b"forged")
    assert f'permissions violation for publish to "{subject.lower()}"' in await user.next_violation()


@pytest.mark.parametrize(("name", "subject"), [
    ("gateway", subjects.all_requests()), ("gateway", subjects.codes_of_partition(0)),
    ("decode", subjects.audio("r1")), ("vocoder", subjects.all_requests()),
    # only a prefill replica answers on a transfer subject: decode cannot pose as the replica holding an offer
    ("decode", subjects.kv_transfer("prefill-1")), ("gateway", subjects.kv_transfer("prefill-1")),
    ("prefill", subjects.all_requests()),
    ("observer", subjects.all_requests()), ("observer", subjects.all_codes()), ("observer", subjects.audio("r1")),
    ("mtp", subjects.all_requests()), ("mtp", subjects.audio("r1")), ("gateway", subjects.all_mtp_steps()),
])
async def test_a_service_may_not_subscribe_outside_its_subjects(as_user, name, subject):
    user = await as_user(name)
    await user.nc.subscribe(subject)
    assert f'permissions violation for subscription to "{subject.lower()}"' in await user.next_violation()


@pytest.mark.parametrize(("name", "subject", "reader"), [
    ("gateway", subjects.request(MODEL), "operator"), ("decode", subjects.codes(1, "r1"), "operator"),
    ("vocoder", subjects.audio("r1"), "gateway"), ("prefill", subjects.handoff_queue(MODEL), "operator"),
    ("prefill", subjects.request(MODEL), "operator"),
    ("decode", subjects.mtp_step("mtp-a"), "mtp"),  # decode asks an mtp replica on its own subject
])
async def test_a_service_reaches_its_own_subjects(as_user, provisioned, name, subject, reader):
    listener = await as_user(reader)
    received = await listener.nc.subscribe(subject)
    await listener.nc.flush()
    writer = await as_user(name)
    await writer.nc.publish(subject, b"allowed")
    assert (await received.next_msg(VIOLATION_TIMEOUT_S)).data == b"allowed"


async def test_decode_asks_a_prefill_replica_for_its_kv_and_gets_the_answer(as_user):
    """The KV transfer's request/reply (services.transfer): decode publishes on the prefill replica's subject, the
    prefill replica answers on decode's inbox (allowed as a response, never as a publish of its own)."""
    prefill = await as_user("prefill")

    async def answer(msg) -> None:
        await msg.respond(b"sending")

    await prefill.nc.subscribe(subjects.kv_transfer("prefill-1"), cb=answer)
    await prefill.nc.flush()
    decode = await as_user("decode")
    assert (await decode.nc.request(subjects.kv_transfer("prefill-1"), b"fetch", timeout=VIOLATION_TIMEOUT_S)).data \
        == b"sending"


@pytest.mark.parametrize("name", ["gateway", "decode", "vocoder", "colocated", "prefill", "mtp", "observer"])
async def test_only_provision_creates_or_deletes_streams_and_the_bucket(as_user, provisioned, name):
    user = await as_user(name)
    js = user.nc.jetstream(timeout=0.5)  # the refusal comes as a violation; the reply never does
    with pytest.raises(nats.errors.TimeoutError):
        await js.add_stream(api.StreamConfig(name="INTRUDER", subjects=["intruder.>"]))
    assert "permissions violation for publish" in await user.next_violation()
    with pytest.raises(nats.errors.TimeoutError):
        await js.delete_stream(REQUESTS_STREAM)
    assert "permissions violation for publish" in await user.next_violation()
    with pytest.raises(nats.errors.TimeoutError):
        await js.delete_key_value(BUCKET)
    assert "permissions violation for publish" in await user.next_violation()


async def test_the_observer_lists_and_reads_events_but_not_request_texts(as_user, provisioned):
    gateway = await as_user("gateway")
    await gateway.nc.jetstream().publish(subjects.request(MODEL), b"secret text")
    await gateway.nc.jetstream().publish(subjects.event("r1", "started"), b"{}")
    observer = await as_user("observer")
    js = observer.nc.jetstream(timeout=0.5)
    assert {info.config.name for info in await js.streams_info()} >= {REQUESTS_STREAM, f"KV_{BUCKET}"}
    tail = await js.subscribe(subjects.all_events(), ordered_consumer=True)
    assert (await tail.next_msg(VIOLATION_TIMEOUT_S)).data == b"{}"
    await (await gateway.nc.jetstream().key_value(BUCKET)).put(subjects.cancel_key("r1"), b"{}")
    bucket = await js.key_value(BUCKET)
    assert subjects.cancel_key("r1") in await bucket.keys()
    assert (await bucket.get(subjects.cancel_key("r1"))).value == b"{}"
    with pytest.raises(nats.errors.TimeoutError):  # reading, yes; writing, no
        await bucket.put(subjects.cancel_key("r2"), b"{}")
    assert "permissions violation for publish" in await observer.next_violation()
    with pytest.raises(nats.errors.TimeoutError):
        await js.get_msg(REQUESTS_STREAM, 1)
    assert "permissions violation for publish" in await observer.next_violation()


def test_passwords_are_readable_by_their_owner_only(auth: NatsAuth):
    for path in [auth.config_file, *Path(auth.directory).glob("*.password")]:
        assert path.stat().st_mode & 0o077 == 0, path


def test_provision_writes_a_clusters_users_and_provisions_as_its_own_user(tmp_path):
    directory = tmp_path / "auth"
    cli = [sys.executable, "-m", "services.cli", "provision"]
    subprocess.run([*cli, "--write-nats-auth", str(directory)], check=True, capture_output=True, timeout=60)
    written = NatsAuth(directory)
    with EmbeddedNats(tmp_path / "store", config_file=written.config_file) as cluster:
        env = dict(os.environ, VOXMESH_NATS_URL=cluster.url, VOXMESH_NATS_USER="provision",
                   VOXMESH_NATS_PASSWORD_FILE=str(written.password_file("provision")))
        done = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert written.password("provision") not in done.stdout + done.stderr


@pytest.mark.parametrize("name", ["decode", "vocoder", "colocated", "prefill", "mtp", "observer"])
async def test_only_the_gateway_drops_a_request_from_the_queue(as_user, provisioned, name):
    gateway = await as_user("gateway")
    sequence = (await gateway.nc.jetstream().publish(subjects.request(MODEL), b"queued")).seq
    user = await as_user(name)
    with pytest.raises(nats.errors.TimeoutError):  # the API request itself (the client's delete_msg waits 5 s)
        await user.nc.request(f"{api.DEFAULT_PREFIX}.STREAM.MSG.DELETE.{REQUESTS_STREAM}",
                              json.dumps({"seq": sequence}).encode(), timeout=0.5)
    assert "permissions violation for publish" in await user.next_violation()
    assert await gateway.nc.jetstream().delete_msg(REQUESTS_STREAM, sequence)


@pytest.mark.parametrize("name", ["decode", "vocoder", "colocated", "prefill", "mtp", "observer"])
async def test_only_the_gateway_writes_the_keys_limits(as_user, provisioned, name):
    """A key's rate, seats and daily audio (`voxmesh-limits`) are the gateways' alone: no other service can refill
    a bucket or free a seat."""
    gateway = await as_user("gateway")
    limits = await gateway.nc.jetstream().key_value(LIMITS_BUCKET)
    await limits.put("rate.k", b"{}")  # the gateway may
    user = await as_user(name)
    bucket = await user.nc.jetstream(timeout=0.5).key_value(LIMITS_BUCKET)
    with pytest.raises(nats.errors.TimeoutError):
        await bucket.put("rate.k", b"forged")
    assert "permissions violation for publish" in await user.next_violation()
    with pytest.raises(nats.errors.TimeoutError):
        await user.nc.jetstream(timeout=0.5).purge_stream(f"KV_{LIMITS_BUCKET}")
    assert "permissions violation for publish" in await user.next_violation()


@pytest.mark.parametrize("name", ["decode", "vocoder", "colocated", "prefill", "mtp", "observer"])
async def test_only_the_gateway_records_and_reads_usage(as_user, provisioned, name):
    from services.usage.reader import read_usage  # the gateway's own read (an ephemeral consumer)

    gateway = await as_user("gateway")
    stored = (await gateway.nc.jetstream().publish(subjects.usage("r1"), b"record")).seq
    user = await as_user(name)
    js = user.nc.jetstream(timeout=0.5)
    with pytest.raises(nats.errors.TimeoutError):
        await js.pull_subscribe(subjects.all_usage(), stream=USAGE_STREAM)
    assert "permissions violation for publish" in await user.next_violation()
    with pytest.raises(nats.errors.TimeoutError):
        await js.get_msg(USAGE_STREAM, stored)
    assert "permissions violation for publish" in await user.next_violation()
    await read_usage(gateway.nc.jetstream(), 0.0)  # the gateway reads it (its records: not decodable here)
    assert gateway.violations.empty()
