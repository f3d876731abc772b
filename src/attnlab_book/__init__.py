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

import html
import importlib.util
import json
import re
import shutil
from pathlib import Path

PLOTLY_MIME = "application/vnd.plotly.v1+json"
PLOTLY_JS = "plotly.min.js"
FIGURES_JS = "attnlab-figures.js"
BANKS_JS = "attnlab-banks.js"
QUESTIONS_JS = "attnlab-questions.js"


ARRAY_KEYS = {"x", "y", "z", "r", "theta", "color", "size", "array", "arrayminus", "base",
              "values", "width", "customdata"}   # data arrays plotly.js accepts as typed arrays
MIN_PACKED = 16   # shorter lists stay JSON: a typed array's header costs more than it saves


def _typed(values, min_size: int = MIN_PACKED):
    """A numeric array as plotly's typed-array spec ``{"dtype", "bdata", "shape"}`` in the
    smallest exact type: whole numbers as the narrowest integer type that holds them, other
    values as float32 (7 digits, beyond what a plot or its hover shows). None where the JSON
    list is as short, and for anything else (strings, ragged lists, short lists); gaps stay gaps (NaN)."""
    import base64

    import numpy as np

    try:                        # None (a gap) becomes NaN, which plotly.js also skips
        array = np.asarray(values, dtype=float) if isinstance(values, list) else np.asarray(values)
    except (TypeError, ValueError):     # strings, ragged lists
        return None
    if array.dtype.kind not in "biuf" or array.ndim not in (1, 2) or array.size < min_size:
        return None
    if array.dtype.kind == "f" and np.isinf(array).any():
        return None
    finite = array[np.isfinite(array)] if array.dtype.kind == "f" else array
    dtype = "f4"                # also whole numbers beyond int32: 7 digits, as any float here
    if finite.size == array.size and (finite == np.round(finite)).all():
        low, high = int(array.min()), int(array.max())
        dtype = next((t for t in ("u1", "i1", "u2", "i2", "u4", "i4")
                      if np.iinfo(t).min <= low and high <= np.iinfo(t).max), "f4")
    array = array.astype("<" + dtype)
    spec = {"dtype": dtype, "bdata": base64.b64encode(array.tobytes()).decode()}
    if array.ndim == 2:
        spec["shape"] = f"{array.shape[0]}, {array.shape[1]}"
    if isinstance(values, list) and len(json.dumps(values)) <= len(spec["bdata"]):
        return None             # small whole numbers and gaps are shorter as JSON ("0,1,null")
    return spec


def _decoded(spec):
    import base64

    import numpy as np

    array = np.frombuffer(base64.b64decode(spec["bdata"]), dtype="<" + spec["dtype"])
    if "shape" in spec:
        array = array.reshape([int(n) for n in str(spec["shape"]).split(",")])
    return array


def _round(value, digits: int, lists: bool = False):
    """Every float rounded to ``digits`` significant digits; every typed array re-stored in
    its smallest exact type (float64 becomes float32), or with ``lists`` written out as a
    JSON list of rounded numbers (text that deflates well)."""
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None         # JSON has no NaN: a gap, as plotly.py writes it
        value = float(f"{value:.{digits}g}")
        return int(value) if value.is_integer() and abs(value) < 1e15 else value   # "1", not "1.0"
    if isinstance(value, list):
        return [_round(v, digits, lists) for v in value]
    if isinstance(value, dict):
        if isinstance(value.get("bdata"), str) and isinstance(value.get("dtype"), str):
            if lists:
                array = _decoded(value)
                return _round(array.astype(float).tolist() if array.dtype.kind == "f"
                              else array.tolist(), digits, lists)
            return _typed(_decoded(value), min_size=1) or value
        return {k: _round(v, digits, lists) for k, v in value.items()}
    return value


def _pack_trace(trace):
    """A trace (or a nested attribute of one) with its long numeric lists as typed arrays."""
    out = {}
    for key, value in trace.items():
        if isinstance(value, dict) and "bdata" not in value:
            value = _pack_trace(value)
        elif key in ARRAY_KEYS and isinstance(value, list):
            value = _typed(value) or value
        out[key] = value
    return out


def _pack_restyle(update):
    """A restyle object of a slider step or button (``{"z": [one value per trace]}``): each
    trace's long numeric list as a typed array (plotly.js decodes them as it coerces)."""
    out = {}
    for key, value in update.items():
        if key.rsplit(".", 1)[-1] in ARRAY_KEYS and isinstance(value, list):
            value = [(_typed(v) or v) if isinstance(v, list) else v for v in value]
        out[key] = value
    return out


def _slim_template(layout, data):
    """Keep the template's per-trace defaults only for the trace types the figure draws."""
    template = layout.get("template")
    if isinstance(template, dict) and isinstance(template.get("data"), dict):
        types = {t.get("type", "scatter") for t in data}
        layout["template"] = {**template, "data": {k: v for k, v in template["data"].items()
                                                   if k in types}}


HEATMAP_DIGITS = 3   # decimal places kept below the largest value's leading digit: a step
                     # under 1/1000 of it, finer than any colour shows, and for weights in
                     # [0, 1] the 3 decimals the book's weight-map hovers print


def _quantised(z):
    """``z`` (a nested list, or a typed array) rounded to HEATMAP_DIGITS decimal places below
    its largest magnitude's leading digit, as nested lists: near-zero weights become 0, which
    deflates well."""
    import math

    import numpy as np

    if isinstance(z, dict) and "bdata" in z:
        z = _decoded(z).astype(float).tolist()
    try:
        array = np.asarray(z, dtype=float)
    except (TypeError, ValueError):
        return z
    finite = np.abs(array[np.isfinite(array)])
    if not finite.size or finite.max() == 0:
        return _round(z, 4, lists=True)
    decimals = HEATMAP_DIGITS - math.floor(math.log10(finite.max()))   # step 10^(−decimals)
    rounded = np.round(array, decimals)
    return [[None if v != v else (int(v) if v.is_integer() else v) for v in row]
            for row in rounded.tolist()] if array.ndim == 2 else _round(rounded.tolist(), 4, lists=True)


def _round_heatmaps(figure):
    """Heatmap values (also those a slider swaps in) quantised by ``_quantised``."""
    data = figure.get("data", [])
    heat = [i for i, t in enumerate(data) if t.get("type") == "heatmap"]
    if not heat:
        return figure
    data = [{**t, "z": _quantised(t["z"])} if i in heat and "z" in t else t
            for i, t in enumerate(data)]
    layout = dict(figure.get("layout", {}))
    sliders = []
    for slider in layout.get("sliders", []):
        steps = []
        for step in slider.get("steps", []):
            args = step.get("args")
            if isinstance(args, list) and args and isinstance(args[0], dict) and "z" in args[0]:
                z = args[0]["z"]        # one value per trace, or per traces listed in args[2]
                targets = args[2] if len(args) > 2 and isinstance(args[2], list) else range(len(data))
                if isinstance(z, list) and all(t in heat for t, v in zip(targets, z) if v is not None):
                    step = {**step, "args": [{**args[0], "z": [None if v is None else _quantised(v)
                                                               for v in z]}, *args[1:]]}
            steps.append(step)
        sliders.append({**slider, "steps": steps})
    if sliders:
        layout["sliders"] = sliders
    return {**figure, "data": data, "layout": layout}


def _slim(figure, digits: int = 5):
    """The figure's JSON as the page needs it: floats rounded to ``digits`` significant
    digits, numeric arrays (also those a slider or button swaps in) as typed arrays in their
    smallest exact type, the template's defaults only for trace types drawn. A plot shows
    the same in a fraction of the bytes; the notebook keeps full precision."""
    figure = _round(figure, digits)
    if not isinstance(figure, dict):
        return figure
    data = [_pack_trace(t) for t in figure.get("data", [])]
    layout = dict(figure.get("layout", {}))
    for menu_key, item_key in (("sliders", "steps"), ("updatemenus", "buttons")):
        menus = []
        for menu in layout.get(menu_key, []):
            items = []
            for item in menu.get(item_key, []):
                args = item.get("args")
                if isinstance(args, list) and args and isinstance(args[0], dict):
                    item = {**item, "args": [_pack_restyle(args[0]), *args[1:]]}
                items.append(item)
            menus.append({**menu, item_key: items})
        if menu_key in layout:
            layout[menu_key] = menus
    _slim_template(layout, data)
    frames = [{**f, "data": [_pack_trace(t) for t in f.get("data", [])]}
              for f in figure.get("frames", [])]
    return {**figure, "data": data, "layout": layout, **({"frames": frames} if frames else {})}


def _packed(text: str) -> str:
    """``text`` as UTF-8, raw-deflated and base64-encoded: what the book's scripts unpack with
    the browser's own ``DecompressionStream("deflate-raw")``."""
    import base64
    import zlib

    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    return base64.b64encode(packer.compress(text.encode()) + packer.flush()).decode()


def _deflated(figure) -> str:
    """The figure's JSON, packed (``attnlab-figures.js`` unpacks it)."""
    return _packed(json.dumps(figure, separators=(",", ":"), ensure_ascii=False))


class PlotlyMimeRenderer:
    # (builder, mime type, priority): lower is preferred; text/html is 30.
    mime_priority_overrides = [(b, PLOTLY_MIME, 5) for b in ("html", "dirhtml", "singlehtml")]

    @staticmethod
    def handle_mime(renderer, data, inline):
        """An empty figure div carrying the figure compressed in ``data-attnlab-figure``.

        The page ships the smaller of two encodings (typed arrays, or JSON at 4 significant
        digits; heatmap values to 1/1000 of their largest), deflated: masks and sliders that repeat themselves shrink tens of times.
        ``attnlab-figures.js`` unpacks and draws it with the site's plotly.js; nothing is
        fetched, so the figure, its hover and its kernel-free slider work on file:// too.
        """
        if inline or data.mime_type != PLOTLY_MIME:
            return None
        import uuid

        from docutils import nodes

        figure = _round_heatmaps(data.content)
        payload = min((_deflated(_slim(figure)), _deflated(_round(figure, 4, lists=True))), key=len)
        height = (data.content.get("layout") or {}).get("height") or 480
        html = (f'<div id="{uuid.uuid4()}" class="plotly-graph-div" style="height:{height}px; '
                f'width:100%;" data-attnlab-figure="{payload}"></div>')
        return [nodes.raw("", html, format="html", classes=["output", "text_html"])]


def _add_plotly_js(app, pagename, templatename, context, doctree):
    if doctree is not None and "plotly-graph-div" in context.get("body", ""):
        app.add_js_file(PLOTLY_JS, priority=200)
        app.add_js_file(FIGURES_JS, priority=210)


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


CODE_BLOCK = re.compile(r'(<div class="highlight-(?:ipython3|python3?) notranslate"><div class="highlight">'
                        r'<pre)>(.*?)</pre>', re.S)
TAG = re.compile(r"<[^>]+>")
SOURCE_BLOCK = re.compile(r'<style>[^<]*</style>(<div style="[^"]*"><div class="attnlab-source-code">'
                          r'<pre style="[^"]*")>(?:<span></span>)?<span class="linenos"> *(\d+)</span>'
                          r'(.*?)</pre>', re.S)
STREAM_PRE = re.compile(r'(<div class="output stream highlight-myst-ansi notranslate"><div class="highlight">'
                        r'<pre)><span></span>([^<]*)</pre>')
DIAGRAM = re.compile(r'<div class="output text_html">(<svg [^>]*class="attnlab-diagram".*?</svg>)', re.S)
LINENO = re.compile(r'<span class="linenos"> *\d+</span>')
HIGHLIGHT_JS = "attnlab-highlight.js"
QUIZ_JS, QUIZ_CSS = "jupyterquiz.js", "jupyterquiz.css"


def _plain_code(app, pagename, templatename, context, doctree):
    """Ship Python code blocks as plain text for ``attnlab-highlight.js`` to colour.

    Pygments wraps every token in a ``<span>``: about three bytes of markup per byte of code,
    which made code the largest part of a chapter page. The script restores the same classes
    in the browser (the theme's light and dark colours apply as before); the text, what
    copy-paste and search see, is unchanged (a long block travels packed, see ``_code_pre``,
    and the script unpacks it first; the site's search index is built from the sources, not
    from these pages). The library's source blocks
    (``attnlab.show_source``) lose their per-block stylesheet and line-number markup the same
    way; the script adds the numbers back from ``data-first-line``.
    """
    body = context.get("body", "")
    if "highlight-" in body:
        body = CODE_BLOCK.sub(lambda m: _code_pre(m[1], TAG.sub("", m[2])), body)
    if "attnlab-source-code" in body:   # attnlab.show_source: the script numbers the lines too
        body = SOURCE_BLOCK.sub(lambda m: _code_pre(f'{m[1]} data-first-line="{m[2]}"',
                                                    TAG.sub("", LINENO.sub("", m[3]))), body)
    body = STREAM_PRE.sub(lambda m: _code_pre(m[1], m[2], colour=False), body)
    # MathJax finds math by the class "math"; "nohighlight" (for highlight.js) is unused here
    body = body.replace('class="math notranslate nohighlight"', 'class="math notranslate"')
    body = DIAGRAM.sub(_packed_diagram, body)
    context["body"] = body


def _packed_diagram(m) -> str:
    """A concept diagram's inline SVG, packed where that saves over a third (the script puts
    it back, title and description for screen readers included)."""
    packed = _packed(m[1])
    if len(packed) < 0.7 * len(m[1]):
        return f'<div class="output text_html" data-deflated-html="{packed}">'
    return m[0]


def _code_pre(opening: str, escaped: str, colour: bool = True) -> str:
    """A code block's (or with ``colour=False`` a printed output's) ``<pre>`` for the script:
    its text, or, where that is over a third smaller, the text packed in ``data-deflated`` (a
    long cell packs to about a quarter)."""
    mark = "data-attnlab-hl" if colour else "data-attnlab-text"
    packed = _packed(html.unescape(escaped))
    if len(packed) < 0.7 * len(escaped):
        return f'{opening} {mark} data-deflated="{packed}"></pre>'
    return f"{opening} data-attnlab-hl>{escaped}</pre>" if colour else f"{opening}><span></span>{escaped}</pre>"


def _jupyterquiz_parts() -> tuple[str, str]:
    """The script and stylesheet that jupyterquiz pastes into every quiz output, read from its
    package exactly as its renderer joins them."""
    from importlib.resources import files

    package = files("jupyterquiz")
    js = "".join(f.read_text(encoding="utf-8") for f in sorted(package.joinpath("js").iterdir(),
                                                                 key=lambda f: f.name)
                 if f.name.endswith(".js"))
    return js, package.joinpath("styles.css").read_text(encoding="utf-8")


QUIZ_SCRIPT = re.compile(r'<script type="application/javascript">var questions(\w+)=(.*?)</script>', re.S)
QUIZ_DRAW = """
/* Attention Lab: draw a quiz whose questions the page carries packed (raw deflate, base64),
   once they are unpacked with the browser's DecompressionStream (attnlab_book). */
function attnlabQuiz(id, packed) {
  var bytes = Uint8Array.from(atob(packed), function (c) { return c.charCodeAt(0); });
  var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate-raw"));
  new Response(stream).text().then(JSON.parse).then(function (questions) {
    (function draw() {
      var host = document.getElementById(id);
      if (host) show_questions(questions, host); else window.setTimeout(draw, 200);
    })();
  }).catch(function (err) { console.error("attnlab quiz", id, err); });
}
"""


def _shared_quiz_code(app, pagename, templatename, context, doctree):
    """Load jupyterquiz's script and stylesheet once for the site instead of inline per quiz,
    and carry each quiz's questions packed.

    Each quiz output carries the whole library (about 40 kB) and its questions as JSON; a page
    keeps only the questions, packed (a third of the bytes), and one call that draws them, and
    loads the shared copies (``_static``) written at the end of the build by ``_copy_quiz_code``.
    """
    body = context.get("body", "")
    if "show_questions(" not in body:
        return
    js, css = _jupyterquiz_parts()
    if js not in body:
        raise RuntimeError(f"{pagename}: jupyterquiz's inline script is not the package's; "
                           "update attnlab_book._shared_quiz_code")
    body = body.replace(js, "").replace(css, "")

    def packed_call(m):
        questions, _ = json.JSONDecoder().raw_decode(m[2])
        text = json.dumps(questions, separators=(",", ":"), ensure_ascii=False)
        return f'<script>attnlabQuiz("{m[1]}", "{_packed(text)}");</script>'

    context["body"] = QUIZ_SCRIPT.sub(packed_call, body)
    app.add_js_file(QUIZ_JS, priority=200)
    app.add_css_file(QUIZ_CSS)


def _copy_quiz_code(app, exc):
    if exc is None and app.builder.format == "html":
        js, css = _jupyterquiz_parts()
        static = Path(app.outdir) / "_static"
        (static / QUIZ_JS).write_text(js + QUIZ_DRAW, encoding="utf-8")
        (static / QUIZ_CSS).write_text(css, encoding="utf-8")


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
    app.connect("html-page-context", _plain_code)
    app.connect("html-page-context", _shared_quiz_code)
    app.connect("html-page-context", _drop_thebe, priority=900)  # after every script is added
    app.connect("html-page-context", _drop_idle_widget_manager, priority=900)
    app.connect("build-finished", _copy_plotly_js)
    app.connect("build-finished", _write_banks)
    app.connect("build-finished", _copy_quiz_code)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
