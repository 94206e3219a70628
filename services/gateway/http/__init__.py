"""What every HTTP route shares, below the API families: the uvicorn server and its limits on clients, the ASGI
middleware (request ids, auth, browser guard, admission, per-key limits, disconnects), the one error table, body
reading, Accept negotiation and binary formats, and GET /health."""
