"""A model file and a GPU, no server needed: the GGUF readers, the VRAM budget and the decode
roofline (ceiling)."""
