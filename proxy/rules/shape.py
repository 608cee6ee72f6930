"""A rules file's shape, validated section by section so one run reports every problem.

The document is not validated as one :class:`~proxy.rules.models.RulesModel` (the first bad field
anywhere would hide every check after it, and a file with a dozen mistakes would take as many
runs): the top level, each pool, each of its egress rules and hook routes, each claim and each of
its credentials are validated on their own, at their own location. A section whose shape is wrong
is reported; its wrong fields are left out (their defaults stand in: the file is refused anyway)
and its right ones checked on. A section that cannot stand without them (not a mapping, a
required field wrong) is left out, a ``None`` in its place, so every other section keeps its
index and its line. The sections around it go on to the checks of :mod:`proxy.rules.pools`,
:mod:`proxy.rules.claims` and :mod:`proxy.rules.risks`.

Where a check would mislead without the missing section it is skipped, never guessed: a claim's
hosts are not checked for coverage by a pool with an egress rule whose host is wrong, and claims
are not checked against the pool names when ``pools`` itself is not a mapping.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from proxy.rules.marks import Loc, Marks, pydantic_problems
from proxy.rules.models import (
    ApprovalsModel,
    ClaimModel,
    CredentialModel,
    HookModel,
    PoolModel,
    RuleModel,
    RulesModel,
)


@dataclass(slots=True)
class PoolShape:
    """A pool: ``model`` holds its own fields (None: not a mapping; the defaults stand in),
    ``egress`` and ``hooks`` each item, None where one cannot stand."""

    model: PoolModel | None
    egress: list[RuleModel | None] = field(default_factory=list)
    hooks: list[HookModel | None] = field(default_factory=list)


@dataclass(slots=True)
class ClaimShape:
    """A claim: ``model`` holds its own fields (None: one it cannot do without is wrong),
    ``credentials`` each credential, None where one cannot stand."""

    model: ClaimModel | None
    credentials: list[CredentialModel | None] = field(default_factory=list)


@dataclass(slots=True)
class Shape:
    """The sections of a rules file. ``pools_known`` is False when ``pools`` is missing or not a
    mapping: then no claim's pool can be said to be unknown."""

    pools: dict[str, PoolShape]
    claims: list[ClaimShape | None]
    pools_known: bool = True
    approvals: ApprovalsModel | None = None  # top-level ``approvals`` (None: absent or wrong)


def _validated[M: BaseModel](model: type[M], data: Any, loc: Loc, marks: Marks, say: bool = True) -> M | None:
    """``data`` as a ``model``, every problem recorded (with ``say``). When some fields are wrong,
    the section is validated again without them (their defaults stand in, and a wrong nested
    section keeps its right fields), so the checks of the fields that are right still run;
    None when that cannot be done (not a mapping, or a required field is wrong)."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        if say:
            pydantic_problems(e, marks, loc)
        wrong = {err["loc"][0] for err in e.errors() if err["loc"]}
    if not isinstance(data, dict) or not wrong:
        return None
    kept: dict[Any, Any] = {}
    for key, value in data.items():
        if key not in wrong:
            kept[key] = value
        elif isinstance(value, dict) and (inner := _nested(model, key)) is not None:
            part = _validated(inner, value, loc + (key,), marks, say=False)
            if part is not None:
                kept[key] = part
    try:
        return model.model_validate(kept)
    except ValidationError:
        return None


def _nested(model: type[BaseModel], key: Any) -> type[BaseModel] | None:
    """The model class of field ``key`` of ``model`` (``X`` or ``X | None``), if it is one."""
    info = model.model_fields.get(key) if isinstance(key, str) else None
    for candidate in (info.annotation, *get_args(info.annotation)) if info else ():
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _split(data: Any, lists: tuple[str, ...]) -> tuple[Any, dict[str, list[Any]]]:
    """``data`` without those of ``lists`` that hold a list (they are validated item by item), and
    those lists. A field that is not a list stays, so its own shape is reported where it is."""
    if not isinstance(data, dict):
        return data, {}
    parts = {name: data[name] for name in lists if isinstance(data.get(name), list)}
    return {k: v for k, v in data.items() if k not in parts}, parts


def _items[M: BaseModel](model: type[M], items: list[Any], loc: Loc, marks: Marks) -> list[M | None]:
    return [_validated(model, item, loc + (i,), marks) for i, item in enumerate(items)]


def shape(data: dict[Any, Any], marks: Marks) -> Shape:
    """Validate the document ``data`` section by section, recording every problem in ``marks``."""
    top = dict(data)
    pools_raw = top.get("pools")
    claims_raw = top.get("claims")
    if isinstance(pools_raw, dict):  # keys are checked here, each pool's body below
        top["pools"] = {name: {} for name in pools_raw}
    if isinstance(claims_raw, list):
        top["claims"] = []
    approvals_raw = top.get("approvals")
    if isinstance(approvals_raw, dict):  # checked on its own, below
        top["approvals"] = None
    _validated(RulesModel, top, (), marks)
    approvals = (
        _validated(ApprovalsModel, approvals_raw, ("approvals",), marks)
        if isinstance(approvals_raw, dict)
        else None
    )

    pools: dict[str, PoolShape] = {}
    for name, body in pools_raw.items() if isinstance(pools_raw, dict) else ():
        if not isinstance(name, str):
            continue  # said at the top level
        loc: Loc = ("pools", name)
        own, parts = _split(body, ("egress", "hooks"))
        pools[name] = PoolShape(
            _validated(PoolModel, own, loc, marks),
            _items(RuleModel, parts.get("egress", []), loc + ("egress",), marks),
            _items(HookModel, parts.get("hooks", []), loc + ("hooks",), marks),
        )
    claims: list[ClaimShape | None] = []
    for i, body in enumerate(claims_raw if isinstance(claims_raw, list) else ()):
        loc = ("claims", i)
        if not isinstance(body, dict):
            claims.append(None)
            _validated(ClaimModel, body, loc, marks)
            continue
        own, parts = _split(body, ("credentials",))
        claims.append(
            ClaimShape(
                _validated(ClaimModel, own, loc, marks),
                _items(CredentialModel, parts.get("credentials", []), loc + ("credentials",), marks),
            )
        )
    return Shape(pools, claims, pools_known=isinstance(pools_raw, dict), approvals=approvals)
