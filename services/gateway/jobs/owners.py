"""Who may see a job on a gateway with API keys: the key that made it (its digest is in the job's
state, shared/jobs/requests.py), and the operator keys (--operator-keys), which see every job. To any
other key a job is as if it did not exist (404). Without API keys every caller sees every job."""

from __future__ import annotations

from embedfleet.services.gateway.http.limits import current_key
from embedfleet.shared.jobs.requests import owner_digest
from embedfleet.shared.jobs.state import JobState


class JobOwners:
    def __init__(self, keys_on: bool, operator_keys: tuple[str, ...]) -> None:
        self._keys_on = keys_on
        self._operators = frozenset(owner_digest(k) for k in operator_keys)

    @property
    def private(self) -> bool:
        """Whether jobs belong to keys here (then ids are not shown to everyone, e.g. on /metrics)."""
        return self._keys_on

    def owner(self) -> str | None:
        """The digest of the key of the request being handled: the owner of a job it makes."""
        key = current_key()
        return owner_digest(key) if self._keys_on and key is not None else None

    def sees(self, state: JobState) -> bool:
        """Whether the request being handled may see the job recorded as ``state``; a job made without
        a key (reindex, a gateway without keys) is seen by the operator keys only."""
        return self.sees_owner(state.owner)

    def sees_owner(self, owner: str | None) -> bool:
        """Whether the request being handled may see a job whose owner's key digest is ``owner``."""
        if not self._keys_on:
            return True
        caller = self.owner()
        return caller is not None and (caller in self._operators or owner == caller)
