"""The broker process: configuration (`config`) and the composition root (`app`), the one place
that builds a store, a core and the protocol adapters."""
