"""URL conversion and jar discovery (no Spark needed)."""

import pytest

from multimaster.spark.jdbc import MissingDependency, find_jars, jdbc_source


def test_sqlite_url(tmp_path):
    s = jdbc_source("a", f"sqlite:///{tmp_path}/a.db")
    assert s.url == f"jdbc:sqlite:{tmp_path}/a.db"
    assert s.properties["driver"] == "org.sqlite.JDBC"


def test_postgres_url_keeps_password_out_of_url():
    s = jdbc_source("b", "postgresql+psycopg://bob:s3cret@db.example:6543/app?sslmode=require")
    assert s.url == "jdbc:postgresql://db.example:6543/app"
    assert "s3cret" not in s.url
    assert s.properties["password"] == "s3cret" and s.properties["user"] == "bob"
    assert s.properties["sslmode"] == "require" and s.properties["fetchsize"]
    assert "s3cret" not in repr(s.safe())
    assert s.mm("_mm_shadow_t") == '_mm."_mm_shadow_t"'


def test_mariadb_uses_mysql_scheme_and_mariadb_driver():
    s = jdbc_source("c", "mysql+pymysql://root@127.0.0.1/x")
    assert s.url == "jdbc:mysql://127.0.0.1:3306/x"
    assert s.properties["driver"] == "org.mariadb.jdbc.Driver"
    assert s.mm("_mm_shadow_t") == "`_mm_shadow_t`"
    assert jdbc_source("d", "mariadb+pymysql://u:p@h:3307/y").url == "jdbc:mysql://h:3307/y"


def test_missing_jar_names_the_package(monkeypatch, tmp_path):
    monkeypatch.setenv("MM_JDBC_JARS", str(tmp_path / "sqlite-jdbc.jar"))
    with pytest.raises(MissingDependency, match="does not exist"):
        find_jars({"sqlite"})
    monkeypatch.delenv("MM_JDBC_JARS")
    monkeypatch.setattr("multimaster.spark.jdbc.JAR_DIR", tmp_path)
    with pytest.raises(MissingDependency, match="libpostgresql-jdbc-java"):
        find_jars({"postgresql"})


def test_package_imports_without_pyspark_loaded():
    import subprocess
    import sys

    code = "import multimaster.spark, sys; assert 'pyspark' not in sys.modules, 'pyspark imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
