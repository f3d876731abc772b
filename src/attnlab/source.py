"""Show a library object's source in place, highlighted and collapsed, beside the code a
chapter builds by hand (the teaching pattern's step 5: "the library's version").

``show_source(scaled_dot_product_attention)`` displays a ``<details>`` block whose summary
names the object and its file; opening it shows the source with line numbers. The colours
are inline styles on a light plate of their own, so the block reads the same in JupyterLab,
Colab, the static book and the book's dark mode, with no stylesheet to load.
"""
from __future__ import annotations

import html
import inspect
import re
from pathlib import Path

STYLE = "friendly"  # a light pygments style; the plate keeps it light in dark mode too
PLATE = ("background:#f8f8f8;color:#1f1f1f;border:1px solid #d0d7de;border-radius:6px;"
         "padding:.4em .8em;margin:.4em 0;font-size:.85em;overflow-x:auto")
PRE = "background:transparent;color:#1f1f1f;margin:0;padding:0;border:0;box-shadow:none"
LINENOS = "color:#666;padding:0 .8em 0 .3em;user-select:none"
CSS_CLASS = "attnlab-source-code"
RULE = re.compile(r"^\.attnlab-source-code \.(\w+) \{[^}]*\}", re.M)
UNSTYLED = re.compile(r'<span class="(\w+)">([^<]*)</span>')
TOKEN_CLASS = re.compile(r'<span class="(\w+)">')


class Source:
    """The source of one object, displayed as highlighted, collapsed HTML (text in a terminal)."""

    def __init__(self, obj, *, open: bool = False):
        try:
            lines, first = inspect.getsourcelines(obj)
        except (TypeError, OSError) as exc:
            raise TypeError(f"show_source: no Python source for {obj!r} ({exc})") from None
        self.code = "".join(lines)
        self.first_line = first
        module = inspect.getmodule(obj)
        self.name = f"{module.__name__}.{obj.__qualname__}" if module else obj.__qualname__
        self.file = Path(inspect.getsourcefile(obj)).name
        self.open = open

    def _repr_html_(self) -> str:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer

        # Its own class, so the book theme's dark code colours stay out; one short class per
        # token and a <style> holding only the rules this block uses (inline styles on every
        # token made a page's source blocks three times larger).
        formatter = HtmlFormatter(style=STYLE, linenos="inline", linenostart=self.first_line,
                                  nobackground=True, cssclass=CSS_CLASS, prestyles=PRE)
        body = highlight(self.code, PythonLexer(), formatter)
        rules = {m[1]: m[0] for m in RULE.finditer(formatter.get_style_defs(f".{CSS_CLASS}"))
                 if m[1] != "w"}                    # a colour on spaces shows nothing
        keep = set(rules) | {"linenos"}
        body = UNSTYLED.sub(lambda m: m[0] if m[1] in keep else m[2], body)
        used = sorted(set(TOKEN_CLASS.findall(body)) & set(rules))
        css = " ".join(rules[c] for c in used) + f" .{CSS_CLASS} .linenos {{{LINENOS}}}"
        summary = (f"The library's version: <code>{html.escape(self.name)}</code> "
                   f"(<code>{html.escape(self.file)}</code>, line {self.first_line})")
        return (f'<details class="attnlab-source"{" open" if self.open else ""}>'
                f'<summary>{summary}</summary><style>{css}</style>'
                f'<div style="{PLATE}">{body}</div></details>')

    def __repr__(self) -> str:
        return f"# {self.name} ({self.file}, line {self.first_line})\n{self.code}"


def show_source(obj, *, open: bool = False) -> Source:
    """Return the highlighted source of ``obj`` (a function, class or method) for display.

    Used as the last expression of a cell, or with ``IPython.display.display``. The block
    is collapsed unless ``open=True``.
    """
    return Source(obj, open=open)
