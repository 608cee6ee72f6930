"""The flat module paths of releases before the layer packages (issue 17), kept importable.

``import proxy.hosts`` gives the very module object of ``proxy.core.hosts`` (not a copy), so a
caller that patches an attribute through the old path patches the one the code uses. The
packages that took the name of an old module (``proxy.rules``, ``proxy.store``,
``proxy.control``, ``proxy.engine``, ``proxy.cli``) forward the old module's names from their
``__init__`` (:func:`forward`). New code imports the new paths; this table only shrinks.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

MOVED = {
    **{
        f"proxy.{name}": f"proxy.core.{name}"
        for name in [
            "addresses", "base64run", "bodies", "decide", "decode", "errors", "forgery", "hooks",
            "hosts", "hygiene", "limits", "netrules", "oauth", "paths", "placeholders", "policy",
            "scrub", "slots", "spellings", "substitute", "suffixes",
        ]
    },
    "proxy.secrets": "proxy.rules.sources",  # Secret, checked_value and ValueSource, as before
    "proxy.keyring": "proxy.store.keyring",
    "proxy.registry": "proxy.store.registry",
    "proxy.live": "proxy.store.live",
    "proxy.counters": "proxy.store.counters",
    "proxy.api": "proxy.control.api",
    "proxy.apiedge": "proxy.control.apiedge",
    "proxy.client": "proxy.control.client",
    "proxy.dispatch": "proxy.engine.dispatch",
    "proxy.workers": "proxy.engine.workers",
    "proxy.hardening": "proxy.engine.hardening",
    "proxy.state": "proxy.engine.state",
    "proxy.hostaddrs": "proxy.engine.hostaddrs",
    "proxy.sockets": "proxy.engine.sockets",
    "proxy.explain": "proxy.cli.explain",
    "proxy.provision": "proxy.cli.provision",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        """The module was executed under its new name."""


def install() -> None:
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())


def forward(*modules: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) that finds a name in ``modules``, imported on first use."""

    def __getattr__(name: str) -> Any:
        for dotted in modules:
            module = importlib.import_module(dotted)
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(f"module has no attribute {name!r}")

    return __getattr__
