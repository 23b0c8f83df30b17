"""The CPU test bed: the cached llama-server build, synthetic GGUF models and the demo."""
