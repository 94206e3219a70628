"""Vector stores a re-index job's rows can go to besides files (``reindex --sink URL``)."""
