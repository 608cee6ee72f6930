"""The preview an operator sees of a held request (issue 16): its head and, when it was read, its
body, redacted. Pure: no I/O, no clock.

Shape: the request line, one ``Name: value`` line per header field, and, when there is a body,
a blank line and the body:

- read (a declared ``Content-Length`` of at most :data:`BODY_BOUND` bytes: ``addons/approve.py``
  reads such a body before it asks): the body as text, when it is UTF-8 without control
  characters (tab, CR and LF are text); otherwise ``[body: N bytes, not text]``; in a
  ``Content-Encoding`` other than identity, ``[body: N bytes, content-encoding gzip]`` (it is not
  decoded for a person to read);
- not read (larger, chunked, or HTTP/2 without a length; held before its body is read, so the
  client is back-pressured): ``[body not read: N bytes]`` or ``[body not read: length not
  declared]``.

Head and body are each passed through ``scrub`` (the claim's live secrets → their placeholders,
:class:`proxy.core.scrub.Scrubber`) before anything is decided about them: placeholders stay
placeholders, a secret is never in a preview. The whole is cut at :data:`MAX_PREVIEW` characters
(the store's bound), with ``[… cut]`` at the end when it was.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

BODY_BOUND = 64 * 1024  # bytes: a body declared this long or shorter is read for its preview
MAX_PREVIEW = 64 * 1024  # characters: the store's bound on a preview
_CUT = "\n[… cut]"
_TEXT_CONTROLS = frozenset("\t\r\n")


def reads_body(content_length: str | None) -> bool:
    """Whether a held request's body is read for its preview before it asks: a declared
    ``Content-Length`` from 1 to :data:`BODY_BOUND` (a malformed one is not read)."""
    if content_length is None or not (content_length.isascii() and content_length.isdigit()):
        return False
    return 0 < int(content_length) <= BODY_BOUND


def _body(body: bytes | None, length: str | None, undeclared: bool, encoding: str,
          scrub: Callable[[bytes], bytes]) -> str | None:  # fmt: skip
    if body is None:
        if length is not None and length.isascii() and length.isdigit():
            return None if int(length) == 0 else f"[body not read: {int(length)} bytes]"
        return "[body not read: length not declared]" if undeclared else None
    if not body:
        return None
    if encoding not in ("", "identity"):
        return f"[body: {len(body)} bytes, content-encoding {encoding}]"
    try:
        text = scrub(body).decode("utf-8")
    except UnicodeDecodeError:
        return f"[body: {len(body)} bytes, not text]"
    if any((c < " " and c not in _TEXT_CONTROLS) or c == "\x7f" for c in text):
        return f"[body: {len(body)} bytes, not text]"
    return text


def preview(
    request_line: str,
    fields: Sequence[tuple[str, str]],
    body: bytes | None,
    scrub: Callable[[bytes], bytes],
    *,
    undeclared: bool = False,
) -> str:
    """The redacted preview (module docstring). ``body`` None: not read; the ``Content-Length``
    among ``fields`` says how long it is, and ``undeclared`` that one may follow without a
    declared length (HTTP/1 chunked, HTTP/2 without ``Content-Length``)."""
    head = "\n".join([request_line, *(f"{k}: {v}" for k, v in fields)])
    text = scrub(head.encode("utf-8", "surrogateescape")).decode("utf-8", "replace")
    length = next((v for k, v in fields if k.lower() == "content-length"), None)
    encoding = next((v for k, v in fields if k.lower() == "content-encoding"), "").strip().lower()
    shown = _body(body, length, undeclared, encoding, scrub)
    if shown is not None:
        text += "\n\n" + shown
    if len(text) > MAX_PREVIEW:
        text = text[: MAX_PREVIEW - len(_CUT)] + _CUT
    return text
