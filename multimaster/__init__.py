"""multimaster: update-anywhere asynchronous replication with triggers and snapshot logs."""

from .errors import ConfigError, MultimasterError, SchemaError
from .topology import Topology, load_topology

__version__ = "0.1.0"
__all__ = ["load_topology", "Topology", "MultimasterError", "ConfigError", "SchemaError", "__version__"]
