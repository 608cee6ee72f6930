"""One builder for the end-to-end world: a rules file, upstreams, proxy processes, the canary check.

A test states only what differs from the usual world. Three parts:

- **Rules pieces**, plain dicts dumped to YAML (the file the proxy loads): :func:`egress` (one
  egress rule), :func:`credential`, :func:`claim` and :func:`rules` (the whole file: ``version: 1``,
  one pool ``p`` with ``egress`` and one claim ``c1`` with ``credentials`` unless told otherwise).
  A test that checks how a *spelling* of a rules file is read keeps its own literal text.
- **A stage** (:class:`Stage`, a context manager over a temp dir): a test CA, canary secrets in
  their source files, proxy tokens, upstreams (started now, stopped at exit), helper server
  processes (:meth:`Stage.process`, the network-namespace tests' upstreams), proxy processes
  (pinned names, the stage's CA as upstream CA, in a namespace with ``cls``; stopped at exit).
  When the stage closes, every proxy's audit file and stderr and every byte kept in
  ``received`` is checked for each canary the stage made or was given (DESIGN.md invariant 1).
- **Servers and clients**: :class:`WsServer` (a TLS WebSocket upstream; a subclass writes the
  handler), :func:`control` and :func:`metric` (the control socket and its /metrics).

Shapes::

    with Stage(tmp) as st:
        token = st.token()
        secret = st.secret("api")                     # a canary in tmp/secret-api
        up = st.upstream(["api.test"])                # servers.Upstream, started
        proxy = st.proxy(rules(egress=[egress("api.test", up.port)],
                               credentials=[credential("api", PH, ["api.test"])]),
                         resolve=["api.test"])        # ProxyProcess, started
        yield ...
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from subprocess import PIPE, Popen
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

import canary
import httpx
import yaml
from harness import ProxyProcess, free_port
from servers import TestCA, Upstream
from websockets.asyncio.server import ServerConnection, serve

# ---------------------------------------------------------------------------- rules-file pieces


def egress(
    host: str, port: int | None = None, *, ports: Sequence[int] | None = None, **extra: Any
) -> dict[str, Any]:
    """One egress rule: ``host`` on ``[port]`` (or ``ports``; ``[]`` is any port), plus any other
    field of rules/README.md as a keyword (``scheme="http"``, ``intercept=False``, ``methods=[...]``)."""
    rule: dict[str, Any] = {"host": host}
    if ports is not None:
        rule["ports"] = list(ports)
    elif port is not None:
        rule["ports"] = [port]
    return {**rule, **extra}


def credential(
    name: str, placeholder: str, hosts: Sequence[str], value: str | None = None, **extra: Any
) -> dict[str, Any]:
    """One credential; its value defaults to ``file:secret-<name>`` (what :meth:`Stage.secret` writes)."""
    return {
        "name": name,
        "value": value or f"file:secret-{name}",
        "placeholder": placeholder,
        "hosts": list(hosts),
        **extra,
    }


def claim(
    id: str = "c1",
    credentials: Sequence[Mapping[str, Any]] = (),
    *,
    pool: str = "p",
    token: str = "file:token",
    **extra: Any,
) -> dict[str, Any]:
    """One claim in ``pool`` whose proxy token comes from ``token`` (a value source)."""
    creds = [dict(c) for c in credentials]
    return {"id": id, "pool": pool, "proxy_token": token, "credentials": creds, **extra}


def rules(
    egress: Sequence[Mapping[str, Any]] = (),
    *,
    credentials: Sequence[Mapping[str, Any]] = (),
    pool: str = "p",
    pool_extra: Mapping[str, Any] | None = None,
    pools: Mapping[str, Mapping[str, Any]] | None = None,
    claims: Sequence[Mapping[str, Any]] | None = None,
    claim_id: str = "c1",
    **top: Any,
) -> str:
    """A rules file's text. Default: pool ``pool`` with ``egress`` (and ``pool_extra`` fields such
    as ``unsafe_any_host``), one claim ``claim_id`` holding ``credentials``. ``pools`` (name -> pool
    body) and ``claims`` replace those defaults; ``claims=[]`` writes no claim. ``top``: more
    top-level sections (``hooks``, ``oauth``, ...)."""
    if pools is None:
        pools = {pool: {"egress": [dict(r) for r in egress], **(pool_extra or {})}}
    if claims is None:
        claims = [claim(claim_id, credentials, pool=pool)]
    doc: dict[str, Any] = {"version": 1, "pools": {k: dict(v) for k, v in pools.items()}}
    if claims:
        doc["claims"] = [dict(c) for c in claims]
    doc.update(top)
    return dump(doc)


class _Dumper(yaml.SafeDumper):
    """Block style as people write rules files: nested lists indented, lists of plain values on
    one line (``ports: [443]``, ``hosts: [api.test]``), so tests may still edit the text."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)

    def ignore_aliases(self, data: Any) -> bool:
        return True  # a piece used twice is written twice: rules files take no anchors


def _list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flat = all(not isinstance(v, dict | list) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flat)


_Dumper.add_representer(list, _list)


def dump(doc: Mapping[str, Any]) -> str:
    """YAML text of ``doc`` (keys in the order given)."""
    return yaml.dump(dict(doc), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1000)


# ---------------------------------------------------------------------------------- the stage


class _Server(Protocol):
    port: int

    def start(self) -> Any: ...

    def stop(self) -> None: ...


S = TypeVar("S", bound=_Server)
C = TypeVar("C")


class Stage:
    """The temp dir of one world and everything started in it; see the module docstring."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ca = TestCA(tmp)
        self.canaries: list[str] = []
        self.received: list[bytes] = []  # every byte a client got back, for the canary check
        self.proxies: list[ProxyProcess] = []
        self.scanned: list[Path] = []  # more files the closing check reads (those that exist then)
        self.every_canary = False  # True: the closing check looks for every canary of the session
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stack.close()
        if kind is None:  # a test that failed already says why; a leak is looked for after a pass
            self.assert_no_canary()

    def artifacts(self) -> dict[str, bytes]:
        """Every proxy's audit file and stderr, and the client-received bytes, by name."""
        out: dict[str, bytes] = {}
        for i, p in enumerate(self.proxies):
            tag = f" #{i}" if len(self.proxies) > 1 else ""
            out[f"audit file{tag}"] = p.audit_path.read_bytes() if p.audit_path.exists() else b""
            out[f"proxy stderr{tag}"] = p.stderr_path.read_bytes() if p.stderr_path.exists() else b""
        out["client-received bytes"] = b"".join(self.received)
        for f in self.scanned:
            if f.exists():
                out[str(f.relative_to(self.tmp) if f.is_relative_to(self.tmp) else f)] = f.read_bytes()
        return out

    def assert_no_canary(self, more: Mapping[str, bytes] | None = None) -> None:
        canary.assert_absent(
            {**self.artifacts(), **(more or {})}, None if self.every_canary else self.canaries
        )

    # -- values

    def secret(self, name: str = "secret", tag: str | None = None, file: str | None = None) -> str:
        """A fresh canary, written to ``tmp/secret-<name>`` (``file``: another file name) as its
        registered source."""
        value = canary.make(tag or name)
        canary.source(self.tmp / (file or f"secret-{name}"), value)
        self.canaries.append(value)
        return value

    def watch(self, *values: str) -> None:
        """More canaries the closing check looks for (values a test made itself)."""
        self.canaries.extend(values)

    def token(self, value: str | None = None, file: str = "token", newline: bool = True) -> str:
        """A proxy token (random unless given) in ``tmp/<file>``."""
        value = value or "tok-" + os.urandom(8).hex()
        (self.tmp / file).write_text(value + ("\n" if newline else ""))
        return value

    def write(self, text: str, name: str = "rules.yaml") -> Path:
        path = self.tmp / name
        path.write_text(text)
        return path

    # -- servers

    def upstream(self, names: Sequence[str], **kw: Any) -> Upstream:
        """A started :class:`servers.Upstream` under the stage's CA covering ``names``."""
        kw.setdefault("tmpdir", self.tmp)
        return self.serve(Upstream(self.ca, list(names), **kw))

    def serve(self, server: S) -> S:
        """Start ``server`` (anything with start/stop) now and stop it when the stage closes."""
        server.start()
        self._stack.callback(server.stop)
        return server

    def defer(self, fn: Callable[..., object], *args: Any) -> None:
        """Call ``fn(*args)`` when the stage closes (before what was started earlier is stopped)."""
        self._stack.callback(fn, *args)

    def process(self, argv: Sequence[str], *, kill: bool = False, timeout: float = 30) -> Popen[str]:
        """A helper server process (``ip netns exec NS python -c ...``) that prints "ready" once it
        serves and stops when its stdin closes; waited for now, stopped when the stage closes
        (``kill``: killed too, for one that would not stop by itself)."""
        proc = Popen(list(argv), stdin=PIPE, stdout=PIPE, text=True)
        self._stack.callback(stop_process, proc, kill, timeout)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return proc

    def enter(self, cm: contextlib.AbstractContextManager[C]) -> C:
        """Enter a context manager (a server that is one) until the stage closes."""
        return self._stack.enter_context(cm)

    def proxy(
        self,
        rules_text: str | Path,
        resolve: Iterable[str] | Mapping[str, str] = (),
        *,
        workdir: Path | None = None,
        start: bool = True,
        control: bool = False,
        upstream_ca: Path | None | bool = True,
        args: Sequence[str] = (),
        cls: Callable[..., ProxyProcess] = ProxyProcess,
        **kw: Any,
    ) -> ProxyProcess:
        """A :class:`harness.ProxyProcess` on the rules text (written to ``rules.yaml``) or file,
        with ``resolve`` names pinned to 127.0.0.1 (or a name -> address map), trusting the stage's
        CA upstream; its state, audit file and stderr in ``workdir`` (default: the stage's dir,
        one per proxy when a stage runs several). ``start``: started now (``control``: and its
        control socket is there); stopped when the stage closes either way. ``args``: more
        ``surrogate run`` arguments; ``cls``: what builds it (``functools.partial(NsProxy, ns)``
        runs it in a network namespace); ``kw``: ProxyProcess's ``env``, ``workers``."""
        path = rules_text if isinstance(rules_text, Path) else self.write(rules_text)
        pins = dict(resolve) if isinstance(resolve, Mapping) else {n: "127.0.0.1" for n in resolve}
        ca = self.ca.ca_pem if upstream_ca is True else (upstream_ca or None)
        proxy = cls(path, workdir or self.tmp, upstream_ca=ca, resolve=pins, **kw)
        proxy.args += list(args)
        self.proxies.append(proxy)
        self._stack.callback(proxy.stop)
        if start:
            proxy.start()
            if control:
                wait_control(proxy)
        return proxy


class WsServer:
    """A TLS WebSocket upstream on 127.0.0.1 (the ``websockets`` library) whose certificate, from
    ``ca``, covers ``names``; a subclass answers each connection in :meth:`handler`. ``serve``:
    more arguments of ``websockets.asyncio.server.serve`` (``max_size``, ``process_response``).
    A context manager (:meth:`Stage.enter` runs it until the stage closes)."""

    def __init__(self, ca: TestCA, names: Sequence[str], **serve: Any) -> None:
        self.port = free_port()
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ca.ca.issue_cert(*names).configure_cert(self.ctx)
        self._serve = serve
        self.loop = asyncio.new_event_loop()
        self.stop_event: asyncio.Event | None = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),), daemon=True)

    async def handler(self, ws: ServerConnection) -> None:
        raise NotImplementedError

    async def _main(self) -> None:
        self.stop_event = asyncio.Event()
        async with serve(self.handler, "127.0.0.1", self.port, ssl=self.ctx, **self._serve):
            self.ready.set()
            await self.stop_event.wait()

    def __enter__(self) -> Self:
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.stop_event is not None
        self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(10)
        self.loop.close()


def stop_process(proc: Popen[str], kill: bool = False, timeout: float = 30) -> None:
    """Close a :meth:`Stage.process`'s stdin (its signal to stop), then wait for it."""
    if proc.stdin and not proc.stdin.closed:
        proc.stdin.close()
    if kill:
        proc.kill()
    proc.wait(timeout=timeout)
    if proc.stdout:
        proc.stdout.close()


def control(proxy: ProxyProcess, **kw: Any) -> httpx.Client:
    """An HTTP client of ``proxy``'s control socket (``/metrics``, ``/v1/...``)."""
    sock = proxy.state_dir / "control.sock"
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://control", **kw)


def metric(proxy: ProxyProcess, sample: str) -> float:
    """The sum of the /metrics samples whose line starts with ``sample`` (all workers' together)."""
    with control(proxy) as api:
        text = api.get("/metrics").text
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(sample))


def wait_control(proxy: ProxyProcess, timeout: float = 10) -> Path:
    """The proxy's control socket, once it exists (it is bound just after the listener)."""
    sock = proxy.state_dir / "control.sock"
    deadline = time.monotonic() + timeout
    while not sock.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return sock
