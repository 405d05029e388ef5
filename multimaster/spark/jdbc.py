"""SQLAlchemy URL -> JDBC URL + properties, JDBC jar discovery, per-dialect SQL fragments.

No pyspark import here: this module is used to check the environment before a JVM starts.
Passwords go into the properties dict only, never into the JDBC URL or any message.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import make_url

from multimaster.config.topology import hidden_url

__all__ = ["JdbcSource", "jdbc_source", "find_jars", "JARS", "dialect_of", "MissingDependency", "quote"]

# dialect -> (jar file name, driver class, Debian package)
JARS = {
    "sqlite": ("sqlite-jdbc.jar", "org.sqlite.JDBC", "libxerial-sqlite-jdbc-java"),
    "postgresql": ("postgresql.jar", "org.postgresql.Driver", "libpostgresql-jdbc-java"),
    "mysql": ("mariadb-java-client.jar", "org.mariadb.jdbc.Driver", "libmariadb-java"),
}
JAR_DIR = Path("/usr/share/java")
INSTALL_HINT = (
    "apt-get install -y libpostgresql-jdbc-java libmariadb-java libxerial-sqlite-jdbc-java "
    "(or run scripts/install-jdbc.sh), or point MM_JDBC_JARS at the jar files (colon-separated)"
)


class MissingDependency(Exception):
    """Java, PySpark or a JDBC jar is missing. The message says exactly what to install."""

    exit_code = 2


def dialect_of(url: str) -> str:
    name = make_url(url).get_backend_name()
    if name in ("mysql", "mariadb"):
        return "mysql"
    if name in ("postgresql", "postgres"):
        return "postgresql"
    if name == "sqlite":
        return "sqlite"
    raise MissingDependency(f"verify cannot read '{hidden_url(url)}': only sqlite, postgresql and mysql/mariadb sites are supported")


def quote(dialect: str, name: str) -> str:
    if dialect == "mysql":
        return "`" + name.replace("`", "``") + "`"
    return '"' + name.replace('"', '""') + '"'


@dataclass
class JdbcSource:
    site: str
    dialect: str
    url: str  # JDBC URL, never holds the password
    properties: dict[str, str] = field(default_factory=dict)
    mm_schema: str | None = None  # PostgreSQL: the _mm schema prefix

    def mm(self, name: str) -> str:
        """Qualified, quoted name of a multimaster object (PostgreSQL keeps them in schema _mm)."""
        q = quote(self.dialect, name)
        return f"{quote(self.dialect, self.mm_schema)}.{q}" if self.mm_schema else q

    def user(self, name: str) -> str:
        return quote(self.dialect, name)

    def safe(self) -> dict[str, object]:
        return {"site": self.site, "url": self.url, "properties": {k: ("***" if "password" in k.lower() else v) for k, v in self.properties.items()}}


def jdbc_source(site: str, sa_url: str, fetchsize: int = 10_000) -> JdbcSource:
    """Turn a site's SQLAlchemy URL into a JDBC URL plus properties for Spark's JDBC source."""
    u = make_url(sa_url)
    d = dialect_of(sa_url)
    driver = JARS[d][1]
    props: dict[str, str] = {"driver": driver, "fetchsize": str(fetchsize)}
    if d == "sqlite":
        db = u.database
        if not db or db == ":memory:":
            raise MissingDependency(f"site '{site}': an in-memory SQLite database cannot be read by Spark")
        return JdbcSource(site, d, f"jdbc:sqlite:{os.path.abspath(db)}", props)
    host = u.host or "localhost"
    if d == "postgresql":
        port = u.port or 5432
        url = f"jdbc:postgresql://{host}:{port}/{u.database or ''}"
        mm_schema = "_mm"
    else:
        # MariaDB driver with a jdbc:mysql:// URL: Spark then picks its MySQL dialect (backticks).
        port = u.port or 3306
        url = f"jdbc:mysql://{host}:{port}/{u.database or ''}"
        mm_schema = None
    if u.username:
        props["user"] = u.username
    if u.password is not None:
        props["password"] = str(u.password)
    for k, v in u.query.items():
        if isinstance(v, tuple):
            v = v[-1]
        if k in ("charset", "client_encoding", "options"):
            continue
        props[k] = str(v)
    return JdbcSource(site, d, url, props, mm_schema)


def find_jars(dialects: set[str], extra: list[str] | None = None) -> list[str]:
    """Jar paths for the given dialects. MM_JDBC_JARS (colon-separated) or `extra` override the
    default /usr/share/java locations; raises MissingDependency naming the package to install."""
    override = [p for p in os.environ.get("MM_JDBC_JARS", "").split(os.pathsep) if p] + list(extra or [])
    jars: list[str] = []
    missing: list[str] = []
    for d in sorted(dialects):
        fname, _driver, pkg = JARS[d]
        stem = fname.split(".jar")[0].split("-jdbc")[0].split("-java")[0]
        hit = [p for p in override if Path(p).name.startswith(stem) or stem in Path(p).name]
        if hit:
            for p in hit:
                if not Path(p).exists():
                    missing.append(f"{p} (from MM_JDBC_JARS) does not exist")
            jars += hit
            continue
        default = JAR_DIR / fname
        if default.exists():
            jars.append(str(default))
        else:
            missing.append(f"{default} (Debian package {pkg})")
    if missing:
        raise MissingDependency("missing JDBC driver jar(s): " + "; ".join(missing) + ". Install with: " + INSTALL_HINT)
    # keep any override jar not matched to a dialect too (e.g. a newer driver of another name)
    for p in override:
        if p not in jars and Path(p).exists():
            jars.append(p)
    return list(dict.fromkeys(jars))
