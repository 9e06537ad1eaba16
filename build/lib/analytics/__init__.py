"""PySpark data source over the store reader or the native SDK, telemetry jobs and dashboard."""
