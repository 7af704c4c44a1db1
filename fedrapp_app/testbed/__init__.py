"""The offline testbed: a procedural image-text world and a small CLIP pretrained on it."""
