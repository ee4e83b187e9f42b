"""``moglm report``: markdown tables and PNG figures from run directories, beside the papers' numbers."""

from .markdown import write_report

__all__ = ["write_report"]
