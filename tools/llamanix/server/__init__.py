"""One llama-server: the HTTP client, the server process, readiness, its /metrics, its slots,
draining it, and what its log says."""
