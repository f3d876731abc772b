"""Build-time plugin for the static book (Sphinx + myst-nb). It never imports torch.

* ``PlotlyMimeRenderer`` (entry point group ``myst_nb.mime_renderers``): myst-nb drops
  plotly's ``application/vnd.plotly.v1+json`` outputs, so figures would vanish from the
  book; this renders each into a div and an inline script, with no CDN reference, its
  numbers rounded to what a plot can show (``_slim``).
* ``setup``: a Sphinx extension that copies the ``plotly.min.js`` shipped in the plotly
  wheel into ``_static/`` and adds it only to pages that have a figure, and drops scripts an
  offline page must not load (``_drop_thebe``, ``_drop_idle_widget_manager``), and turns
  links to the book's public address into relative ones (``_local_links``), and writes
  ``_static/attnlab-banks.js``, the list of every chapter's quiz question ids that the
  "Your progress" page counts against, and ``attnlab-questions.js``, their texts for the
  review page (``_write_banks``).
"""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

PLOTLY_MIME = "application/vnd.plotly.v1+json"
PLOTLY_JS = "plotly.min.js"
BANKS_JS = "attnlab-banks.js"
QUESTIONS_JS = "attnlab-questions.js"


def _slim(figure, digits: int = 5):
    """The figure's JSON with every float rounded to ``digits`` significant digits and every
    float64 binary array stored as float32: what a plot shows, in about 60% of the bytes
    (the notebook keeps full precision; only the page is lightened)."""
    import base64

    import numpy as np

    if isinstance(figure, float):
        return float(f"{figure:.{digits}g}")
    if isinstance(figure, list):
        return [_slim(v, digits) for v in figure]
    if isinstance(figure, dict):
        if figure.get("dtype") == "f8" and isinstance(figure.get("bdata"), str):
            values = np.frombuffer(base64.b64decode(figure["bdata"]), dtype="<f8").astype("<f4")
            return {**figure, "dtype": "f4", "bdata": base64.b64encode(values.tobytes()).decode()}
        return {k: _slim(v, digits) for k, v in figure.items()}
    return figure


class PlotlyMimeRenderer:
    # (builder, mime type, priority): lower is preferred; text/html is 30.
    mime_priority_overrides = [(b, PLOTLY_MIME, 5) for b in ("html", "dirhtml", "singlehtml")]

    @staticmethod
    def handle_mime(renderer, data, inline):
        if inline or data.mime_type != PLOTLY_MIME:
            return None
        import plotly.io as pio
        from docutils import nodes

        html = pio.to_html(
            _slim(data.content), include_plotlyjs=False, include_mathjax=False, full_html=False,
            default_width="100%", default_height=480, validate=False,
            config={"displaylogo": False},
        )
        return [nodes.raw("", html, format="html", classes=["output", "text_html"])]


def _add_plotly_js(app, pagename, templatename, context, doctree):
    if doctree is not None and "plotly-graph-div" in context.get("body", ""):
        app.add_js_file(PLOTLY_JS, priority=200)


def _copy_plotly_js(app, exc):
    if exc is None and app.builder.format == "html":
        import plotly

        src = Path(plotly.__file__).parent / "package_data" / PLOTLY_JS
        shutil.copyfile(src, Path(app.outdir) / "_static" / PLOTLY_JS)


def _is_thebe(script) -> bool:
    body = (getattr(script, "attributes", None) or {}).get("body") or ""
    return "THEBE_JS_URL" in body or str(getattr(script, "filename", script)).endswith("sphinx-thebe.js")


def _drop_thebe(app, pagename, templatename, context, doctree):
    """Remove sphinx-thebe's scripts (a Jupyter Book default).

    Thebe runs code on a live Jupyter server, which an offline static book has not; and
    sphinx-thebe 0.3.1 adds its inline config twice, a page error in every browser
    ("Identifier 'THEBE_JS_URL' has already been declared").
    """
    context["script_files"] = [s for s in context.get("script_files", []) if not _is_thebe(s)]


def _drop_idle_widget_manager(app, pagename, templatename, context, doctree):
    """Load the 1.9 MB widget manager only on pages that show a widget.

    myst-nb adds it to every page of a notebook that stored widget state, even when every
    widget output was removed from the page (our live-only cells are tagged remove-output).
    """
    if "widget-view+json" not in context.get("body", ""):
        context["script_files"] = [s for s in context.get("script_files", [])
                                   if not str(getattr(s, "filename", s)).endswith("html-manager/embed.js")]


def _local_links(app, pagename, templatename, context, doctree):
    """Make links to the book's own public address (``html_baseurl``) relative.

    Notebooks link to the errata and to other chapters by absolute address, so the links
    work in Colab and JupyterLab, where a relative path to an HTML page leads nowhere; in the
    built book the same links must stay inside the site, which may be opened offline.
    """
    base = (app.config.html_baseurl or "").rstrip("/") + "/"
    if base != "/" and "body" in context:
        up = "../" * pagename.count("/")
        context["body"] = context["body"].replace(f'href="{base}', f'href="{up}')


def _write_banks(app, exc):
    """``window.ATTNLAB_BANKS``: one entry per chapter with a quiz (bank name, page title, page
    address, question ids), and ``window.ATTNLAB_QUESTIONS`` (id -> question text), as classic
    scripts so the progress and review pages work from file:// too. The banks are read as
    files: importing attnlab would import torch."""
    if exc is not None or app.builder.format != "html":
        return
    package = Path(importlib.util.find_spec("attnlab").submodule_search_locations[0])
    banks, texts = [], {}      # texts: the questions, for the review page only (it loads them)
    for docname in app.env.found_docs:
        bank = package / "quizzes" / f"{Path(docname).name}.json"
        if docname.startswith("notebooks/") and bank.is_file():
            questions = json.loads(bank.read_text(encoding="utf-8"))
            title = app.env.titles[docname].astext() if docname in app.env.titles else docname
            banks.append({"bank": bank.stem, "title": title, "ids": [q["id"] for q in questions],
                          "url": app.builder.get_target_uri(docname)})
            texts.update({q["id"]: q["question"] for q in questions})
    banks.sort(key=lambda b: b["bank"])
    static = Path(app.outdir) / "_static"
    for name, variable, value in ((BANKS_JS, "ATTNLAB_BANKS", banks),
                                  (QUESTIONS_JS, "ATTNLAB_QUESTIONS", texts)):
        text = f"window.{variable} = {json.dumps(value, ensure_ascii=False)};\n"
        (static / name).write_text(text, encoding="utf-8")


def setup(app):
    app.add_js_file(BANKS_JS)
    app.connect("html-page-context", _local_links)
    app.connect("html-page-context", _add_plotly_js)
    app.connect("html-page-context", _drop_thebe, priority=900)  # after every script is added
    app.connect("html-page-context", _drop_idle_widget_manager, priority=900)
    app.connect("build-finished", _copy_plotly_js)
    app.connect("build-finished", _write_banks)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
