"""One module per dashboard tab; each exposes ``render(ctx)``."""
