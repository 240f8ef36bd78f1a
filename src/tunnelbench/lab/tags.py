"""Per-run name prefixes: every namespace, interface and nft table a run makes carries its tag, and its run id
ends with it; `clean` and the SSH undo delete such a name only when it carries the tag of the run whose journal
names it (`carries_tag`)."""

from __future__ import annotations

import datetime as dt
import re
import secrets

TAG_PREFIX = "tb"
TAG = re.compile(TAG_PREFIX + r"[0-9a-f]{4}")  # what new_tag makes
# what new_run_id makes (`tunnelbench up` puts "up-" before it)
RUN_ID = re.compile(r"(?:up-)?\d{8}-\d{6}-(" + TAG.pattern + ")")


def new_tag() -> str:
    # 6 chars leaves 9 for suffixes within the 15-char interface name limit
    return TAG_PREFIX + secrets.token_hex(2)


def new_run_id(tag: str) -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S") + "-" + tag


def tag_of(run_id: str) -> str | None:
    """The tag a run id ends with; None when the id is not one tunnelbench makes (then no name is the run's)."""
    m = RUN_ID.fullmatch(run_id)
    return m.group(1) if m else None


def carries_tag(name: str, tag: str | None) -> bool:
    """Whether a namespace, interface or nft table name is the run's: it starts with the run's tag. A missing,
    empty or malformed tag carries nothing (an empty prefix would match every name on the machine)."""
    return tag is not None and TAG.fullmatch(tag) is not None and name.startswith(tag)
