"""The approvals page's operator sessions and CSRF checks (issue 16), kept apart from the page so
each rule is one small function with its test.

An operator signs in on ``/ui/login`` with the control listener's operator token; the page then
sets a cookie (:data:`COOKIE`) holding a random session id (never the token): ``HttpOnly``,
``SameSite=Strict``, ``Path=/ui/``, ``Secure`` when the listener speaks TLS. A session lives in
this listener's memory only, for :data:`SESSION_SECONDS` (a restart signs every operator out:
decided, since an approval page open for days is an unwatched one). A script may instead send
``Authorization: Bearer <operator token>`` on each request; such a request needs no CSRF token
(a browser never attaches that header by itself).

Every state-changing form (POST) of a cookie session carries the session's CSRF token in the
field ``csrf`` (compared in constant time), and is refused unless ``Sec-Fetch-Site``, when sent,
is ``same-origin`` (W3C Fetch Metadata). ``Origin`` and ``Host`` are checked before any route by
:mod:`proxy.control.apiedge` (DNS rebinding), so a page under another name never gets this far.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass

COOKIE = "surrogate_ui"
SESSION_SECONDS = 8 * 3600
MAX_SESSIONS = 64  # a bound: sign-ins past it push out the oldest session


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    csrf: str
    expires_at: float


class Sessions:
    """Operator sessions of one listener, checked against ``operator_token``. Thread-safe."""

    def __init__(self, operator_token: str, seconds: float = SESSION_SECONDS) -> None:
        self._token = operator_token.encode()
        self._seconds = seconds
        self._by_id: dict[str, Session] = {}
        self._lock = threading.Lock()

    def token_ok(self, given: str) -> bool:
        """Whether ``given`` is the operator token (constant time)."""
        return hmac.compare_digest(given.strip().encode(), self._token)

    def bearer_ok(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header is ``Bearer <operator token>``."""
        scheme, _, token = (authorization or "").partition(" ")
        return scheme.lower() == "bearer" and self.token_ok(token)

    def start(self, now: float | None = None) -> Session:
        """A new session (after a good token)."""
        now = time.time() if now is None else now
        s = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), now + self._seconds)
        with self._lock:
            self._by_id = {k: v for k, v in self._by_id.items() if v.expires_at > now}
            while len(self._by_id) >= MAX_SESSIONS:
                self._by_id.pop(min(self._by_id, key=lambda k: self._by_id[k].expires_at))
            self._by_id[s.id] = s
        return s

    def get(self, cookie: str | None, now: float | None = None) -> Session | None:
        """The live session a cookie value names; None for none, an unknown or an expired one."""
        if not cookie:
            return None
        now = time.time() if now is None else now
        with self._lock:
            s = self._by_id.get(cookie)
            if s is not None and s.expires_at <= now:
                del self._by_id[cookie]
                s = None
        return s

    def end(self, cookie: str | None) -> None:
        with self._lock:
            self._by_id.pop(cookie or "", None)


def csrf_ok(session: Session, given: str | None) -> bool:
    """Whether a form's ``csrf`` field is this session's token (constant time)."""
    return given is not None and hmac.compare_digest(given.encode(), session.csrf.encode())


def fetch_site_ok(sec_fetch_site: str | None) -> bool:
    """Whether a POST's ``Sec-Fetch-Site`` allows it: absent (an older client), or ``same-origin``."""
    return sec_fetch_site is None or sec_fetch_site.strip().lower() == "same-origin"


def cookie_header(session: Session, secure: bool) -> str:
    """The ``Set-Cookie`` value of a new session (RFC 6265 §4.1; SameSite: RFC 6265bis)."""
    attrs = f"{COOKIE}={session.id}; Path=/ui/; HttpOnly; SameSite=Strict; Max-Age={SESSION_SECONDS}"
    return attrs + ("; Secure" if secure else "")


def cleared_cookie(secure: bool) -> str:
    return f"{COOKIE}=; Path=/ui/; HttpOnly; SameSite=Strict; Max-Age=0" + ("; Secure" if secure else "")
