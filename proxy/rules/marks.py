"""Where each problem of a rules file is: line and column of every YAML node, keyed by its path
(``("claims", 0, "credentials", 1, "hosts", 0)``), and the collected :class:`Problem` list.

:class:`Marks` also refuses what YAML allows and rules files do not: duplicate keys, and anchors
and aliases (before anything is constructed, so "billion laughs" files cost nothing).
:func:`pydantic_problems` turns pydantic's errors into located, explained problems.
"""

from __future__ import annotations

from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from proxy.core.errors import Problem
from proxy.rules.models import SECRET_FIELDS, RulesModel

Loc = tuple[str | int, ...]


def dotted(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class Marks:
    """Line/column of every node in the YAML document, keyed by its path."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.at: dict[Loc, tuple[int, int]] = {}
        self.problems: list[Problem] = []
        self.alias_seen = False

    def walk(
        self, node: yaml.Node, loc: Loc = (), visited: set[int] | None = None, key: yaml.Node | None = None
    ) -> None:
        """Record every node's position; refuse duplicate keys and YAML aliases.

        An alias makes the composer hand back the anchored node a second time, so a node seen
        twice is an alias: refused, which also stops recursive anchors and "billion laughs"
        files before anything is constructed.
        """
        visited = set() if visited is None else visited
        if id(node) in visited:
            if not self.alias_seen:  # said once: a "billion laughs" file would repeat it endlessly
                self.alias_seen = True
                message = "YAML anchors and aliases (&name, *name, <<: *name) are not supported; write it out"
                self.add(loc, message, key)
            return
        if isinstance(node, yaml.MappingNode | yaml.SequenceNode):
            visited.add(id(node))
        self.at[loc] = (node.start_mark.line + 1, node.start_mark.column + 1)
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key_node, value in node.value:
                k = str(key_node.value)
                if k in seen:
                    self.add(loc + (k,), f"duplicate key {k!r}", key_node)
                seen.add(k)
                self.walk(value, loc + (k,), visited, key_node)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self.walk(item, loc + (i,), visited)

    def sorted(self) -> list[Problem]:
        """Problems in file order (checks run in field order, which need not be file order)."""
        return sorted(self.problems, key=lambda p: (p.line or 0, p.column or 0))

    def add(self, loc: Loc, message: str, node: yaml.Node | None = None) -> None:
        line: int | None
        col: int | None
        if node is not None:
            line, col = node.start_mark.line + 1, node.start_mark.column + 1
        else:
            probe = loc
            while probe not in self.at and probe:
                probe = probe[:-1]
            line, col = self.at.get(probe, (None, None))
        self.problems.append(Problem(self.file, line, col, dotted(loc), message))


def model_at(loc: Loc) -> Any:
    """The pydantic model class found at ``loc`` (to list the fields an unknown key could be)."""
    cur: Any = RulesModel
    for part in loc:
        while type(cur).__name__ == "UnionType":  # X | None
            cur = next(a for a in get_args(cur) if a is not type(None))
        origin, args = get_origin(cur), get_args(cur)
        if origin is list:
            cur = args[0]
        elif origin is dict:
            cur = args[1]  # `part` is a key chosen by the author, e.g. a pool name
        elif isinstance(cur, type) and issubclass(cur, BaseModel) and part in cur.model_fields:
            cur = cur.model_fields[str(part)].annotation
        else:
            return cur
    while type(cur).__name__ == "UnionType":
        cur = next(a for a in get_args(cur) if a is not type(None))
    return cur


def pydantic_problems(err: ValidationError, marks: Marks, prefix: Loc = ()) -> None:
    """Record pydantic's errors as problems; ``prefix`` is where the validated section is."""
    for e in err.errors():
        loc: Loc = prefix + tuple(e["loc"])
        if e["type"] == "extra_forbidden":
            model = model_at(loc[:-1])
            is_model = isinstance(model, type) and issubclass(model, BaseModel)
            known = ", ".join(model.model_fields) if is_model else ""
            marks.add(loc, f"unknown field {loc[-1]!r}; expected one of: {known}")
        elif e["type"] == "missing":
            marks.add(loc, "required field is missing")
        elif loc and loc[-1] in SECRET_FIELDS:
            marks.add(loc, "must be a string 'env:NAME' or 'file:PATH'")
        else:
            marks.add(loc, e["msg"])


def rule_loc(rule_id: str) -> Loc:
    """Where the egress rule ``pool.egress[i]`` (an :class:`EgressRule` id) is in the file."""
    pool, _, index = rule_id.rpartition(".egress[")
    return ("pools", pool, "egress", int(index.rstrip("]")))
