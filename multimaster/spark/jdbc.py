"""SQLAlchemy URL -> JDBC URL + properties, JDBC jar discovery.

What differs between databases (driver, jar, URL form, read types, where multimaster's objects
live, quoting) is declared by each dialect (``Dialect.jdbc`` and the section next to it in
multimaster/dialects/); this module only reads it.

No pyspark import here: this module is used to check the environment before a JVM starts.
Passwords go into the properties dict only, never into the JDBC URL or any message.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from sqlalchemy.engine import make_url

from multimaster.config.topology import hidden_url
from multimaster.dialects import Dialect, get_dialect
from multimaster.errors import ConfigError

__all__ = ["JdbcSource", "jdbc_source", "find_jars", "dialect_of", "MissingDependency"]

JAR_DIR = Path("/usr/share/java")
INSTALL_HINT = (
    "apt-get install -y {packages} (or run scripts/install-jdbc.sh), or point MM_JDBC_JARS at the jar files (colon-separated)"
)
#: SQLAlchemy URL query parameters that belong to the Python driver, not to the JDBC one
_PYTHON_DRIVER_PARAMS = ("charset", "client_encoding", "options")


class MissingDependency(Exception):
    """Java, PySpark or a JDBC jar is missing. The message says exactly what to install."""

    exit_code = 2


def dialect_of(url: str) -> Dialect:
    """The dialect of a site's SQLAlchemy URL, if verify can read it (else MissingDependency)."""
    try:
        d = get_dialect(make_url(url).get_backend_name())
    except ConfigError as e:
        raise MissingDependency(f"verify cannot read '{hidden_url(url)}': {e.problems[0]}") from None
    if d.jdbc is None:
        raise MissingDependency(f"verify cannot read '{hidden_url(url)}': no JDBC driver is known for {d.name}")
    return d


def _jdbc(d: Dialect) -> Dialect.Jdbc:
    assert d.jdbc is not None  # dialect_of refused the others
    return d.jdbc


@dataclass
class JdbcSource:
    site: str
    dialect: Dialect
    url: str  # JDBC URL, never holds the password
    properties: dict[str, str] = field(default_factory=dict)

    @property
    def jdbc(self) -> Dialect.Jdbc:
        return _jdbc(self.dialect)

    @property
    def mm_schema(self) -> str | None:
        """Where multimaster's objects live (PostgreSQL: schema _mm), None: next to the tables."""
        return self.dialect.caps.bookkeeping_schema

    def mm(self, name: str) -> str:
        """Qualified, quoted name of a multimaster object."""
        return self.dialect.mm_name(name)

    def user(self, name: str) -> str:
        return self.dialect.quote(name)

    def safe(self) -> dict[str, object]:
        return {
            "site": self.site,
            "url": self.url,
            "properties": {k: ("***" if "password" in k.lower() else v) for k, v in self.properties.items()},
        }


def jdbc_source(site: str, sa_url: str, fetchsize: int = 10_000) -> JdbcSource:
    """Turn a site's SQLAlchemy URL into a JDBC URL plus properties for Spark's JDBC source."""
    u = make_url(sa_url)
    d = dialect_of(sa_url)
    j = _jdbc(d)
    props: dict[str, str] = {"driver": j.driver, "fetchsize": str(fetchsize)}
    if j.default_port is None:  # a file
        db = d.database_file(sa_url)
        if db is None:
            raise MissingDependency(
                f"site '{site}': Spark reads a {d.name} site from its database file, and "
                f"'{hidden_url(sa_url)}' names none (an in-memory database cannot be read)"
            )
        return JdbcSource(site, d, f"{j.scheme}:{os.path.abspath(db)}", props)
    url = f"{j.scheme}://{u.host or 'localhost'}:{u.port or j.default_port}/{u.database or ''}"
    if u.username:
        props["user"] = u.username
    if u.password is not None:
        props["password"] = str(u.password)
    for k, v in u.query.items():
        if isinstance(v, tuple):
            v = v[-1]
        if k in _PYTHON_DRIVER_PARAMS:
            continue
        props[k] = str(v)
    return JdbcSource(site, d, url, props)


def find_jars(dialects: Iterable[str | Dialect], extra: list[str] | None = None) -> list[str]:
    """Jar paths for the given dialects (names or objects). MM_JDBC_JARS (colon-separated) or
    `extra` override the default /usr/share/java locations; raises MissingDependency naming the
    package to install."""
    override = [p for p in os.environ.get("MM_JDBC_JARS", "").split(os.pathsep) if p] + list(extra or [])
    jars: list[str] = []
    missing: list[str] = []
    specs = {d.name: _jdbc(d) for d in (x if isinstance(x, Dialect) else get_dialect(x) for x in dialects)}
    for _name, j in sorted(specs.items()):
        stem = j.jar.split(".jar")[0].split("-jdbc")[0].split("-java")[0]
        hit = [p for p in override if Path(p).name.startswith(stem) or stem in Path(p).name]
        if hit:
            for p in hit:
                if not Path(p).exists():
                    missing.append(f"{p} (from MM_JDBC_JARS) does not exist")
            jars += hit
            continue
        default = JAR_DIR / j.jar
        if default.exists():
            jars.append(str(default))
        else:
            missing.append(f"{default} (Debian package {j.package})")
    if missing:
        packages = " ".join(j.package for _n, j in sorted(specs.items()))
        raise MissingDependency(
            "missing JDBC driver jar(s): " + "; ".join(missing) + ". Install with: " + INSTALL_HINT.format(packages=packages)
        )
    # keep any override jar not matched to a dialect too (e.g. a newer driver of another name)
    for p in override:
        if p not in jars and Path(p).exists():
            jars.append(p)
    return list(dict.fromkeys(jars))
