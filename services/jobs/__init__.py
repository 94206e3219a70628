"""The commands that drive bulk jobs (the code they drive is embedfleet.shared.jobs): ``embedfleet reindex``
(plan, files read and written, sinks, chunked documents), ``embedfleet jobs`` (list, status, cancel,
fetch) and ``embedfleet init`` (the job streams and bucket)."""
