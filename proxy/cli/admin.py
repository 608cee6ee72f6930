"""The state dir's upkeep: ``surrogate keys rotate`` (re-encrypt the store under a new key),
``surrogate keys init`` (the key file alone, e.g. the one a fleet shares) and ``surrogate demo
init`` (the demo token files ``rules/example.yaml`` reads, and the CA)."""

from __future__ import annotations

import argparse
import os
import secrets
from pathlib import Path
from typing import Any

from proxy.cli import options


def add_keys(sub: Any, state: argparse.ArgumentParser) -> None:
    keys = sub.add_parser("keys", help="the store's encryption keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    rotate = keys_sub.add_parser(
        "rotate", parents=[state], help="re-encrypt every stored value under a new key (safe to interrupt)"
    )
    rotate.add_argument("--resume", action="store_true", help="finish an interrupted rotation, no new key")
    options.store_args(rotate)
    rotate.set_defaults(handler=rotate_keys)
    init = keys_sub.add_parser(
        "init", parents=[state], help="create the store's key file (0600) if absent, e.g. a fleet's one key"
    )
    init.set_defaults(handler=init_keys)


def add_demo(sub: Any, state: argparse.ArgumentParser) -> None:
    demo = sub.add_parser("demo", help="the embedded demo")
    demo_sub = demo.add_subparsers(dest="demo_command", required=True)
    init = demo_sub.add_parser(
        "init", parents=[state], help="create the demo token files rules/example.yaml reads, and the CA"
    )
    init.set_defaults(handler=lambda args: demo_init(args.state_dir))


def rotate_keys(args: argparse.Namespace) -> int:
    """Refuses (ValueError) a state dir with no store: rotating nothing there would create one.
    With ``--store URL`` the database is the store, and the key file must exist."""
    from proxy.store.choose import open_store
    from proxy.store.sqlite import KEY_FILE, STORE_FILE

    if args.store is None and not all((args.state_dir / name).is_file() for name in (STORE_FILE, KEY_FILE)):
        raise options.missing_state(args.state_dir, "credential store")
    with open_store(args.state_dir, args.store, args.key_file, create=False) as store:
        count = store.rotate_keys(new_key=not args.resume)
    print(f"surrogate: {count} stored values re-encrypted under the current key")
    return 0


def init_keys(args: argparse.Namespace) -> int:
    """``keys init``: the key file alone (``keys rotate`` reads a store and never creates one)."""
    from proxy.store.keyring import KeyRing
    from proxy.store.sqlite import KEY_FILE

    path = args.state_dir / KEY_FILE
    existed = path.is_file()
    KeyRing.load_or_create(path)
    print(f"surrogate: key file {path} ({'already there' if existed else 'created'})")
    return 0


def demo_init(state_dir: Path) -> int:
    from certs import ca

    old = os.umask(0o077)
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        fresh = {
            "demo-proxy-token": secrets.token_urlsafe(24),
            "demo-github-token": "ghp_demo" + secrets.token_hex(16),  # fake: GitHub answers 401
        }
        for name, value in fresh.items():
            path = state_dir / name
            if not path.exists():
                path.write_text(value + "\n", encoding="ascii")
    finally:
        os.umask(old)
    ca.ensure_ca(state_dir)
    return 0
