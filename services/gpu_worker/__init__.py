"""GPU worker: the engine (pure library, engine/) and its NATS adapter (scheduler + service)."""
