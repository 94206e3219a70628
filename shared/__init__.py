"""Library shared by every embedfleet service and command: the wire protocol (protocol/), the fabric
(nats/), bulk jobs (jobs/), options (config/), model folders (model_dir/), vector stores (sinks/), vector
forms (vectors/), logs, traces and metrics (observability/); and at the top what spans them: each role's
NATS permissions (permissions.py, over nats/ and jobs/), the error codes, the extras, text chunks."""

__version__ = "0.1.0"

if __name__ != "embedfleet.shared":  # the folder on sys.path (the repository's root), not the package
    raise ImportError(f"{__name__}: the project's modules are imported as embedfleet.shared.*, never as shared.*")
