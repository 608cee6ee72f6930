"""proxy.core.outcome: the refusals every surface shares, and the read of secret values that
fails closed (expired or unreadable: no value, a refusal that names the credential only)."""

from __future__ import annotations

from pathlib import Path

from proxy.core.decide import Action, Reason
from proxy.core.hosts import HostPattern
from proxy.core.outcome import Outcome, misplaced, values, violation
from proxy.core.policy import Credential, Misplaced, Surface
from proxy.rules.sources import ValueSource

PH = "surr_OutcomePlaceholder000001"


def _cred(tmp: Path, **kw: object) -> Credential:
    return Credential("o", PH, (HostPattern.parse("api.test"),), ValueSource.parse("file:v", tmp), **kw)  # type: ignore[arg-type]


def test_values_reads_each_needed_secret(tmp_path: Path) -> None:
    (tmp_path / "v").write_text("SECRETvalue1\n")
    out = Outcome()
    found = values({"o": _cred(tmp_path)}, 0.0, out)
    assert found is not None and found["o"][0].reveal() == "SECRETvalue1" and out.refusal is None


def test_an_unreadable_value_refuses_and_names_only_the_credential(tmp_path: Path) -> None:
    out = Outcome()
    assert values({"o": _cred(tmp_path)}, 0.0, out) is None  # the file does not exist
    assert out.refusal is not None and out.refusal.reason is Reason.CREDENTIAL_UNAVAILABLE
    assert out.refusal.status == 503 and str(tmp_path) not in out.refusal.message
    assert out.unavailable  # the operator's log gets the why


def test_an_expired_credential_is_refused_before_its_value_is_read(tmp_path: Path) -> None:
    out = Outcome()
    assert values({"o": _cred(tmp_path, expires_at=10.0)}, 11.0, out) is None  # no file: never read
    assert out.refusal is not None and out.refusal.reason is Reason.CREDENTIAL_EXPIRED


def test_misplaced_carries_or_refuses_as_the_credential_says(tmp_path: Path) -> None:
    carried = Outcome()
    misplaced(carried, _cred(tmp_path), Surface.QUERY, "api.test")
    assert carried.refusal is None and carried.carried_on == [("o", "query")]
    for mode, terminate in ((Misplaced.BLOCK, False), (Misplaced.TERMINATE, True)):
        out = Outcome()
        misplaced(out, _cred(tmp_path, on_misplaced=mode), Surface.HEADER, "api.test", "header Cookie")
        assert out.refusal is not None and out.refusal.reason is Reason.PLACEHOLDER_MISPLACED
        assert (out.terminate, out.violated, out.violation_surface) == (terminate, "o", "header")
        assert "header Cookie" in out.refusal.message and PH not in out.refusal.message


def test_a_violation_is_a_violation(tmp_path: Path) -> None:
    decision = violation(_cred(tmp_path), "evil.test", "header Authorization")
    assert (decision.action, decision.reason) == (Action.VIOLATION, Reason.PLACEHOLDER_VIOLATION)
