"""Per-run name prefixes: every namespace, interface and nft table a run makes carries its tag."""

from __future__ import annotations

import datetime as dt
import secrets

TAG_PREFIX = "tb"


def new_tag() -> str:
    # 6 chars leaves 9 for suffixes within the 15-char interface name limit
    return TAG_PREFIX + secrets.token_hex(2)


def new_run_id(tag: str) -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S") + "-" + tag
