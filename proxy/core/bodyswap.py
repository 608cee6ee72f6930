"""Placeholders in a request body, for substitution: what each one becomes as the body streams
(:class:`BodyResolver`, the ``resolve`` callable of :class:`proxy.core.bodies.Swapper`), and the
refusal that closes the connection (:class:`BodyRefused`: the request head has already left).

Pure; no I/O (a value source is read through :meth:`proxy.core.policy.Credential.secret`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from proxy.core import bodies
from proxy.core.decide import Reason, deny
from proxy.core.outcome import Outcome, misplaced, values, violation
from proxy.core.policy import Credential, Misplaced, Surface


class BodyRefused(Exception):
    """A placeholder in a body that must not pass: the connection is to be closed (the request
    head has already left). ``outcome`` holds the refusal, credential and surface."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.refusal.reason.value if outcome.refusal else "refused")
        self.outcome = outcome


class BodyResolver:
    """What each placeholder in one request body becomes: the ``resolve`` callable of
    :class:`proxy.core.bodies.Swapper`.

    ``how`` is the body kind (:func:`proxy.core.bodies.kind`). Each credential's secret is read at
    its first placeholder and kept for the rest of the body. ``outcome`` collects what was used
    and carried (surface ``body``); a refusal raises :class:`BodyRefused`. ``spend`` (optional)
    counts the request against a credential's budget at its first swap in the body and returns
    False when the budget is spent, which refuses the body before the secret is written.
    """

    def __init__(
        self,
        by_placeholder: Mapping[bytes, Credential],
        host: str,
        tls: bool,
        how: str,
        now: float,
        spend: Callable[[Credential], bool] | None = None,
    ) -> None:
        self.by_placeholder, self.host, self.tls, self.how, self.now = by_placeholder, host, tls, how, now
        self.spend = spend
        self.outcome = Outcome()
        self._escaped: dict[str, bytes] = {}

    def may_swap(self, candidates: Iterable[Credential] | None = None) -> bool:
        """True when some credential could be swapped in this body (its length may change).
        ``candidates``: the claim's credentials that enable ``body`` (:attr:`Claim.body`), when
        known, so that this does not walk every credential of the claim."""
        pool = self.by_placeholder.values() if candidates is None else candidates
        return self.tls and any(c.enables(Surface.BODY) and c.bound_to(self.host) for c in pool)

    def may_refuse(self, refusing: bool | None = None) -> bool:
        """True when a placeholder in this body could refuse it (not only be carried);
        ``refusing``: :attr:`Claim.refusing`, when known."""
        if refusing is not None:
            return refusing
        return any(c.on_misplaced is not Misplaced.CARRY for c in self.by_placeholder.values())

    def __call__(self, ph: bytes) -> bytes | None:
        c = self.by_placeholder.get(ph)
        if c is None:
            return None  # placeholder-shaped but not this claim's: not a secret, left alone
        out = self.outcome
        if c.bound_to(self.host) and c.enables(Surface.BODY):
            if c.name in self._escaped:
                return self._escaped[c.name]
            if not self.tls:
                why = (
                    f"placeholder of credential {c.name!r} sent over cleartext HTTP; "
                    "credentials are only sent over verified TLS"
                )
                out.refuse(c, Surface.BODY, deny(Reason.CLEARTEXT_CREDENTIAL, why), terminate=True)
                raise BodyRefused(out)
            found = values({c.name: c}, self.now, out)
            if found is None:
                out.violated, out.violation_surface, out.terminate = c.name, Surface.BODY.value, True
                raise BodyRefused(out)
            if self.spend is not None and not self.spend(c):
                why = f"credential {c.name!r} has used up its request budget (max_requests)"
                out.refuse(c, Surface.BODY, deny(Reason.CREDENTIAL_BUDGET_SPENT, why), terminate=True)
                raise BodyRefused(out)
            secret, version = found[c.name]
            out.used[c.name] = version
            self._escaped[c.name] = bodies.escape(secret.reveal(), self.how)
            return self._escaped[c.name]
        if c.on_misplaced is Misplaced.CARRY:
            out.carry(c.name, Surface.BODY)
            return None
        if c.bound_to(self.host):
            misplaced(out, c, Surface.BODY, self.host)
        else:
            out.refuse(c, Surface.BODY, violation(c, self.host, "the request body"))
        out.terminate = True  # the request head has left: closing is the only refusal left
        raise BodyRefused(out)
