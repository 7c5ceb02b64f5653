"""Command-line interface: ``hdecode`` / ``python -m hdecode_torch``."""
