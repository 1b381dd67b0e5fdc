"""The keys file, the keyring and the token bucket's arithmetic (issue 42): no server, no socket."""

from __future__ import annotations

import hashlib
import os

import pytest

from messages.errors import ErrorCode
from services.gateway.http.auth import Unauthorized
from services.gateway.tenancy.keyring import Keyring
from services.gateway.tenancy.keys_file import KeysFileError, entry_text, parse_keys_document, read_keys_file
from services.gateway.tenancy.refusals import LimitRefused, RateHeaders
from services.gateway.tenancy.tenant import Limits, PriorityNotAllowed, Tenant
from services.gateway.tenancy.token_bucket import BucketState, take_one


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


FILE = f"""
[defaults]
requests_per_s = 2
live_requests = 3

[keys.reader]
sha256 = "{digest('reader-secret')}"
class = "pro"
requests_per_s = 10
burst = 20
audio_s_per_day = 3600
priority = "batch"

[keys.agent]
sha256 = "{digest('agent-secret')}"
live_requests = -1
"""


def test_a_keys_file_names_each_key_with_its_limits_and_defaults(tmp_path):
    path = tmp_path / "keys.toml"
    path.write_text(FILE)
    parsed = read_keys_file(path)
    reader, agent = (entry.tenant for entry in parsed.entries)
    assert reader.name == reader.limit_key == "reader" and reader.key_class == "pro"
    assert reader.limits == Limits(requests_per_s=10, burst=20, live_requests=3, audio_s_per_day=3600)
    assert (reader.priority, reader.max_priority) == ("batch", "batch")
    assert agent.limits == Limits(requests_per_s=2, live_requests=None) and agent.key_class == "default"
    assert agent.limits.bucket_size == 2


@pytest.mark.parametrize("bad, says", [
    ('[keys.a]\nsha256 = "abc"\n', "sha256"),
    (f'[keys."a.b"]\nsha256 = "{digest("x")}"\n', "name"),
    (f'[keys.a]\nsha256 = "{digest("x")}"\nlive_requests = 1.5\n', "whole"),
    (f'[keys.a]\nsha256 = "{digest("x")}"\nrequests_per_s = 0\n', "> 0"),
    (f'[keys.a]\nsha256 = "{digest("x")}"\npriority = "urgent"\n', "priority"),
    (f'[keys.a]\nsha256 = "{digest("x")}"\npriority = "interactive"\nmax_priority = "batch"\n', "above"),
    (f'[keys.a]\nsha256 = "{digest("x")}"\nsecret = "x"\n', "unknown"),
    (f'[keys.a]\nsha256 = "{digest("x")}"\n[keys.b]\nsha256 = "{digest("x")}"\n', "same secret"),
    ('[limits]\n', "unknown tables"),
])
def test_a_bad_entry_is_refused_saying_where(tmp_path, bad, says):
    path = tmp_path / "keys.toml"
    path.write_text(bad)
    with pytest.raises(KeysFileError, match=says):
        read_keys_file(path)


def test_keys_hash_makes_an_entry_the_file_reads_back():
    import tomllib
    parsed = parse_keys_document(tomllib.loads(entry_text("svc", b"s3cret", "free")))
    assert parsed.entries[0].digest == hashlib.sha256(b"s3cret").digest()
    assert parsed.entries[0].tenant.key_class == "free"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_keyring_authenticates_named_and_unnamed_keys_and_refuses_others(tmp_path):
    path = tmp_path / "keys.toml"
    path.write_text(FILE)
    ring = Keyring((b"bare-one", b"bare-two"), path)
    assert ring.authenticate("Bearer reader-secret").name == "reader"
    one, two = ring.authenticate("Bearer bare-one"), ring.authenticate("bearer bare-two")
    assert one.name == two.name == "" and one.limit_key != two.limit_key, "unnamed keys are limited each on its own"
    assert one.limits == Limits(requests_per_s=2, live_requests=3), "the bare list takes the file's defaults"
    for wrong in (None, "", "Bearer nope", "Basic reader-secret", "Bearer " + digest("reader-secret")):
        with pytest.raises(Unauthorized):
            ring.authenticate(wrong)


def test_without_keys_every_call_is_the_anonymous_tenant_with_the_defaults(tmp_path):
    assert Keyring().authenticate(None).limits == Limits()
    path = tmp_path / "keys.toml"
    path.write_text("[defaults]\nrequests_per_s = 1\n")
    anonymous = Keyring((), path).authenticate("Bearer whatever")
    assert anonymous.name == "" and anonymous.limits.requests_per_s == 1 and anonymous.key_class == "anonymous"


def test_an_edit_is_read_within_the_interval_and_a_bad_edit_keeps_the_keys(tmp_path):
    path, clock = tmp_path / "keys.toml", Clock()
    path.write_text(FILE)
    ring = Keyring((), path, clock=clock)
    path.write_text(FILE.replace("[keys.agent]", "[keys.agent2]"))
    os.utime(path, ns=(1, 10**18))  # a new mtime whatever the file system's resolution
    assert ring.authenticate("Bearer agent-secret").name == "agent", "not re-read before the interval"
    clock.now = 1.5
    assert ring.authenticate("Bearer agent-secret").name == "agent2"
    path.write_text("[keys.broken\n")
    os.utime(path, ns=(1, 2 * 10**18))
    clock.now = 3.0
    assert ring.authenticate("Bearer agent-secret").name == "agent2", "a bad edit keeps the keys in force"
    path.unlink()
    clock.now = 4.5
    assert ring.authenticate("Bearer reader-secret").name == "reader", "a removed file keeps the keys too"


def test_a_key_may_ask_for_its_priority_or_below_never_above():
    batch_only = Tenant(name="b", limit_key="b", priority="batch", max_priority="batch")
    assert batch_only.allowed_priority(None) == "batch" and batch_only.allowed_priority("batch") == "batch"
    with pytest.raises(PriorityNotAllowed) as refused:
        batch_only.allowed_priority("interactive")
    assert refused.value.code is ErrorCode.PRIORITY_NOT_ALLOWED and refused.value.status == 403
    both = Tenant(name="i", limit_key="i", priority="batch", max_priority="interactive")
    assert both.allowed_priority(None) == "batch" and both.allowed_priority("interactive") == "interactive"


def test_the_bucket_admits_its_burst_then_its_rate():
    state, rate, size = None, 2.0, 3.0
    admitted = []
    for _ in range(5):  # all at t=0: the burst of 3, then refusals
        take = take_one(state, rate, size, 100.0)
        admitted.append(take.admitted)
        state = take.state if take.admitted else state
    assert admitted == [True, True, True, False, False]
    refused = take_one(state, rate, size, 100.0)
    assert refused.retry_after_s == pytest.approx(0.5) and refused.remaining == 0
    assert refused.reset_s == pytest.approx(1.5)
    assert take_one(state, rate, size, 100.49).admitted is False
    later = take_one(state, rate, size, 100.5)
    assert later.admitted and later.remaining == 0
    full = take_one(state, rate, size, 1000.0)
    assert full.remaining == 2, "refilled to the bucket's size, never past it"


def test_a_clock_behind_the_stored_time_refills_nothing():
    take = take_one(BucketState(0.0, 200.0), 10.0, 5.0, 150.0)
    assert not take.admitted and take.state == BucketState(0.0, 200.0)


def test_a_refusal_carries_retry_after_and_openai_rate_headers():
    refusal = LimitRefused(ErrorCode.RATE_LIMITED, "spent", 0.2, RateHeaders(20, 0, 1.25))
    assert refusal.status == 429 and refusal.body()["error"]["type"] == "rate_limit_error"
    assert refusal.headers() == {"Retry-After": "1", "x-ratelimit-limit-requests": "20",
                                 "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1.25s"}
