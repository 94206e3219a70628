"""``embedfleet up``: one machine's whole stack — the plan of its processes (plan.py), the ports and the
data folder's lock it holds, the embedded nats-server and an optional local PostgreSQL with pgvector, and
the supervisor that starts each child and starts again whatever dies (launch.py, children.py)."""
