"""What a process tells about itself: log lines, trace context and spans, and its Prometheus endpoint."""
