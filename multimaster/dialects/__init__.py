"""One module per database dialect; see base.py for the contract."""

from multimaster.dialects.base import Capabilities, Dialect, get_dialect, templates_dir

__all__ = ["Capabilities", "Dialect", "get_dialect", "templates_dir"]
