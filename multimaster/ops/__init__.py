"""Operations: the daemon, purge, install, add/remove site, grants, metrics, the demo, recorded verify runs."""
