"""The options of single actions: `jobs purge --force`, `auth --force`, `check --json`."""

from __future__ import annotations

from embedfleet.shared.config.option import Option, declare

OPTIONS: tuple[Option, ...] = (
    declare(
        "--force", None, False, "purge a job that has not finished too", {"jobs purge"}, "jobs-action", kind="switch"
    ),
    declare("--force", None, False, "replace the seeds already in the folder", {"auth"}, "auth", kind="switch"),
    declare("--json", None, False, "one JSON object per folder", {"check"}, "check", kind="switch"),
)
