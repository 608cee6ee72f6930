"""CPU per audit event (proxy.audit.emit of a typical request event, to a file), in-process.

The hash chain (issue 18) renders each line once and hashes its bytes: measured on the 2-core
dev machine, 9.0-9.5 µs per event before the chain and 10.3-10.6 µs with it (SHA-256 of a
~600-byte line is about 1 µs here). Run: ``python -m bench.audit_line`` from the repo root.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from proxy import audit as a


def event() -> dict[str, Any]:
    return {
        a.REQUEST_ID: "6f0c2a9e-0000-4000-8000-000000000000",
        a.CLAIM: "demo",
        a.POOL: "demo",
        a.CLIENT: "127.0.0.1:51234",
        a.METHOD: "GET",
        a.SCHEME: "https",
        a.HOST: "api.github.com",
        a.PORT: 443,
        a.PATH: "/user?page=REDACTED&flag",
        a.STATUS: 200,
        a.DECISION: "allow",
        a.REASON: "allowed",
        a.RULE: "demo.egress[0] api.github.com",
        a.MESSAGE: None,
        a.WOULD_DENY: None,
        a.CREDENTIALS: [{"name": "github", "version": 1}],
        a.CARRIED: [],
        a.FORGED: [],
        a.CARRIED_ON: [],
        a.VIOLATION_SURFACE: None,
        a.BYTES_OUT: 0,
        a.BYTES_IN: 12,
        a.DURATION_MS: 3.5,
    }


def cost_us(events: int = 50_000, repeats: int = 5) -> float:
    """The best of ``repeats`` runs: CPU microseconds per emitted event."""
    with tempfile.TemporaryDirectory(prefix="surrogate-bench-audit-") as tmp:
        a.configure(Path(tmp) / "audit.jsonl", 0, 0)
        best = float("inf")
        for _ in range(repeats):
            batch = [event() for _ in range(events)]
            start = time.process_time()
            for e in batch:
                a.emit("request", e)
            best = min(best, (time.process_time() - start) / events * 1e6)
        a.configure(None)
        return best


if __name__ == "__main__":
    print(f"audit event: {cost_us():.2f} µs CPU each")
