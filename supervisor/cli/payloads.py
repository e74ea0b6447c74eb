"""Payloads as the command line prints them: cut short for people, whole for programs.

A payload may be megabytes of JSON (up to the ledger's `max_payload_bytes`). Text output is read
by a person on a terminal, so a long one is printed cut short, its first `SHOWN_CHARS`
characters then `… (N bytes; --full shows all)`, without being decoded: decoding a payload of a
few MB into Python objects, then encoding it again, made `yieldstar get` of a 4 MB input peak at
70 MB. `--json` output is read by programs and keeps every value whole; it too puts each
payload's stored text into the output as it is (it is valid JSON: the ledger checked it on the
way in) instead of decoding and encoding it again.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any, Optional

from ..ledger.arguments import utf8_size

# How much of a payload text output shows without --full: a screenful, enough to recognise it.
SHOWN_CHARS = 2000
# An error is shown as its lines (`Type: message`, then its traceback) up to this long: a deep
# traceback is often longer than SHOWN_CHARS, and cutting it would hide where it was raised.
ERROR_SHOWN_CHARS = 64 * 1024


def is_long(text: str, *, error: bool = False) -> bool:
    """Whether text output cuts `text` short (without --full): an error's JSON above
    ERROR_SHOWN_CHARS, any other payload above SHOWN_CHARS."""
    return len(text) > (ERROR_SHOWN_CHARS if error else SHOWN_CHARS)


def cut_short(text: str) -> str:
    """A long payload's first SHOWN_CHARS characters, and how long it is in all."""
    size = len(text) if text.isascii() else utf8_size(text)  # isascii copies nothing
    return f"{text[:SHOWN_CHARS]}… ({size:,} bytes; --full shows all)"


def shown(text: Optional[str], full: bool) -> str:
    """A payload's JSON text as text output shows it: in one spelling when short, cut short when
    long (unless `full`, then as stored)."""
    if text is None:
        return "null"
    if not is_long(text):
        return json.dumps(json.loads(text))
    return text if full else cut_short(text)


def json_object(record: Any, **extra: Any) -> str:
    """A value object as one JSON object, as `as_json` describes it (payload fields lose their
    `_json` suffix and hold the value), with each payload spliced in as stored, then `extra`."""
    fields: dict[str, str] = {}
    for key, value in asdict(record).items():
        if key.endswith("_json"):
            fields[key[: -len("_json")]] = "null" if value is None else value
        else:
            fields[key] = json.dumps(value)
    status = getattr(record, "status", None)
    if status is not None and "status" not in fields:
        fields["status"] = json.dumps(status)
    fields.update((key, json.dumps(value)) for key, value in extra.items())
    return "{" + ", ".join(f"{json.dumps(key)}: {text}" for key, text in fields.items()) + "}"
