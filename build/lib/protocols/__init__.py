"""Protocol adapters (sans-IO codecs, asyncio edges, mapping onto core) and the `sluice` CLI."""
