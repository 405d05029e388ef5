"""The sqlite dialect: its Python (dialect.py) and its SQL templates (*.sql) side by side."""

from multimaster.dialects.sqlite.dialect import DIALECT

__all__ = ["DIALECT"]
