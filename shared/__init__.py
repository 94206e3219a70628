"""Library shared by every embedfleet service: wire protocol, subjects, config, NATS lifecycle."""

__version__ = "0.1.0"

if __name__ != "embedfleet.shared":  # the folder on sys.path (the repository's root), not the package
    raise ImportError(f"{__name__}: the project's modules are imported as embedfleet.shared.*, never as shared.*")
