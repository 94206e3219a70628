"""HTTP gateway (starlette + uvicorn): OpenAI-compatible API in front of the NATS fleet."""
