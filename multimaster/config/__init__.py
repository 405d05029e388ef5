"""Configuration: the topology file (pydantic models, link expansion, cron parsing). Imports nothing
of multimaster but errors."""
