"""llamanix: declarative llama.cpp variants served as hardened llama-server units."""

__version__ = "0.1.0"
