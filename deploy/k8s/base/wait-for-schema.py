"""Init container of the gateway: wait until the database schema is the one this image needs.

The `tiergate-migrate` Job migrates; gateways started before it finished would each try to
migrate too (``tiergate serve`` does at start) and race one another. So a gateway pod starts
only once the schema is at this image's head; during an upgrade, new pods wait here for the
Job while the old ones keep serving. ``--attempts N`` gives up after N checks (exit 1).
"""

from __future__ import annotations

import argparse
import sys
import time

from gateway.db.migrate import current_revisions, head_revisions

INTERVAL_S = 3.0


def at_head() -> bool:
    """Whether the configured database (TIERGATE_DATABASE_URL) is migrated to head; says why
    not on stdout (never the URL: it holds the password)."""
    try:
        current = set(current_revisions())
    except Exception as exc:  # unreachable, refused, not yet created: keep waiting
        print(f"waiting for the database: {type(exc).__name__}", flush=True)
        return False
    heads = set(head_revisions())
    if current == heads:
        return True
    shown = ", ".join(sorted(current)) or "not migrated"
    print(f"waiting for tiergate-migrate: schema at {shown}, need {', '.join(heads)}", flush=True)
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=0, help="give up after N (0: never)")
    args = parser.parse_args()
    attempt = 0
    while not at_head():
        attempt += 1
        if args.attempts and attempt >= args.attempts:
            return 1
        time.sleep(INTERVAL_S)
    print("database schema at head", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
