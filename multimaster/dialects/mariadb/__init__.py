"""``mariadb+pymysql://`` URLs: the same dialect as MySQL (see mysql.py)."""

from multimaster.dialects.mysql import DIALECT

__all__ = ["DIALECT"]
