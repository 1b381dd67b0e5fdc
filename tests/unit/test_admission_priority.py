"""The gateway's admission fixes a request's tenant and priority from the key it came with: the priority asked for
within what the key allows, the key's default when none is asked, and a specific refusal above it."""

from __future__ import annotations

import pytest

from services.gateway.requests.body import SpeechBody
from services.gateway.requests.catalog import VoiceCatalog
from services.gateway.requests.validation import AdmissionPolicy
from services.gateway.tenancy.tenant import PriorityNotAllowed, Tenant

POLICY = AdmissionPolicy(VoiceCatalog(model="tiny", model_type="custom_voice", speakers=("ryan",),
                                      languages=("auto", "english")))


def test_without_a_tenant_a_request_is_anonymous_and_interactive_unless_it_asks():
    assert (POLICY.admit(SpeechBody(input="Hi.")).tenant, POLICY.admit(SpeechBody(input="Hi.")).priority) == (
        "", "interactive")
    assert POLICY.admit(SpeechBody(input="Hi.", priority="batch")).priority == "batch"


def test_a_key_gives_its_name_and_default_priority_and_refuses_a_priority_above_its_own():
    books = Tenant(name="books", limit_key="books", priority="batch", max_priority="batch")
    request = POLICY.admit(SpeechBody(input="Hi."), tenant=books)
    assert (request.tenant, request.priority) == ("books", "batch")
    with pytest.raises(PriorityNotAllowed) as refused:
        POLICY.admit(SpeechBody(input="Hi.", priority="interactive"), tenant=books)
    assert refused.value.code == "priority_not_allowed"
    agent = Tenant(name="agent", limit_key="agent", priority="interactive", max_priority="interactive")
    assert POLICY.admit(SpeechBody(input="Hi.", priority="batch"), tenant=agent).priority == "batch"
