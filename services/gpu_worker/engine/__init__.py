"""The embedding engine: model definitions, packed forward, pooling. No NATS imports here."""

from embedfleet.services.gpu_worker.engine.engine import Engine

__all__ = ["Engine"]
