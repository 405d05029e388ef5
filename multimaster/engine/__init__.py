"""The engine: a site's connections, pull, reconcile, the set-based fast path, refresh orchestration."""
