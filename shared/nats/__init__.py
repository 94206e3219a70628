"""The fabric: connecting to NATS and a service's lifecycle on it, subjects and each role's permissions,
credentials and TLS, the fleet view (who serves what), the NATS-direct embed client and its bundles, and
the embedded nats-server that `embedfleet up` runs. ``import nats`` here is still nats-py."""
