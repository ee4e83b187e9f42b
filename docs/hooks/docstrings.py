"""mkdocs hook: the docstrings' Sphinx roles shown as plain code in the API reference.

moglm's docstrings name other objects the Sphinx way (``:class:`~moglm.modules.stack.RecurrentStack```), which
the API pages (mkdocstrings, markdown docstrings) would print with the role in front. This drops the role and
the ``~`` and keeps the code: ``RecurrentStack``'s full name, as code.
"""

from __future__ import annotations

import re

ROLE = re.compile(r":(?:py:)?(?:mod|class|func|meth|attr|data|exc|obj|const|ref|doc):(<code>)~?")


def on_page_content(html, page, config, files):
    if not page.file.src_uri.startswith("reference/api/"):
        return html
    return ROLE.sub(r"\1", html)
