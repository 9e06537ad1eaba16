"""Sluice: the product's public face.

- `sluice.server`: the composition root (builds the store, the core and the protocol adapters)
  and the broker's configuration.
- `sluice.cli`: the `sluice` command, one module per command family.
- `sluice.client`: the Python SDK for the native protocol (`from sluice.client import Producer`).
"""
