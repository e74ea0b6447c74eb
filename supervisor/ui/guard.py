"""What keeps other web pages from using the UI: the Host check on every request, and the
cross-site checks on every POST (the only requests that change anything).

- Host: a page on another site can make the browser send requests to 127.0.0.1 by making its
  own name resolve there (DNS rebinding); such requests carry that site's name as their Host.
  Bound to a loopback address, the UI answers only requests whose Host is a loopback name, so a
  rebound page can neither read the ledger nor fetch a form's token. Bound to a named address,
  it answers that name and the loopback names; bound to every address (0.0.0.0, ::), any Host:
  who reaches it then is the network's business, and the POST checks still hold.
- Framing: no page may frame the UI's pages (`HEADERS`), so none can trick a click on a
  confirmation's button.
- POST: the form's `csrf_token` must be this process's token (random, made at start, never
  stored), which only a page served by this UI holds; and the request's `Origin` (or, without
  one, its `Referer`) must be this UI's own origin, and `Sec-Fetch-Site`, when sent, not
  `cross-site`.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Optional
from urllib.parse import urlsplit

# On every answer. Clickjacking: a page elsewhere may frame the confirmation page (its Host,
# 127.0.0.1, is allowed) and trick a click on its button, whose POST would then be same-origin
# and carry the token; no page may frame the UI. The rest: load nothing from anywhere else (the
# CSS is inline, the timeline inline SVG), post forms only to the UI, keep URLs (ids) in it.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self';"
                               " form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
EVERY_ADDRESS = frozenset({"0.0.0.0", "::", ""})


def new_token() -> str:
    """A per-process CSRF token: 32 random bytes, URL-safe."""
    return secrets.token_urlsafe(32)


def hosts_for(bind_host: str) -> Optional[frozenset[str]]:
    """The Host names a UI bound to `bind_host` answers (None: any)."""
    if bind_host in EVERY_ADDRESS:
        return None
    return LOOPBACK_NAMES | {bind_host.strip("[]").lower()}


def host_name(host_header: str) -> str:
    """The name in a Host header, without its port or an IPv6 literal's brackets, lower case."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def host_allowed(host_header: Optional[str], allowed: Optional[frozenset[str]]) -> bool:
    if allowed is None:
        return True
    return bool(host_header) and host_name(host_header) in allowed


def post_refusal(headers, form_token: Optional[str], token: str, scheme: str) -> Optional[str]:
    """Why a POST is refused (None: it is not): a missing or wrong token, or a cross-site origin.

    Args:
        headers: the request's headers (case-insensitive mapping).
        form_token: the `csrf_token` field the form sent.
        token: this process's token.
        scheme: the request's scheme, for its own origin.
    """
    if not form_token or not hmac.compare_digest(form_token.encode(), token.encode()):
        return "the form's token is missing or not this UI's: open the page again and confirm there"
    if headers.get("sec-fetch-site", "").lower() == "cross-site":
        return "the request came from another site"
    own = f"{scheme}://{headers.get('host', '')}".lower()
    origin = headers.get("origin")
    if origin is not None:
        if origin.lower() != own:
            return f"the request came from {origin}, not from this UI ({own})"
        return None
    referer = headers.get("referer")
    if referer is not None:
        parts = urlsplit(referer)
        if f"{parts.scheme}://{parts.netloc}".lower() != own:
            return "the request came from another page than this UI's"
    return None
