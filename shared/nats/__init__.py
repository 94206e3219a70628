"""The fabric: where and how to connect to NATS (config), connecting and a service's lifecycle on it,
subjects and inboxes, credentials and TLS, the fleet view (who serves what), the NATS-direct
embed client and its bundles, and the embedded nats-server that `embedfleet up` runs. ``import nats`` here is
still nats-py."""
