"""multimaster: update-anywhere asynchronous replication with triggers and snapshot logs."""

from multimaster.config.topology import Topology, load_topology
from multimaster.errors import ConfigError, MultimasterError, SchemaError

__version__ = "0.1.0"
__all__ = ["load_topology", "Topology", "MultimasterError", "ConfigError", "SchemaError", "__version__"]
