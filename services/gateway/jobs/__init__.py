"""Bulk jobs over HTTP: POST/GET/DELETE /v1/jobs and GET /v1/jobs/{id}/results — the routes' work (serving.py,
typed against its ``JobsHost``), the jobs' manager (api.py), the typed submission (body.py) and answers (answers.py), listing, owners, token charges, result streaming (results.py,
parquet.py), files on the server (files.py), writes into vector stores (sinks.py) and job metrics (metrics.py)."""
