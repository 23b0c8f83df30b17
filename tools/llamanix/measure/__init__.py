"""Talk to and measure a llama-server: the client, the server process, bench and its reports,
the decode ceiling, GGUF reading, doctor, smoke, the CUDA checks, server logs and metrics."""
