"""Library shared by every embedfleet service: wire protocol, subjects, config, NATS lifecycle."""

__version__ = "0.1.0"
