"""The `sluice` command: one module per command family, `main` builds the parser."""

from .main import main

__all__ = ["main"]
