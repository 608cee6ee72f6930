"""What substitution found and decided for one request (:mod:`proxy.core.substitute`): the
:class:`Outcome` the addon applies, the :class:`Hit` of a placeholder on a surface, and the
refusals every surface shares (violation, misplaced, expired, unavailable), with the read of the
secret values that fails closed.

Pure; no I/O (a value source is read through :meth:`proxy.core.policy.Credential.secret`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from proxy.core import slots
from proxy.core.decide import Decision, Reason, deny
from proxy.core.errors import SecretUnavailable
from proxy.core.policy import Credential, Misplaced, Surface
from proxy.core.secrets import Secret
from proxy.core.slots import BasicPart


@dataclass(slots=True)
class Outcome:
    """What to do with a request: new header fields and target (None: unchanged) or a refusal.

    ``used`` maps each swapped or injected credential name to the version used; ``carried``
    names credentials whose placeholder passed unchanged, ``carried_on`` the same as
    ``(name, surface)`` pairs. A refusal with ``terminate`` closes the connection instead of
    answering. ``violated``/``violation_surface`` name the credential and surface refused.
    """

    fields: list[tuple[bytes, bytes]] | None = None
    target: bytes | None = None
    refusal: Decision | None = None
    terminate: bool = False
    used: dict[str, int] = field(default_factory=dict)
    carried: list[str] = field(default_factory=list)
    carried_on: list[tuple[str, str]] = field(default_factory=list)
    violated: str | None = None  # the credential whose placeholder was refused
    violation_surface: str | None = None
    unavailable: str | None = None  # why a value could not be read, for the operator's log only

    def carry(self, name: str, surface: Surface) -> None:
        if name not in self.carried:
            self.carried.append(name)
        if (name, surface.value) not in self.carried_on:
            self.carried_on.append((name, surface.value))

    def refuse(self, cred: Credential, surface: Surface, decision: Decision, terminate: bool = False) -> None:
        self.refusal, self.terminate = decision, terminate
        self.violated, self.violation_surface = cred.name, surface.value


@dataclass(slots=True)
class Hit:
    """A registered placeholder found on a surface of a request head."""

    surface: Surface
    credential: Credential
    index: int = -1  # header field index, for header and Basic hits
    swappable: bool = True  # False: a slot the credential is not swapped in, or another spelling
    where: str = "request target"  # for messages; never the value
    part: BasicPart | None = None  # Basic hits: the part it was found in


def misplaced(out: Outcome, cred: Credential, surface: Surface, host: str, where: str = "") -> None:
    """A placeholder where its credential is not swapped: carried, or refused (``on_misplaced``)."""
    if cred.on_misplaced is Misplaced.CARRY:
        out.carry(cred.name, surface)
        return
    slots_ = f"its surfaces: {', '.join(sorted(cred.surfaces)) or 'none'}"
    if surface in (Surface.HEADER, Surface.BASIC):
        parts = ", ".join(p for p in slots.BASIC_PARTS if p in cred.basic_parts) or "none"
        slots_ += f"; its headers: {slots.display(cred.headers)}; its Basic parts: {parts}"
    out.refuse(
        cred,
        surface,
        deny(
            Reason.PLACEHOLDER_MISPLACED,
            f"placeholder of credential {cred.name!r} found in {where or 'the ' + surface} toward "
            f"{host}, where that credential is not swapped ({slots_})",
        ),
        terminate=cred.on_misplaced is Misplaced.TERMINATE,
    )


def values(
    needed: Mapping[str, Credential], now: float, out: Outcome
) -> dict[str, tuple[Secret, int]] | None:
    """The current value and version of each needed credential, or None with ``out.refusal`` set."""
    for c in needed.values():
        if c.expired(now):
            out.refusal = expired(c)
            return None
    try:
        return {name: c.secret() for name, c in needed.items()}
    except SecretUnavailable as e:  # fail closed: no secret, no request
        out.refusal = unavailable(sorted(needed))
        out.unavailable = str(e)
        return None


def expired(c: Credential) -> Decision:
    why = f"credential {c.name!r} expired; ask for a fresh one (nothing was sent)"
    return deny(Reason.CREDENTIAL_EXPIRED, why)


def unavailable(names: Sequence[str]) -> Decision:
    # The sandbox sees which credential, not where it is kept; the operator's log has it all
    # (Outcome.unavailable, logged by the addon).
    listed = ", ".join(repr(n) for n in names)
    return deny(Reason.CREDENTIAL_UNAVAILABLE, f"credential {listed} is unavailable right now", status=503)


def violation(cred: Credential, host: str, where: str) -> Decision:
    return deny(
        Reason.PLACEHOLDER_VIOLATION,
        f"placeholder of credential {cred.name!r} in {where} is headed for {host}, "
        "which that credential is not bound to",
    )
