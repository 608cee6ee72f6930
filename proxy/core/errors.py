"""The typed errors of surrogate's core, and how each maps to the outside world.

    SurrogateError                 base; ``str(e)`` is a user-facing sentence, never a secret
    ├── HostError                  a host name or pattern that cannot be canonicalised
    ├── RulesError                 a rules file that does not load; carries every Problem found
    └── SecretUnavailable          a credential's value source cannot be read right now

The CLI prints ``str(e)`` of any SurrogateError and exits 1; argparse's usage errors exit 2.
"""

from __future__ import annotations

from dataclasses import dataclass


class SurrogateError(Exception):
    """Base of every error surrogate raises on purpose."""


class HostError(SurrogateError, ValueError):
    """A host name or host pattern is not valid."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding in a rules file: where (file, 1-based line and column, dotted field) and what."""

    file: str
    line: int | None
    column: int | None
    field: str
    message: str
    severity: str = "error"  # "error" (the file is refused) or "warning" (risky, but loads)

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        field = f" {self.field}:" if self.field else ""
        tag = " warning:" if self.severity == "warning" else ""
        return f"{where}:{tag}{field} {self.message}"


class RulesError(SurrogateError):
    """A rules file failed validation. ``problems`` lists every error, in file order;
    ``warnings`` the file's warnings found beside them. The message holds both, in file order."""

    def __init__(self, problems: list[Problem], warnings: list[Problem] | None = None) -> None:
        def place(p: Problem) -> tuple[int, int]:
            return p.line or 0, p.column or 0

        self.problems = problems
        self.warnings = sorted(warnings or [], key=place)
        super().__init__("\n".join(str(p) for p in sorted([*problems, *self.warnings], key=place)))


class SecretUnavailable(SurrogateError):
    """A credential's value source (env var or file) cannot be read; the message names the source."""
