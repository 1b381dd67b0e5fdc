"""The mtp pieces without a bus: the client's choice of replica (liveness by lease, load, failures), step rows packed
and unpacked bit for bit, reply addresses, the service's settings."""

from __future__ import annotations

import pytest
import torch

from messages import ErrorCode, ErrorInfo, Stage, subjects
from messages.mtp import StepReply
from messages.records import Lease
from services.model.sampling import SamplingParams
from services.mtp.replica_set import MTP_SERVICE, ReplicaSet
from services.mtp.service import MtpSettings
from services.mtp.step_rows import StepRows, StepRowsError, pack_step
from services.runtime.settings_schema import SettingsError

NOW = 1_000_000.0


def lease(replica: str, renewed_at: float = NOW, service: str = MTP_SERVICE) -> Lease:
    return Lease(replica=replica, service=service, renewed_at=renewed_at, ttl_s=3.0)


def reply(replica: str, queued_rows: int, queued_steps: int = 1) -> StepReply:
    return StepReply(step_id=1, replica=replica, queued_steps=queued_steps, queued_rows=queued_rows,
                     error=ErrorInfo(code=ErrorCode.MODEL_ERROR, stage=Stage.MTP, message="load only"))


def two_replicas() -> ReplicaSet:
    replicas = ReplicaSet()
    for name in ("mtp-b", "mtp-a"):
        replicas.leased(lease(name))
    replicas.leased(lease("decode-x", service="decode"))  # another service's lease: never a candidate
    return replicas


def test_idle_replicas_share_steps_in_a_fixed_order():
    replicas = two_replicas()
    assert replicas.live(NOW) == ["mtp-a", "mtp-b"]
    assert replicas.choose(set(), NOW) == "mtp-a"
    replicas.sent("mtp-a", 4)
    assert replicas.choose(set(), NOW) == "mtp-b", "mtp-a has a step in flight"
    replicas.settled("mtp-a", 4)
    assert replicas.choose(set(), NOW) == "mtp-b", "equal load: the one sent fewer steps"


def test_the_least_loaded_replica_wins_by_its_reported_load_plus_ours_in_flight():
    replicas = two_replicas()
    replicas.reported(reply("mtp-a", queued_rows=64, queued_steps=2))  # other callers keep mtp-a busy
    assert replicas.choose(set(), NOW) == "mtp-b"
    replicas.sent("mtp-b", 100)
    assert replicas.choose(set(), NOW) == "mtp-a", "our 100 rows in flight to mtp-b outweigh mtp-a's 64"
    assert replicas.choose({"mtp-a"}, NOW) == "mtp-b", "a replica already tried for this step is skipped"
    assert replicas.choose({"mtp-a", "mtp-b"}, NOW) is None


def test_a_replica_is_out_while_its_lease_is_stale_or_after_a_failure_until_it_renews():
    replicas = two_replicas()
    assert replicas.live(NOW + 10) == [], "leases past their ttl"
    replicas.failed("mtp-a", unresponsive=True, now=NOW + 1)
    assert replicas.live(NOW + 1) == ["mtp-b"]
    replicas.leased(lease("mtp-a", renewed_at=NOW + 1.5))  # it runs again
    assert replicas.live(NOW + 2) == ["mtp-a", "mtp-b"]
    replicas.incompatible("mtp-b", "other weights")
    replicas.leased(lease("mtp-b", renewed_at=NOW + 2))
    assert replicas.live(NOW + 2) == ["mtp-a"], "a replica of other weights stays out"
    replicas.lease_deleted(subjects.lease_key("mtp-a"))  # left cleanly
    assert replicas.live(NOW + 2) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_step_rows_travel_bit_for_bit(dtype):
    hidden = (torch.randn(3, 8, generator=torch.Generator().manual_seed(0)) * 5).to(dtype)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_k=5, top_p=0.9),
              SamplingParams(temperature=1.1, top_k=0)]
    step = pack_step("f" * 16, 3, hidden, torch.tensor([1, 2, 3]), [5, 2**63 + 9, 7], [0, 4, 9], params)
    rows = StepRows.unpack(step, "cpu")
    assert rows.hidden.dtype == dtype and torch.equal(rows.hidden.view(torch.uint8), hidden.view(torch.uint8))
    assert rows.c0.tolist() == [1, 2, 3]
    assert rows.sampling.frame.tolist() == [0, 4, 9] and rows.sampling.seed[1].item() == 9 - 2**63
    assert rows.sampling.top_k.tolist() == [50, 5, 0] and rows.sampling.max_top_k is None


def test_rows_of_unequal_lengths_make_no_step():
    with pytest.raises(StepRowsError):
        pack_step("f", 0, torch.zeros(2, 4), torch.tensor([1, 2]), [1], [0, 0], [SamplingParams()] * 2)
    with pytest.raises(StepRowsError):
        pack_step("f", 0, torch.zeros(2, 4, dtype=torch.int64), torch.tensor([1, 2]), [1, 2], [0, 0],
                  [SamplingParams()] * 2)


def test_reply_addresses_name_step_and_attempt():
    inbox = "_INBOX.abc123"
    address = subjects.mtp_reply(inbox, 41, 2)
    assert subjects.mtp_reply_address(address) == (41, 2)
    assert subjects.mtp_reply_address(inbox) is None


def test_settings_are_validated():
    with pytest.raises(SettingsError):
        MtpSettings(max_queued_steps=0)
    with pytest.raises(SettingsError):
        MtpSettings(tick_s=3.0, lease_ttl_s=3.0)
    assert MtpSettings().lease_ttl_s > MtpSettings().tick_s


def test_a_reply_with_codes_names_its_step():
    from messages import InvalidMessage

    with pytest.raises(InvalidMessage):
        StepReply(step_id=None, replica="mtp-a", codes=bytes(30))
