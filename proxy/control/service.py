"""The control plane's logic: validate a write against the rules in force, apply it to the store,
and write one control-plane audit event per mutation. No HTTP here (see :mod:`proxy.control.api`).

Validation (:mod:`proxy.control.checks`): a claim's pool must exist in the rules; every
credential host must parse and be covered by an intercepting egress rule of the claim's pool
(else 422 naming the host); a value must be non-empty, at most ``MAX_VALUE_BYTES``, and free of
control characters. A successful credential write returns a coverage report: for each host, the
rule that covers it and the header the secret will travel in.

Claims come from two places and the API changes only its own: a claim the rules file declares
is refused with 409 ``rules_file_claim`` on every claim route (read, delete, token rotation, its
credentials), saying to declare its credentials in the rules file or to create a control-API
claim. Decided (issue 18): not merged, because a store credential on a rules-file claim would
outlive the file's edits (a reload that moves the claim to another pool, or removes it) and
split one claim's credentials between two authorities with different reload, audit and revocation
rules.

Errors are :class:`ControlError` with an HTTP status, a reason code and a sentence naming the
field and what would be right; never a value.
"""

from __future__ import annotations

import contextlib
import ipaddress
import secrets
import time
from typing import Any

from proxy import audit
from proxy.control import kinds
from proxy.control.checks import (
    ID,
    MAX_VALUE_BYTES,
    ControlError,
    Coverage,
    check_endpoint,
    check_inject,
    check_name,
    check_placeholder,
    check_value,
    coverage,
    templated,
)
from proxy.core.errors import SurrogateError
from proxy.core.oauth import parse_spec
from proxy.core.policy import INTERFACE_NAME, Policy, Pool
from proxy.metrics import Metrics
from proxy.store.base import (
    ClaimRecord,
    Conflict,
    CredentialRecord,
    CredentialStore,
    NotFound,
    PreconditionFailed,
)
from proxy.store.registry import Registry

__all__ = ["MAX_VALUE_BYTES", "Control", "ControlError", "Coverage", "coverage"]  # the names of old


def _store_errors(e: SurrogateError) -> ControlError:
    if isinstance(e, NotFound):
        return ControlError(404, "not_found", str(e))
    if isinstance(e, PreconditionFailed):
        current = "it no longer exists" if e.current is None else f"its version is now {e.current}"
        return ControlError(412, "version_mismatch", f"If-Match did not match: {current}; read it again")
    if isinstance(e, Conflict):
        return ControlError(409, "conflict", str(e))
    return ControlError(503, "store_unavailable", f"the credential store failed: {type(e).__name__}")


class Control:
    """One instance per control listener; ``who`` names the caller in audit events."""

    def __init__(self, registry: Registry, store: CredentialStore, metrics: Metrics | None = None) -> None:
        self.registry = registry
        self.store = store
        self.metrics = metrics or Metrics()
        self.log = audit.logger()

    def _failed(self, e: SurrogateError) -> ControlError:
        error = _store_errors(e)
        self.metrics.store_operations.labels("write", error.code).inc()
        return error

    def _audit(
        self,
        who: str,
        action: str,
        claim: str,
        credential: str | None = None,
        old: int | None = None,
        new: int | None = None,
    ) -> None:
        self.metrics.store_operations.labels(action, "ok").inc()
        self.log.info(
            "control",
            **{
                audit.WHO: who,
                audit.ACTION: action,
                audit.CLAIM: claim,
                audit.CREDENTIAL: credential,
                audit.OLD_VERSION: old,
                audit.NEW_VERSION: new,
            },
        )

    def _pool(self, claim_id: str) -> Pool:
        claim = self._claim(claim_id)
        pool = self.registry.policy.pools.get(claim.pool)
        if pool is None:
            raise ControlError(
                409, "pool_gone", f"pool {claim.pool!r} of claim {claim_id!r} is no longer in the rules"
            )
        return pool

    def _claim(self, claim_id: str) -> ClaimRecord:
        """The store claim ``claim_id``. Raises ControlError 409 ``rules_file_claim`` for a claim
        the rules file declares (the API neither reads nor writes those), else 404."""
        record = self.store.get_claim(claim_id)
        if record is None:
            if claim_id in self.registry.policy.claims:
                raise ControlError(409, "rules_file_claim", rules_file_claim(claim_id, self.registry.policy))
            raise ControlError(404, "not_found", f"no claim {claim_id!r}")
        return record

    # claims

    def create_claim(
        self, who: str, claim_id: str | None, pool: str, sources: list[str], interface: str | None = None
    ) -> tuple[ClaimRecord, str]:
        claim_id = claim_id or f"claim-{secrets.token_hex(6)}"
        if not ID.match(claim_id):
            raise ControlError(422, "invalid_id", "id must be 1-63 letters, digits, '.', '_' or '-'", "id")
        if pool not in self.registry.policy.pools:
            known = ", ".join(sorted(self.registry.policy.pools)) or "(none)"
            raise ControlError(
                422, "unknown_pool", f"unknown pool {pool!r}; pools in the rules: {known}", "pool"
            )
        if claim_id in self.registry.policy.claims:
            raise ControlError(409, "conflict", f"claim {claim_id!r} is declared in the rules file")
        self._check_sources_free(claim_id, sources)
        if interface is not None and not INTERFACE_NAME.match(interface):
            raise ControlError(
                422, "invalid_interface", f"{interface!r} is not an interface name", "interface"
            )
        if interface is not None and not sources:
            raise ControlError(
                422,
                "invalid_interface",
                "interface needs sources: it binds the claim's source addresses",
                "interface",
            )
        try:
            record, token = self.store.create_claim(claim_id, pool, sources, interface)
        except ValueError as e:
            raise ControlError(422, "invalid_sources", str(e), "sources") from None
        except SurrogateError as e:
            raise self._failed(e) from None
        self._audit(who, "claim.create", claim_id, new=record.version)
        return record, token

    def _check_sources_free(self, claim_id: str, sources: list[str]) -> None:
        """A source network identifies one claim only (as in the rules file): 409 naming the
        claim that has it. Unparsable sources are left to the store's 422."""
        wanted = {}
        for s in sources:
            with contextlib.suppress(ValueError):
                wanted[ipaddress.ip_network(s, strict=False)] = s
        if not wanted:
            return
        owners: dict[Any, str] = {}
        for claim in self.registry.policy.claims.values():
            owners.update({net: claim.id for net in claim.sources})
        for record in self.store.list_claims():
            for s in record.sources:
                with contextlib.suppress(ValueError):
                    owners[ipaddress.ip_network(s, strict=False)] = record.id
        for net, raw in wanted.items():
            owner = owners.get(net)
            if owner is not None and owner != claim_id:
                raise ControlError(
                    409, "source_taken", f"source {raw} already identifies claim {owner!r}", "sources"
                )

    def get_claim(self, claim_id: str) -> ClaimRecord:
        return self._claim(claim_id)

    def list_claims(self) -> list[ClaimRecord]:
        return self.store.list_claims()

    def delete_claim(self, who: str, claim_id: str) -> None:
        old = self._claim(claim_id)
        if not self.store.delete_claim(claim_id):
            raise ControlError(404, "not_found", f"no claim {claim_id!r}")
        self._audit(who, "claim.delete", claim_id, old=old.version)

    def rotate_token(self, who: str, claim_id: str) -> tuple[ClaimRecord, str]:
        old = self._claim(claim_id)
        try:
            record, token = self.store.rotate_token(claim_id)
        except SurrogateError as e:
            raise self._failed(e) from None
        self._audit(who, "claim.rotate_token", claim_id, old=old.version, new=record.version)
        return record, token

    # credentials

    def put_credential(
        self, who: str, claim_id: str, name: str, body: dict[str, Any], if_match: int | None
    ) -> tuple[CredentialRecord, list[Coverage], bool]:
        """Create or replace. Returns the record, its coverage and whether it was created."""
        check_name(name)
        pool = self._pool(claim_id)
        header, fmt = body.get("inject_header"), body.get("inject_format")
        check_inject(header, fmt)
        cov = coverage(pool, body["hosts"], header, body.get("headers"))
        made = kinds.prepare(pool, body)  # issue 15: the kind's block checked, its secrets sealed
        placeholder = body.get("placeholder")
        check_placeholder(placeholder)
        placeholder = templated(
            body.get("placeholder_template"), placeholder, self.store.get_credential(claim_id, name)
        )
        kinds.check_placeholders(self.store, claim_id, name, placeholder, made.kind, made.spec)
        try:
            oauth = parse_spec(body["oauth"]) if body.get("oauth") is not None else None
        except ValueError as e:
            raise ControlError(422, "invalid_request", str(e), "oauth") from None
        if oauth is not None:
            check_endpoint(pool, oauth, body["hosts"])
        old = self.store.get_credential(claim_id, name)
        try:
            record = self.store.put_credential(
                claim_id,
                name,
                value=made.value,
                hosts=body["hosts"],
                inject_header=header,
                inject_format=(fmt or "Bearer {value}") if header else None,
                placeholder=placeholder,
                expires_at=body.get("expires_at"),
                if_match=if_match,
                max_requests=body.get("max_requests"),
                surfaces=body.get("surfaces"),
                on_misplaced=body.get("on_misplaced"),
                headers=body.get("headers"),
                basic_parts=body.get("basic_parts"),
                kind=made.kind,
                spec=made.spec,
                refresh_token=made.refresh_token,
            )
            # a second short transaction: a PUT replaces, so no "oauth" clears the capture
            self.store.set_oauth(claim_id, name, oauth.to_json() if oauth else None)
        except ValueError as e:
            raise ControlError(422, "invalid_request", str(e)) from None
        except SurrogateError as e:
            raise self._failed(e) from None
        self._audit(who, "credential.put", claim_id, name, old.version if old else None, record.version)
        return record, cov, old is None

    def patch_credential(
        self, who: str, claim_id: str, name: str, changes: dict[str, Any], if_match: int | None
    ) -> tuple[CredentialRecord, list[Coverage]]:
        pool = self._pool(claim_id)
        old = self.store.get_credential(claim_id, name)
        if old is None:
            raise ControlError(404, "not_found", f"no credential {name!r} in claim {claim_id!r}")
        kinds.check_patch(old, changes)
        header = changes.get("inject_header", old.inject_header)
        fmt = changes.get("inject_format", old.inject_format)
        check_inject(header, fmt if "inject_format" in changes else None)
        cov = coverage(
            pool, list(changes.get("hosts", old.hosts)), header, changes.get("headers", old.headers)
        )
        if "hosts" in changes:
            spec = self.store.oauth_specs().get((claim_id, name))
            if spec is not None:
                check_endpoint(pool, parse_spec(spec), list(changes["hosts"]))
        if "value" in changes:
            changes["value"] = check_value(changes["value"])
        if "placeholder" in changes:
            check_placeholder(changes["placeholder"])
            kinds.check_placeholders(self.store, claim_id, name, changes["placeholder"], None, None)
        if header is not None and fmt is None:
            changes["inject_format"] = "Bearer {value}"
        try:
            record = self.store.patch_credential(claim_id, name, if_match=if_match, **changes)
        except ValueError as e:
            raise ControlError(422, "invalid_request", str(e)) from None
        except SurrogateError as e:
            raise self._failed(e) from None
        self._audit(who, "credential.patch", claim_id, name, old.version, record.version)
        return record, cov

    def get_credential(self, claim_id: str, name: str) -> CredentialRecord:
        self._claim(claim_id)
        record = self.store.get_credential(claim_id, name)
        if record is None:
            raise ControlError(404, "not_found", f"no credential {name!r} in claim {claim_id!r}")
        return record

    def list_credentials(self, claim_id: str) -> list[CredentialRecord]:
        self._claim(claim_id)
        return self.store.list_credentials(claim_id)

    def delete_credential(self, who: str, claim_id: str, name: str, if_match: int | None) -> None:
        old = self.get_credential(claim_id, name)
        try:
            deleted = self.store.delete_credential(claim_id, name, if_match=if_match)
        except SurrogateError as e:
            raise self._failed(e) from None
        if not deleted:
            raise ControlError(404, "not_found", f"no credential {name!r} in claim {claim_id!r}")
        self._audit(who, "credential.delete", claim_id, name, old.version, None)

    def expired_now(self, record: CredentialRecord) -> bool:
        return record.expires_at is not None and time.time() >= record.expires_at


def rules_file_claim(claim_id: str, policy: Policy) -> str:
    """Why the control API refuses a rules-file claim, and how to get what was meant."""
    pool = policy.claims[claim_id].pool
    return (
        f"claim {claim_id!r} is declared in the rules file, and the control API holds only the claims "
        "it created: declare its credentials in the rules file (then reload), or create a control-API "
        f"claim (surrogate claims create --pool {pool} --id ID; POST /v1/claims) and put them there"
    )
