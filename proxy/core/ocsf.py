"""The native audit event as OCSF: HTTP Activity (class_uid 4002) of OCSF 1.5.0, with the
``security_control`` profile (``action_id``, ``disposition_id``, ``firewall_rule``, ``policy``).

Pure: a native event (the dict :mod:`proxy.audit` writes, already redacted) and its time in
epoch milliseconds in, an OCSF event out. Only ``request`` and ``tunnel`` events are HTTP
activity; ``control`` and ``reload`` events stay in the native stream only (None here).

Every OCSF value comes from a field of the native event, so it holds no more than that event
does: no secret value, no header value, query values and placeholders REDACTED. A method
outside HTTP's registered ones (RFC 9110 section 9) is not copied (``activity_id`` 99, Other):
the sandbox chose it. Fields OCSF has no place for (credentials by name and version, the
placeholder surfaces, ``would_deny``, ``worker``, ``seq``) go under ``unmapped``.

Mapping (OCSF attribute ← native field):

=========================  ======================================================================
``activity_id``            the method: CONNECT 1, DELETE 2, GET 3, HEAD 4, OPTIONS 5, POST 6,
                           PUT 7, TRACE 8, any other 99, none (a transparent pass-through) 99
``action_id``              1 Allowed for allow, and for an upstream failure or a client that
                           closed (the proxy let it through); 2 Denied otherwise
``disposition_id``         1 Allowed, 2 Blocked (the same split)
``severity_id``            allow 1 Informational, error 2 Low, deny 3 Medium, violation 4 High
``status_id``, ``status``  1 Success for allow, 2 Failure otherwise
``status_code``            ``reason``;  ``status_detail`` and ``message``: ``message``
``firewall_rule``          ``rule`` (name and uid);  ``policy.name``: ``pool``
``src_endpoint``           ``client`` (ip, port) and ``claim`` (uid: the sandbox)
``dst_endpoint``           ``host`` (hostname, or ip for an address literal) and ``port``
``http_request``           method, url (scheme, hostname, port, path, query_string from the
                           redacted ``path``; url_string: those together, or ``host:port`` for
                           a tunnel), ``uid``: ``request_id``, ``length``: ``bytes_out``
``http_response``          ``code``: ``status``, ``length``: ``bytes_in`` (only with a status)
``time``, ``end_time``     the event's time; ``start_time`` = time - ``duration_ms``
``metadata``               version 1.5.0, product surrogate, ``uid``: ``request_id``,
                           ``sequence``: ``seq``, profiles [security_control]
=========================  ======================================================================
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Mapping
from typing import Any

VERSION = "1.5.0"
CLASS_UID = 4002
CATEGORY_UID = 4
PROFILES = ["security_control"]

_ACTIVITIES = {
    "CONNECT": (1, "Connect"),
    "DELETE": (2, "Delete"),
    "GET": (3, "Get"),
    "HEAD": (4, "Head"),
    "OPTIONS": (5, "Options"),
    "POST": (6, "Post"),
    "PUT": (7, "Put"),
    "TRACE": (8, "Trace"),
}
_OTHER = (99, "Other")
_SEVERITY = {
    "allow": (1, "Informational"),
    "error": (2, "Low"),
    "deny": (3, "Medium"),
    "violation": (4, "High"),
}
_PASSED = {"upstream_error", "client_closed"}  # errors after the proxy let the request through
_UNMAPPED = (
    "claim",
    "pool",
    "credentials",
    "carried",
    "carried_on",
    "forged",
    "violation_surface",
    "would_deny",
    "worker",
    "seq",
)


def http_activity(event: Mapping[str, Any], time_ms: int) -> dict[str, Any] | None:
    """OCSF HTTP Activity for a native ``request`` or ``tunnel`` event; None for other kinds."""
    if event.get("event") not in ("request", "tunnel"):
        return None
    decision = event.get("decision")
    activity_id, activity = _ACTIVITIES.get(str(event.get("method")), _OTHER)
    severity_id, severity = _SEVERITY.get(str(decision), (0, "Unknown"))
    passed = decision == "allow" or (decision == "error" and event.get("reason") in _PASSED)
    duration = int(event.get("duration_ms") or 0)
    out: dict[str, Any] = {
        "category_uid": CATEGORY_UID,
        "category_name": "Network Activity",
        "class_uid": CLASS_UID,
        "class_name": "HTTP Activity",
        "activity_id": activity_id,
        "activity_name": activity,
        "type_uid": CLASS_UID * 100 + activity_id,
        "type_name": f"HTTP Activity: {activity}",
        "time": time_ms,
        "start_time": time_ms - duration,
        "end_time": time_ms,
        "duration": duration,
        "severity_id": severity_id,
        "severity": severity,
        "status_id": 1 if decision == "allow" else 2,
        "status": "Success" if decision == "allow" else "Failure",
        "status_code": str(event.get("reason")),
        "action_id": 1 if passed else 2,
        "action": "Allowed" if passed else "Denied",
        "disposition_id": 1 if passed else 2,
        "disposition": "Allowed" if passed else "Blocked",
        "metadata": _metadata(event),
        "http_request": _request(event, activity_id),
        "dst_endpoint": _destination(event),
        "unmapped": {k: event[k] for k in _UNMAPPED if k in event},
    }
    if event.get("message"):
        out["message"] = out["status_detail"] = event["message"]
    if event.get("rule"):
        out["firewall_rule"] = {"name": event["rule"], "uid": event["rule"]}
    if event.get("pool"):
        out["policy"] = {"name": event["pool"], "uid": event["pool"]}
    source = _source(event)
    if source:
        out["src_endpoint"] = source
    if isinstance(event.get("status"), int):
        out["http_response"] = {"code": event["status"], "length": int(event.get("bytes_in") or 0)}
    return out


def _metadata(event: Mapping[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "version": VERSION,
        "product": {"name": "surrogate", "vendor_name": "surrogate"},
        "profiles": PROFILES,
        "log_name": "audit",
    }
    if event.get("request_id"):
        meta["uid"] = str(event["request_id"])
    if isinstance(event.get("seq"), int):
        meta["sequence"] = event["seq"]
    return meta


def _request(event: Mapping[str, Any], activity_id: int) -> dict[str, Any]:
    url: dict[str, Any] = {"hostname": event.get("host"), "port": event.get("port")}
    if event.get("scheme"):
        url["scheme"] = event["scheme"]
    target = event.get("path")
    if isinstance(target, str) and "scheme" in url:
        path, _, query = target.partition("?")
        url["path"] = path
        if query:
            url["query_string"] = query
    host = str(event.get("host"))
    authority = f"[{host}]:{event.get('port')}" if ":" in host else f"{host}:{event.get('port')}"
    # the request target as the proxy saw it: the authority of a CONNECT (RFC 9110 section 9.3.6)
    url["url_string"] = f"{url['scheme']}://{authority}{target}" if "path" in url else authority
    request: dict[str, Any] = {"url": {k: v for k, v in url.items() if v is not None}}
    if activity_id != _OTHER[0]:
        request["http_method"] = event.get("method")
    if event.get("request_id"):
        request["uid"] = str(event["request_id"])
    if event.get("event") == "request":
        request["length"] = int(event.get("bytes_out") or 0)
    return request


def _destination(event: Mapping[str, Any]) -> dict[str, Any]:
    host = str(event.get("host") or "")
    out: dict[str, Any] = {"port": event.get("port")} if event.get("port") else {}
    try:
        out["ip"] = str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        out["hostname"] = host
    return out


def _source(event: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    client = event.get("client")
    if isinstance(client, str) and ":" in client:
        ip, _, port = client.rpartition(":")
        with contextlib.suppress(ValueError):
            out["ip"] = str(ipaddress.ip_address(ip))
        if port.isdigit():
            out["port"] = int(port)
    if event.get("claim"):
        out["uid"] = str(event["claim"])
    return out
