"""Resume tokens: only the client that started a request may resume it.

`audio.start` hands the client a token, an HMAC of the request id under a secret the gateways share; a `resume` must
present it. Any gateway with the secret can verify a token (a resume may land on another gateway when the first one
died), and knowing a request id alone (from an event, a log, a dashboard) resumes nothing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from messages.errors import ErrorCode
from services.gateway.ws.resume import ResumeRefused

_DOMAIN = b"voxmesh-resume-token-v1:"  # a token made here is no MAC of anything else under the same secret


class ResumeTokens:
    """Issues and checks resume tokens under one secret."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the resume secret needs at least 16 bytes")
        self._secret = secret

    @classmethod
    def random(cls) -> ResumeTokens:
        """A secret of this process only: its tokens verify on this gateway alone."""
        return cls(secrets.token_bytes(32))

    def issue(self, request_id: str) -> str:
        """The token of `request_id` (URL-safe base64, no padding)."""
        digest = hmac.new(self._secret, _DOMAIN + request_id.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def check(self, request_id: str, token: str | None) -> None:
        """Raise ResumeRefused unless `token` is `request_id`'s (compared in constant time). The refusal reads as for
        an unknown request: it tells a stranger nothing about whether the request exists."""
        if token is None or not hmac.compare_digest(self.issue(request_id).encode(), token.encode()):
            raise ResumeRefused(ErrorCode.NOT_RESUMABLE, f"request {request_id} is not resumable with this "
                                                         "resume_token: send the one its audio.start carried",
                                 param="resume_token")
