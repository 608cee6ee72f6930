"""deploy/kubernetes: the fleet's manifests validate against the Kubernetes JSON schemas and say
what a fleet needs, checked without a cluster.

Validation is kubernetes-validate's (PyPI; it bundles the schemas of every Kubernetes release and
works offline), strict: an unknown or misspelt field is an error. The rest reads the manifests as
data: non-root at the image's own UID (read from the Containerfile as tests/test_containerfile.py
reads it), read-only root file systems, no capability, Secrets only as files, probes wired to
``/healthz`` and ``/readyz`` (and run against real processes), arguments that surrogate's own CLI
parses, and an init container whose script, run here, leaves the files surrogate accepts.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import canary
import kubernetes_validate
import pytest
import yaml
from harness import ROOT, free_port
from test_containerfile import CONTAINERFILE, parse_stages

from certs import ca
from proxy.cli.main import _parser
from proxy.store.keyring import KeyFileError, KeyRing

DEPLOY = ROOT / "deploy" / "kubernetes"
MANIFESTS = sorted(DEPLOY.glob("*.yaml"))
TEMPLATES = sorted((DEPLOY / "secrets-template").glob("*.yaml"))
VERSIONS = ["1.31", kubernetes_validate.latest_version()]
NAMESPACE = "surrogate"
STORE_URL = "postgresql:///?service=surrogate"

Doc = dict[str, Any]


def load(paths: list[Path]) -> list[tuple[Path, Doc]]:
    return [(p, d) for p in paths for d in yaml.safe_load_all(p.read_text(encoding="utf-8")) if d]


def docs() -> list[Doc]:
    return [d for _, d in load(MANIFESTS)]


def one(kind: str, name: str, paths: list[Path] = MANIFESTS) -> Doc:
    [doc] = [d for _, d in load(paths) if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def workloads() -> list[Doc]:
    return [d for d in docs() if d["kind"] in ("DaemonSet", "Deployment")]


def containers(pod: Doc) -> list[Doc]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def image_user() -> tuple[int, int]:
    """The final stage's USER (numeric UID:GID), as the Containerfile test reads the file."""
    _, stages = parse_stages(CONTAINERFILE.read_text(encoding="utf-8"))
    user = stages[-1].all("USER")[-1].args
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and gid.isdigit(), f"USER {user}: name a numeric UID:GID"
    runs = " ".join(i.args for i in stages[-1].all("RUN"))
    assert f"--uid {uid}" in runs and f"--gid {gid}" in runs  # the user the image creates
    return int(uid), int(gid)


# -- the schemas ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS + TEMPLATES, ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_every_manifest_validates_against_the_kubernetes_schemas(path: Path, version: str) -> None:
    found = load([path])
    assert found, f"{path} holds no document"
    for _, doc in found:
        kubernetes_validate.validate(doc, version, strict=True)
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == NAMESPACE


@pytest.mark.parametrize(
    "break_it",
    [
        lambda pod: pod["securityContext"].update(runAsNonroot=True),  # a misspelt field
        lambda pod: pod["securityContext"].update(runAsNonRoot="yes"),  # a string for a bool
        lambda pod: pod["containers"][0].update(readOnlyRootFileSystem=True),  # wrong case
        lambda pod: pod["containers"][0]["livenessProbe"]["exec"].update(cmd=["true"]),
    ],
    ids=["misspelt", "wrong-type", "wrong-case", "unknown-probe-field"],
)
def test_the_validator_refuses_a_broken_pod(break_it: Any) -> None:
    """Strict validation really reads the pod template (a validator that passes anything proves
    nothing)."""
    daemonset = one("DaemonSet", "surrogate-proxy")
    break_it(daemonset["spec"]["template"]["spec"])
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, VERSIONS[-1], strict=True)


def test_the_pieces_of_a_fleet_are_there() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs()}
    assert {
        ("Namespace", "surrogate"),
        ("DaemonSet", "surrogate-proxy"),
        ("Deployment", "surrogate-control"),
        ("Service", "surrogate-proxy"),
        ("Service", "surrogate-control"),
        ("ConfigMap", "surrogate-rules"),
    } <= kinds
    assert (
        one("Namespace", "surrogate")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
        == "restricted"
    )
    # every Secret a pod mounts is in the template, every ConfigMap in the manifests
    secrets = {d["metadata"]["name"] for _, d in load(TEMPLATES) if d["kind"] == "Secret"}
    maps = {d["metadata"]["name"] for d in docs() if d["kind"] == "ConfigMap"}
    for w in workloads():
        for v in w["spec"]["template"]["spec"]["volumes"]:
            if "secret" in v:
                assert v["secret"]["secretName"] in secrets
            if "configMap" in v:
                assert v["configMap"]["name"] in maps
    assert not any(d["kind"] == "Secret" for d in docs()), "Secrets only in secrets-template/"


def test_the_deploy_readme_names_every_manifest() -> None:
    text = (DEPLOY / "README.md").read_text(encoding="utf-8")
    for path in MANIFESTS + TEMPLATES:
        assert f"`{path.relative_to(DEPLOY).as_posix()}`" in text, path.name


def test_the_rules_in_the_config_map_load(tmp_path: Path) -> None:
    from proxy.rules.loader import load_rules

    (tmp_path / "rules.yaml").write_text(one("ConfigMap", "surrogate-rules")["data"]["rules.yaml"])
    assert load_rules(tmp_path / "rules.yaml").pools


# -- the pods ------------------------------------------------------------------------------------


@pytest.mark.parametrize("workload", ["surrogate-proxy", "surrogate-control"])
def test_pods_run_as_the_images_own_non_root_uid(workload: str) -> None:
    uid, gid = image_user()
    assert uid != 0 and gid != 0
    for w in workloads():
        if w["metadata"]["name"] != workload:
            continue
        pod = w["spec"]["template"]["spec"]
        ctx = pod["securityContext"]
        assert ctx["runAsNonRoot"] is True
        assert (ctx["runAsUser"], ctx["runAsGroup"], ctx["fsGroup"]) == (uid, gid, gid)
        assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in containers(pod):
            assert "runAsUser" not in c.get("securityContext", {}), c["name"]  # no container overrides it


def test_every_container_is_locked_down_and_bounded() -> None:
    for w in workloads():
        pod = w["spec"]["template"]["spec"]
        assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), w["metadata"]["name"]
        assert pod["automountServiceAccountToken"] is False
        assert not any("hostPath" in v for v in pod["volumes"])
        for c in containers(pod):
            ctx = c["securityContext"]
            where = f"{w['metadata']['name']}/{c['name']}"
            assert ctx["readOnlyRootFilesystem"] is True, where
            assert ctx["allowPrivilegeEscalation"] is False, where
            assert ctx.get("privileged", False) is False, where
            # NET_ADMIN nowhere: the proxy needs none, transparent mode included (README here)
            assert ctx["capabilities"] == {"drop": ["ALL"]}, where
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][kind]), f"{where} {kind}"


SECRETISH = re.compile(r"password|passwd|secret|token=|:[^/@]*@|BEGIN .*PRIVATE|surr_|ghp_|AKIA", re.I)


def test_secrets_are_files_never_environment_values_or_arguments() -> None:
    for w in workloads():
        pod = w["spec"]["template"]["spec"]
        mounted = {m["name"] for c in containers(pod) for m in c.get("volumeMounts", [])}
        for v in pod["volumes"]:
            if "secret" in v:
                assert v["name"] in mounted
                assert v["secret"]["defaultMode"] == 0o440  # the surrogate group, nobody else
        for c in containers(pod):
            assert "envFrom" not in c
            for e in c.get("env", []):
                assert "secretKeyRef" not in e.get("valueFrom", {}), e["name"]
                assert not SECRETISH.search(e.get("value", "")), e["name"]
            for m in c.get("volumeMounts", []):
                if any(v["name"] == m["name"] and "secret" in v for v in pod["volumes"]):
                    assert m["readOnly"] is True
            argv = [*c.get("command", []), *c.get("args", [])]
            script = [a for a in argv if "\n" in a]  # the init container's copy script
            assert not any(SECRETISH.search(a) for a in argv if a not in script), argv
            if "--store" in argv:
                url = urlsplit(argv[argv.index("--store") + 1])
                assert url.scheme == "postgresql" and url.password is None and url.username is None
                assert not {"password", "passfile"} & set(parse_qs(url.query))


def test_the_state_dir_is_an_empty_dir_in_memory() -> None:
    for w in workloads():
        pod = w["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for c in pod["containers"]:
            env = {e["name"]: e.get("value") for e in c["env"]}
            state = Path(env["SURROGATE_STATE_DIR"])
            [mount] = [m for m in c["volumeMounts"] if state.is_relative_to(m["mountPath"])]
            assert volumes[mount["name"]]["emptyDir"]["medium"] == "Memory"  # no key on the node's disk
            assert any(
                m["mountPath"] == "/tmp" and "emptyDir" in volumes[m["name"]] for m in c["volumeMounts"]
            )


# -- the arguments, through surrogate's own parser ------------------------------------------------


def argv_of(container: Doc) -> list[str]:
    """The container's arguments with Kubernetes' $(VAR) references expanded from its env (each
    must be defined there, from the downward API)."""
    env = {e["name"]: e for e in container["env"]}
    sample = {"NODE_NAME": "ip-10-0-1-23.ec2.internal", "POD_NAME": "surrogate-control-7d9f8b6c4-x2x9q"}

    def expand(m: re.Match[str]) -> str:
        assert m[1] in env and "fieldRef" in env[m[1]]["valueFrom"], m[1]
        return sample[m[1]]

    return [re.sub(r"\$\((\w+)\)", expand, a) for a in container["args"]]


def parse(argv: list[str]) -> Any:
    """surrogate's parser. ``--store`` comes with the PostgreSQL store (issue 14, another branch):
    where this checkout's parser does not know it yet, it must be the only unknown argument."""
    args, rest = _parser().parse_known_args(argv)
    assert rest in ([], ["--store", STORE_URL]), rest
    if not rest:
        assert str(args.store) == STORE_URL
    return args


def mounted_from(pod: Doc, container: Doc, path: Path) -> Doc:
    [mount] = [m for m in container["volumeMounts"] if path.is_relative_to(m["mountPath"])]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    return volume


def test_the_proxy_nodes_arguments_parse_and_match_the_pod() -> None:
    ds = one("DaemonSet", "surrogate-proxy")
    pod = ds["spec"]["template"]["spec"]
    [c] = pod["containers"]
    args = parse(argv_of(c))
    assert args.command == "run"
    assert args.node == "ip-10-0-1-23.ec2.internal"  # spec.nodeName: one name per node
    assert args.listen == ("0.0.0.0", c["ports"][0]["containerPort"])
    assert args.control_tcp is None  # a proxy node serves the control API on its socket only
    assert mounted_from(pod, c, args.rules)["configMap"]["name"] == "surrogate-rules"
    assert args.workers <= int(c["resources"]["limits"]["cpu"])
    svc = one("Service", "surrogate-proxy")
    assert svc["spec"]["internalTrafficPolicy"] == "Local"  # each sandbox to its own node's proxy
    assert svc["spec"]["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert svc["spec"]["ports"][0]["targetPort"] in {p["name"] for p in c["ports"]}


def test_the_control_apis_arguments_parse_and_match_its_service() -> None:
    dep = one("Deployment", "surrogate-control")
    pod = dep["spec"]["template"]["spec"]
    [c] = pod["containers"]
    args = parse(argv_of(c))
    assert args.command == "control"
    assert args.control_tcp == ("0.0.0.0", c["ports"][0]["containerPort"])
    assert mounted_from(pod, c, args.control_token_file)["secret"]["secretName"] == "surrogate-operator"
    for path in (args.control_tls_cert, args.control_tls_key):
        assert mounted_from(pod, c, path)["secret"]["secretName"] == "surrogate-control-tls"
    svc = one("Service", "surrogate-control")
    assert f"{svc['metadata']['name']}.{NAMESPACE}.svc" in args.control_name
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert svc["spec"]["ports"][0]["targetPort"] in {p["name"] for p in c["ports"]}
    assert one("Secret", "surrogate-control-tls", TEMPLATES)["type"] == "kubernetes.io/tls"


def test_network_policies_select_the_pods_they_protect() -> None:
    for name in ("surrogate-proxy", "surrogate-control"):
        policy = one("NetworkPolicy", name)
        [w] = [w for w in workloads() if w["metadata"]["name"] == name]
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        ports = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
        assert ports == {p["containerPort"] for p in w["spec"]["template"]["spec"]["containers"][0]["ports"]}


# -- the init container: its script, run here -------------------------------------------------


def init_script(workload: Doc) -> str:
    [init] = workload["spec"]["template"]["spec"]["initContainers"]
    assert init["command"][:2] == ["sh", "-ec"]
    return str(init["command"][2])


@pytest.mark.parametrize("kind", ["DaemonSet", "Deployment"])
def test_the_init_container_leaves_what_surrogate_accepts(tmp_path: Path, kind: str) -> None:
    """The copy script, with /etc/surrogate and /var/lib/surrogate moved under tmp_path, over
    Secret files as Kubernetes mounts them (0440): the key file as mounted is refused (group
    access), the copy is accepted; libpq's password file and the CA key are 0600 too, the state
    dir 0700, and every path the main container's env names is there."""
    [w] = [w for w in workloads() if w["kind"] == kind]
    etc, var = tmp_path / "etc", tmp_path / "var"
    source = tmp_path / "source"
    password = canary.make("pgpass")  # a database password is a credential: a canary
    KeyRing.load_or_create(source / "store.key")
    ca.ensure_ca(source)
    secrets = {
        "keys/store.key": (source / "store.key").read_bytes(),
        "ca/mitmproxy-ca.pem": (source / "ca" / "mitmproxy-ca.pem").read_bytes(),
        "ca/mitmproxy-ca-cert.pem": (source / "ca" / "mitmproxy-ca-cert.pem").read_bytes(),
        "db/pgpass": f"postgres.database.svc:5432:surrogate:surrogate:{password}\n".encode(),
        "db/pg_service.conf": b"[surrogate]\nhost=postgres.database.svc\n",
    }
    for rel, data in secrets.items():
        (etc / rel).parent.mkdir(parents=True, exist_ok=True)
        (etc / rel).write_bytes(data)
        (etc / rel).chmod(0o440)
    canary.exempt(etc / "db" / "pgpass")  # the Secret as mounted and its copy: by design
    canary.exempt(var / "state" / "pgpass")
    var.mkdir()
    with pytest.raises(KeyFileError, match="group or others"):
        KeyRing.load_or_create(etc / "keys" / "store.key")
    script = init_script(w).replace("/etc/surrogate", str(etc)).replace("/var/lib/surrogate", str(var))
    done = subprocess.run(["sh", "-ec", script], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    state = var / "state"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for f in state.rglob("*"):
        if f.is_file() and f.name != "mitmproxy-ca-cert.pem":
            assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    KeyRing.load_or_create(state / "store.key")  # accepted: no group or other access
    if kind == "DaemonSet":  # the proxy uses the fleet's CA, not a new one per pod
        assert ca.ensure_ca(state).read_bytes() == secrets["ca/mitmproxy-ca-cert.pem"]
    [main] = w["spec"]["template"]["spec"]["containers"]
    for e in main["env"]:
        value = e.get("value") or ""
        if value.startswith("/var/lib/surrogate/state/"):
            assert (var / value.removeprefix("/var/lib/surrogate/")).is_file(), e["name"]


# -- the probes ----------------------------------------------------------------------------------


def probes(workload: Doc) -> dict[str, list[str]]:
    [c] = workload["spec"]["template"]["spec"]["containers"]
    return {kind: c[kind]["exec"]["command"] for kind in ("livenessProbe", "readinessProbe")}


@pytest.mark.parametrize("kind", ["DaemonSet", "Deployment"])
def test_liveness_asks_healthz_and_readiness_asks_readyz(kind: str) -> None:
    [w] = [w for w in workloads() if w["kind"] == kind]
    found = probes(w)
    assert found["livenessProbe"][-1] == "/healthz" and found["readinessProbe"][-1] == "/readyz"
    for argv in found.values():
        assert argv[:2] == ["python", "-c"] and "control.sock" in argv[2] and "AF_UNIX" in argv[2]
        compile(argv[2], kind, "exec")


def wait_socket(path: Path, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(str(path))
                return
            except OSError:
                assert proc.poll() is None, "the process exited"
                assert time.monotonic() < deadline, f"{path} did not come up"
                time.sleep(0.05)


@pytest.fixture
def live(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    kind = request.param
    state = tmp_path / "state"
    (tmp_path / "rules.yaml").write_text(one("ConfigMap", "surrogate-rules")["data"]["rules.yaml"])
    command = "run" if kind == "DaemonSet" else "control"
    cmd = [sys.executable, "-m", "proxy", command, "--rules", str(tmp_path / "rules.yaml")]
    cmd += ["--state-dir", str(state), "--audit-file", str(tmp_path / "audit.jsonl"), "--node", "probe-test"]
    if kind == "DaemonSet":
        cmd += ["--listen", f"127.0.0.1:{free_port()}", "--workers", "1"]
    with open(tmp_path / "stderr", "wb") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    try:
        yield state, proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)


@pytest.mark.e2e
@pytest.mark.parametrize("live", ["DaemonSet", "Deployment"], indirect=True)
def test_the_probe_commands_pass_against_a_live_process_and_fail_without_one(
    live: tuple[Path, subprocess.Popen[bytes]], request: pytest.FixtureRequest
) -> None:
    state, proc = live
    kind = request.node.callspec.params["live"]
    [w] = [w for w in workloads() if w["kind"] == kind]
    env = {"SURROGATE_STATE_DIR": str(state), "PATH": "/usr/bin:/bin"}

    def run(argv: list[str]) -> int:
        argv = [sys.executable, *argv[1:]]  # the image's `python` is its venv's
        return subprocess.run(argv, env=env, capture_output=True, timeout=10, check=False).returncode

    wait_socket(state / "control.sock", proc)
    deadline = time.monotonic() + 20
    while run(probes(w)["readinessProbe"]) != 0:  # ready once the listeners are up
        assert time.monotonic() < deadline, "never ready"
        time.sleep(0.1)
    assert run(probes(w)["livenessProbe"]) == 0
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=10)
    assert run(probes(w)["livenessProbe"]) != 0 and run(probes(w)["readinessProbe"]) != 0


# -- the pod, emulated: read-only root, tmpfs state, the init script, the probes -----------------

POD = r"""
import json, os, subprocess, sys, time
tmp, script = sys.argv[1:3]
argv, env, ready, live = map(json.loads, sys.argv[3:7])
run = lambda *a: subprocess.run(a, check=True)
run("mount", "--make-rprivate", "/")
run("mount", "-t", "tmpfs", "-o", "size=64m,mode=0777", "tmpfs", tmp + "/var")
run("mount", "-t", "tmpfs", "-o", "size=16m,mode=1777", "tmpfs", tmp + "/tmp")
run("mount", "-o", "remount,bind,ro", "/")
out = {}
try:
    open(tmp + "/outside", "w")
    out["root_writable"] = True
except OSError as e:
    out["root_writable"] = e.strerror
out["init"] = subprocess.run(["sh", "-ec", script], capture_output=True, text=True).returncode
env = {**env, "PATH": os.environ["PATH"], "TMPDIR": tmp + "/tmp", "PYTHONDONTWRITEBYTECODE": "1"}
with open(tmp + "/tmp/stderr", "wb") as err:
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
probe = lambda a: subprocess.run(a, env=env, capture_output=True, timeout=10).returncode
deadline = time.monotonic() + 90
while probe(ready) != 0 and time.monotonic() < deadline and proc.poll() is None:
    time.sleep(0.2)
out["ready"], out["live"] = probe(ready), probe(live)
proc.terminate()
proc.wait(timeout=20)
out["stderr"] = open(tmp + "/tmp/stderr").read()[-2000:]
print(json.dumps(out))
"""


@pytest.mark.e2e
@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/usr/bin/unshare").exists(), reason="needs root and unshare(1)"
)
def test_the_proxy_pod_runs_on_a_read_only_root_with_only_its_state_dir(tmp_path: Path) -> None:
    """The DaemonSet's pod, emulated in a mount namespace of this test's own: the root file
    system read-only, the state dir and /tmp tmpfs, the Secrets as 0440 files, the init script,
    then the proxy container's own arguments and environment, and its probes. It comes up ready,
    so nothing it needs writes outside the two empty dirs. (As root: the test's Python lives
    where UID 10001 cannot read; the UID is checked above. The shared store is another test's:
    ``--store`` is left out, and the SQLite store lands in the state dir.)"""
    ds = one("DaemonSet", "surrogate-proxy")
    pod = ds["spec"]["template"]["spec"]
    [main] = pod["containers"]
    etc, var = tmp_path / "etc", tmp_path / "var"
    (tmp_path / "tmp").mkdir()
    var.mkdir()
    source = tmp_path / "source"
    KeyRing.load_or_create(source / "store.key")
    ca.ensure_ca(source)
    files = {
        "keys/store.key": source / "store.key",
        "ca/mitmproxy-ca.pem": source / "ca" / "mitmproxy-ca.pem",
        "ca/mitmproxy-ca-cert.pem": source / "ca" / "mitmproxy-ca-cert.pem",
    }
    for rel, src in files.items():
        (etc / rel).parent.mkdir(parents=True, exist_ok=True)
        (etc / rel).write_bytes(src.read_bytes())
    (etc / "db").mkdir()
    pgpass = canary.exempt(etc / "db" / "pgpass")  # its copy lives in the namespace's tmpfs only
    pgpass.write_text(f"postgres.database.svc:5432:surrogate:surrogate:{canary.make('podpass')}\n")
    (etc / "db" / "pg_service.conf").write_text("[surrogate]\nhost=postgres.database.svc\n")
    (etc / "rules").mkdir()
    (etc / "rules" / "rules.yaml").write_text(one("ConfigMap", "surrogate-rules")["data"]["rules.yaml"])
    for f in etc.rglob("*"):
        if f.is_file():
            f.chmod(0o440)

    def moved(text: str) -> str:
        return text.replace("/etc/surrogate", str(etc)).replace("/var/lib/surrogate", str(var))

    argv = [moved(a) for a in argv_of(main)]
    at = argv.index("--store")
    del argv[at : at + 2]
    argv[argv.index("--listen") + 1] = f"127.0.0.1:{free_port()}"  # tests listen on loopback only
    argv = [sys.executable, "-m", "proxy", *argv]
    env = {e["name"]: moved(e["value"]) for e in main["env"] if "value" in e}
    [ready, live] = [[sys.executable, *probes(ds)[k][1:]] for k in ("readinessProbe", "livenessProbe")]
    args = [str(tmp_path), moved(init_script(ds)), *map(json.dumps, (argv, env, ready, live))]
    done = subprocess.run(
        ["unshare", "--mount", sys.executable, "-c", POD, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["root_writable"] == "Read-only file system"
    assert out["init"] == 0
    assert (out["ready"], out["live"]) == (0, 0), out["stderr"]
    assert "Traceback" not in out["stderr"]


# -- who a NetworkPolicy lets in or out (review r-audit) ---------------------------------------

SANDBOX_TEMPLATE = DEPLOY / "sandbox-template" / "networkpolicy.yaml"


def selects(selector: Doc | None, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels and matchExpressions) against labels."""
    if selector is None:
        return True
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def admits(policy: Doc, direction: str, ns: dict[str, str], pod: dict[str, str], port: int) -> bool:
    """Whether ``policy`` lets a connection from (ingress) or to (egress) a pod with labels
    ``pod`` in a namespace with labels ``ns``, on TCP ``port`` (only peers by selector: any
    ipBlock counts as admitting everything)."""
    rules = policy["spec"].get(direction) or []
    side = "from" if direction == "ingress" else "to"
    for rule in rules:
        ports = rule.get("ports")
        if ports is not None and not any(p.get("port") == port for p in ports):
            continue
        peers = rule.get(side)
        if peers is None:
            return True
        for peer in peers:
            if "ipBlock" in peer:
                return True
            in_ns = selects(peer.get("namespaceSelector"), ns) if "namespaceSelector" in peer else False
            if in_ns and selects(peer.get("podSelector"), pod):
                return True
    return False


BROKER_NS = {"kubernetes.io/metadata.name": "brokers", "surrogate-control-clients": "true"}
SANDBOX_NS = {"kubernetes.io/metadata.name": "sandboxes", "surrogate-sandboxes": "true"}
CLIENT = {"surrogate-control-client": "true"}


@pytest.mark.parametrize(
    "ns,pod,admitted",
    [
        (BROKER_NS, CLIENT, True),
        (SANDBOX_NS, CLIENT, False),  # a sandbox pod that carries the client label
        ({**BROKER_NS, "surrogate-sandboxes": "true"}, CLIENT, False),
        ({"kubernetes.io/metadata.name": "default"}, CLIENT, False),  # any other namespace
        (BROKER_NS, {}, False),
    ],
    ids=["broker", "sandbox-with-client-label", "both-labels", "unlabelled-namespace", "unlabelled-pod"],
)
def test_the_control_api_admits_only_labelled_clients_in_labelled_namespaces(
    ns: dict[str, str], pod: dict[str, str], admitted: bool
) -> None:
    """Hostile review: the control policy took a pod with the client label from any namespace
    (``namespaceSelector: {}``), a sandboxes' namespace included: a pod's labels are whatever its
    creator wrote, so the namespace has to be the operator's choice too."""
    policy = one("NetworkPolicy", "surrogate-control")
    assert admits(policy, "ingress", ns, pod, 9090) is admitted


def test_the_sandboxes_namespace_template_lets_its_pods_reach_the_proxy_port_only() -> None:
    """The manifests had no egress policy for the sandboxes: a pod there could reach the control
    Service, the store, the cluster's DNS or the Internet directly (only the token guarded the
    control API). The template opens the proxy's port and nothing else, and no ingress."""
    [(_, policy)] = load([SANDBOX_TEMPLATE])
    kubernetes_validate.validate(policy, kubernetes_validate.latest_version(), strict=True)
    assert policy["spec"]["podSelector"] == {} and set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    assert policy["spec"]["ingress"] == []
    proxy = {"kubernetes.io/metadata.name": NAMESPACE}
    proxy_pod = one("DaemonSet", "surrogate-proxy")["spec"]["template"]["metadata"]["labels"]
    control_pod = one("Deployment", "surrogate-control")["spec"]["template"]["metadata"]["labels"]
    assert admits(policy, "egress", proxy, proxy_pod, 8080)
    assert not admits(policy, "egress", proxy, proxy_pod, 9090)
    assert not admits(policy, "egress", proxy, control_pod, 9090)
    assert not admits(
        policy, "egress", {"kubernetes.io/metadata.name": "kube-system"}, {"k8s-app": "kube-dns"}, 53
    )
    assert not admits(policy, "egress", SANDBOX_NS, {}, 8080)  # not other sandboxes
    assert not any("ipBlock" in peer for rule in policy["spec"]["egress"] for peer in rule["to"])
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    assert "`sandbox-template/networkpolicy.yaml`" in readme
