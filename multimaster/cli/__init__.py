"""The `multimaster` command: a thin Typer shell over multimaster.api.

Exit codes (docs/cli.md): 0 success; 1 an operation failed (a link could not refresh, a check found
a difference); 2 bad input (topology file, schema, base rows) — nothing was changed.

The commands live in modules of this package, each importing only cli.common and the layers
below: commands (init, refresh, status ...), ops (run, purge, add-site ...), grants, errors, keys,
freshness (token, wait), agent (serve), verify.
"""

from __future__ import annotations

from multimaster.cli import agent as _agent
from multimaster.cli import commands as _commands  # noqa: F401 - registers the core commands on app
from multimaster.cli import errors as _errors
from multimaster.cli import freshness as _freshness
from multimaster.cli import grants as _grants
from multimaster.cli import keys as _keys
from multimaster.cli import ops as _ops
from multimaster.cli.common import app
from multimaster.cli.verify import verify_command  # PySpark itself is imported lazily inside

__all__ = ["app", "main"]

_ops.register(app)
_agent.register(app)
_grants.register(app)
_errors.register(app)
_keys.register(app)
_freshness.register(app)
app.command(name="verify")(verify_command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
