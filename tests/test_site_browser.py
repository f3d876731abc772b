"""The built book in headless Chromium (Debian's, driven by Playwright), served on 127.0.0.1
with every other request blocked: figures drawn, sliders work without a kernel, every quiz
question answered right and wrong, math is typeset, and nothing fails or reaches outside the site.

Run after `make book` (make test does both).
"""
import functools
import http.server
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

SITE = Path(__file__).resolve().parents[1] / "_build" / "html"
CHROMIUM = "/usr/bin/chromium"
CHAPTERS = sorted(p.relative_to(SITE).as_posix() for p in (SITE / "notebooks").glob("*.html"))
PAGES = ["book/intro.html", "book/how_to_use.html", "book/notation.html", "book/progress.html",
         "book/review.html", "book/errata.html",
         "book/references.html", *CHAPTERS]
# Console messages allowed, each with the reason. Keep this empty unless a message is
# harmless and cannot be removed at its source.
ALLOWED_CONSOLE = {}


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def base_url():
    if not (SITE / "index.html").exists():
        pytest.fail("no built site: run `make book` first")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(SITE)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} not found: install Debian's chromium (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"])
        yield b
        b.close()


def open_page(browser, url, sizes=None):
    """Load url with non-local requests blocked; return (page, problems dict). If sizes is a
    dict, it receives {url: bytes} of every local response."""
    page = browser.new_page(viewport={"width": 1280, "height": 1600})
    problems = {"console": [], "page_errors": [], "failed": [], "external": []}
    if sizes is not None:
        page.on("response", lambda r: r.url.startswith("http://127.0.0.1") and r.ok
                and sizes.__setitem__(r.url.split("#")[0].split("?")[0], len(r.body())))
    page.on("console", lambda m: m.type == "error" and not any(a in m.text for a in ALLOWED_CONSOLE)
            and problems["console"].append(m.text[:300]))
    page.on("pageerror", lambda e: problems["page_errors"].append(str(e)[:300]))
    page.on("requestfailed", lambda r: r.url.startswith("http://127.0.0.1") and problems["failed"].append(r.url))
    page.on("response", lambda r: r.status >= 400 and problems["failed"].append(f"{r.status} {r.url}"))

    def route(r):
        if r.request.url.startswith(("http://127.0.0.1", "data:", "blob:")):
            return r.continue_()
        problems["external"].append(r.request.url[:200])
        return r.abort()

    page.route("**/*", route)
    page.goto(url, wait_until="load", timeout=60_000)
    page.wait_for_timeout(1500)
    return page, problems


PAGE_BUDGET = 300_000  # bytes a chapter page loads of its own (issue 21)


@pytest.mark.parametrize("path", PAGES)
def test_page_loads_offline_without_errors(browser, base_url, path):
    """Every page loads with no console error, failed or outside request. A chapter page also
    stays light: what it loads of its own (the page and anything it fetches except the site's
    shared files: ``_static/``, which holds plotly.js, MathJax, the widget manager and the
    theme, and the site's search index) is within the budget, and the build writes nothing
    page-specific into ``_static/``."""
    sizes = {}
    page, problems = open_page(browser, f"{base_url}/{path}", sizes)
    assert problems == {"console": [], "page_errors": [], "failed": [], "external": []}
    assert page.locator("article h1").count() >= 1
    page.close()
    if path not in CHAPTERS:
        return
    shared = (f"{base_url}/_static/", f"{base_url}/searchindex.js")
    own = sum(n for url, n in sizes.items() if not url.startswith(shared))
    print(f"{own / 1000:7.1f} kB  {path}")
    assert 20_000 < own <= PAGE_BUDGET, f"{path} loads {own} bytes of its own"
    named = [url for url in sizes if url.startswith(shared[0]) and Path(path).stem in url]
    assert not named, f"page-specific files in _static/: {named}"


@pytest.mark.parametrize("path", PAGES)
def test_no_sideways_scrolling_on_a_phone(browser, base_url, path):
    """At a 390-px-wide window nothing widens the page: long code scrolls inside its own box,
    figures and tables fit or scroll inside themselves."""
    page = browser.new_page(viewport={"width": 390, "height": 844})
    page.goto(f"{base_url}/{path}", wait_until="load", timeout=60_000)
    page.wait_for_timeout(500)
    width, view = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert width <= view, f"{path}: the page is {width} px wide in a {view}-px window"
    page.close()


@pytest.mark.parametrize("scheme", ["http", "file"])
def test_search_works_offline(browser, base_url, scheme):
    """The theme's search finds a chapter from its index, over http:// and from file://, with
    no console error (no result summaries are fetched: html_show_search_summary is off)."""
    root = base_url if scheme == "http" else SITE.as_uri()
    page = browser.new_page(viewport={"width": 1280, "height": 1200})
    errors = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text[:300]))
    page.on("pageerror", lambda e: errors.append(str(e)[:300]))
    page.on("request", lambda r: not r.url.startswith((root, "data:", "blob:"))
            and errors.append(f"outside request: {r.url[:200]}"))
    page.goto(f"{root}/search.html?q=softmax", wait_until="load")
    page.wait_for_function("() => document.querySelectorAll('#search-results li').length > 0",
                           timeout=30_000)
    links = page.eval_on_selector_all("#search-results li a", "els => els.map(a => a.href)")
    assert any("notebooks/01_attention_from_scratch.html" in h for h in links), links[:5]
    page.wait_for_timeout(500)
    assert errors == []
    page.close()


def test_quiz_and_figures_are_accessible(browser, base_url):
    """A quiz answered with the keyboard alone (Tab to an option, Space), and every figure
    named for screen readers by its title; every concept diagram carries a title."""
    page, problems = open_page(browser, f"{base_url}/notebooks/01_attention_from_scratch.html")
    radio = page.locator(".Quiz .MCButton input[type=radio]").first
    radio.focus()
    assert page.evaluate("document.activeElement.type") == "radio", "an option cannot take focus"
    page.keyboard.press("Space")
    page.wait_for_timeout(300)
    feedback = page.locator(".Quiz").first.locator(".Feedback")
    assert feedback.count() and feedback.first.inner_text().strip(), "no feedback after Space"
    labels = page.eval_on_selector_all(".plotly-graph-div", "els => els.map(e => e.getAttribute('aria-label'))")
    assert labels and all(lab and lab.startswith("Figure: ") and len(lab) > 12 for lab in labels), labels
    titles = page.eval_on_selector_all("svg.attnlab-diagram", "els => els.map(e => e.querySelector('title') && e.querySelector('title').textContent)")
    assert titles and all(titles), titles
    assert problems == {"console": [], "page_errors": [], "failed": [], "external": []}
    page.close()


def test_every_chapter_is_listed():
    assert CHAPTERS, "no chapter pages were built"


@pytest.mark.parametrize("path", CHAPTERS)
def test_chapter_figures_sliders_quiz_and_math(browser, base_url, path):
    page, problems = open_page(browser, f"{base_url}/{path}")
    page.wait_for_function("() => document.querySelectorAll('mjx-container').length > 0", timeout=30_000)
    figures = page.locator(".plotly-graph-div")
    assert figures.count() >= 4
    for i in range(figures.count()):
        figures.nth(i).scroll_into_view_if_needed()
        assert figures.nth(i).locator("svg.main-svg").count() > 0, f"figure {i} drew no svg"

    # Every kernel-free slider: clicking the other end of its rail changes what the figure shows
    # (its title, its data, which traces are visible, or its annotations).
    sliders = page.locator(".plotly-graph-div:has(.slider-container)")
    assert sliders.count() >= 1
    state = ("el => JSON.stringify([el.layout.title.text, el.data.map(t => [t.z || t.y, t.visible]),"
             " (el.layout.annotations || []).map(a => a.text)])")
    for i in range(sliders.count()):
        fig = sliders.nth(i)
        fig.scroll_into_view_if_needed()
        before = fig.evaluate(state)
        box = fig.locator("rect.slider-rail-touch-rect").first.bounding_box()
        at_end = fig.evaluate("el => (el.layout.sliders[0].active || 0) === el.layout.sliders[0].steps.length - 1")
        x = box["x"] + 3 if at_end else box["x"] + box["width"] - 3  # click the end it is not already at
        page.mouse.click(x, box["y"] + box["height"] / 2)
        page.wait_for_timeout(600)
        assert fig.evaluate(state) != before, f"slider figure {i} did not change"

    # Code arrives as text (long cells packed) and is unpacked and coloured in the browser.
    assert page.locator("pre[data-attnlab-hl]").count() == 0, "code left uncoloured"
    assert page.locator("div.cell_input pre span.k").count() > 0, "no keyword coloured"
    assert "import" in page.locator("div.cell_input pre").first.inner_text()

    # Every quiz question is answered, right and once wrong (test_every_quiz_question_is_answerable).
    assert page.locator(".MCButton").count() >= 8

    # The Colab launch button points at this notebook.
    colab = [h for h in page.evaluate("() => [...document.querySelectorAll('a')].map(a => a.href)") if "colab.research.google.com" in h]
    assert any(h.endswith(path.replace(".html", ".ipynb")) for h in colab), colab
    assert problems == {"console": [], "page_errors": [], "failed": [], "external": []}
    page.close()


FEEDBACK_JS = """wrap => {
  const fb = wrap.querySelector('.Feedback');
  return fb ? [fb.classList.contains('correct'), fb.classList.contains('incorrect'),
               getComputedStyle(fb).display !== 'none' && fb.textContent.trim().length > 0] : null;
}"""

ANSWER_BANK_JS = """([entries]) => {
  // Answer every question of the page once wrongly and then correctly, in one evaluation:
  // a click on an option's label, or a typed value submitted the way a kept answer is
  // replayed (jupyterquiz reads event.keyCode, which a synthetic KeyboardEvent cannot set).
  // Returns, per question, [right, wrong, shown] of its feedback after each answer.
  const feedback = wrap => {
    const fb = wrap.querySelector('.Feedback');
    return fb ? [fb.classList.contains('correct'), fb.classList.contains('incorrect'),
                 getComputedStyle(fb).display !== 'none' && fb.textContent.trim().length > 0] : null;
  };
  return Array.from(document.querySelectorAll('.Quiz')).map((wrap, i) => {
    const input = wrap.querySelector('input.Input-text');
    if (input) {
      return entries[i].map(typed => {
        input.value = typed;
        input.onkeypress.call(input, {which: 13, keyCode: 13});
        return feedback(wrap);
      });
    }
    const labels = Array.from(wrap.querySelectorAll('.MCButton'));
    const marks = labels.map(l => l.getAttribute('data-correct') === 'true');
    if (!marks.includes(true) || !marks.includes(false)) return 'needs a correct and a wrong option';
    const order = [marks.indexOf(false), ...marks.flatMap((m, j) => m ? [j] : [])];
    return order.map(j => { labels[j].click(); return feedback(wrap); });
  });
}"""


def numeric_entries(question: dict) -> tuple[str, str]:
    """A correct answer typed as the bank states it, and a wrong one."""
    correct = next(a for a in question["answers"] if a.get("correct") and a["type"] in ("value", "range"))
    right = correct["value"] if correct["type"] == "value" else sum(correct["range"]) / 2
    wrong = 10 * abs(right) + 7.5  # far from every correct answer in our banks
    return repr(right), repr(wrong)


@pytest.mark.parametrize("path", CHAPTERS)
def test_every_quiz_question_is_answerable(browser, base_url, path):
    """Answer each question of the chapter's quiz once wrongly and then correctly: every choice
    question has a correct option that is marked right and a wrong one marked wrong, every
    numeric question accepts its correct value typed as the bank states it and refuses a far
    one, and nothing raises a page error. (Real clicks and key presses are driven, for a few
    questions, by test_quiz_answers_are_kept_and_counted.)"""
    from attnlab.quiz import load_quiz

    bank = load_quiz(Path(path).stem)
    page, problems = open_page(browser, f"{base_url}/{path}")
    assert page.locator(".Quiz").count() == len(bank), (page.locator(".Quiz").count(), len(bank))
    entries = [list(numeric_entries(q)) if q["type"] == "numeric" else None for q in bank]
    results = page.evaluate(ANSWER_BANK_JS, [entries])
    tally = {"answered right": 0, "answered wrong": 0}
    for i, (question, shown_after) in enumerate(zip(bank, results)):
        label = f"question {i + 1} ({question.get('id', '')})"
        assert not isinstance(shown_after, str), f"{label}: {shown_after}"
        if question["type"] == "numeric":
            wants = [(True, False), (False, True)]          # the correct value, then the far one
            typed = entries[i]
        else:
            wants = [(False, True)] + [(True, False)] * (len(shown_after) - 1)
            typed = ["a wrong option"] + ["a correct option"] * (len(shown_after) - 1)
        for (right, wrong, shown), want, what in zip(shown_after, wants, typed):
            assert shown and (right, wrong) == want, f"{label}: {what} gave right={right}, wrong={wrong}"
            tally["answered right" if want[0] else "answered wrong"] += 1
    print(f"{path}: {tally['answered right']} right answers marked right over {len(bank)} questions, "
          f"{tally['answered wrong']} wrong ones marked wrong")
    assert tally["answered wrong"] == len(bank) and tally["answered right"] >= len(bank)
    assert problems == {"console": [], "page_errors": [], "failed": [], "external": []}
    page.close()


def open_first_quiz(browser, root):
    """The first chapter in a fresh browser profile: (context, page, page errors, bank, questions)."""
    from attnlab.quiz import load_quiz

    chapter = CHAPTERS[0]
    context = browser.new_context(viewport={"width": 1280, "height": 1600})
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)[:300]))
    page.goto(f"{root}/{chapter}", wait_until="load")
    page.wait_for_timeout(1000)
    return context, page, errors, load_quiz(Path(chapter).stem), page.locator(".Quiz")


def answer_two_choice_questions(bank, wraps) -> dict[int, bool]:
    """Answer the first choice question right and the second wrong: {question index: right}."""
    choice = [i for i, q in enumerate(bank) if q["type"] != "numeric"][:2]
    for i, want_right in zip(choice, (True, False)):
        buttons = wraps.nth(i).locator(".MCButton")
        marks = [buttons.nth(j).get_attribute("data-correct") == "true" for j in range(buttons.count())]
        wraps.nth(i).scroll_into_view_if_needed()
        buttons.nth(marks.index(want_right)).click()
    return dict(zip(choice, (True, False)))


@pytest.mark.parametrize("scheme", ["http", "file"])
def test_quiz_answers_are_kept_and_counted(browser, base_url, scheme):
    """In one browser profile: answer a choice question right and another wrong, and a numeric
    one; reload: the three answers are shown again and not counted twice; the progress page
    counts them for their chapter; "Reset all my answers" forgets them. Over http:// and
    file:// (where fetch and ES modules are blocked)."""
    root = base_url if scheme == "http" else SITE.as_uri()
    context, page, errors, bank, wraps = open_first_quiz(browser, root)
    expected = answer_two_choice_questions(bank, wraps)
    numeric = [i for i, q in enumerate(bank) if q["type"] == "numeric"][:1]
    for i in numeric:
        field = wraps.nth(i).locator("input.Input-text")
        field.fill(numeric_entries(bank[i])[0])
        field.press("Enter")
        expected[i] = True
    page.wait_for_timeout(200)
    page.reload(wait_until="load")
    page.wait_for_timeout(1000)
    for i, want_right in expected.items():
        right, wrong, shown = wraps.nth(i).evaluate(FEEDBACK_JS)
        assert shown and (right, wrong) == (want_right, not want_right), f"question {i} not restored"
    kept = page.evaluate("JSON.parse(localStorage.getItem('attnlab-quiz-v1'))")
    assert {bank[i]["id"] for i in expected} == set(kept)
    assert all(r["attempts"] == 1 for r in kept.values()), "a restored answer was counted again"
    first_try = sum(expected.values())
    status = page.locator(".attnlab-quiz-status").inner_text()
    assert f"{len(expected)} of {len(bank)} answered, {first_try} right on the first try" in status

    page.goto(f"{root}/book/progress.html", wait_until="load")
    page.wait_for_timeout(500)
    cells = page.locator("table.attnlab-progress tbody tr").first.locator("td").all_inner_texts()
    assert cells[1:] == [str(len(bank)), str(len(expected)), str(first_try)], cells
    page.get_by_role("button", name="Reset all my answers").click()
    cells = page.locator("table.attnlab-progress tbody tr").first.locator("td").all_inner_texts()
    assert cells[2:] == ["0", "0"]
    assert not errors
    context.close()


def test_review_page_schedules_answered_questions(browser, base_url):
    """FSRS on the review page: right after answering, nothing is due; thirty days later both
    answered questions are; a due question links to its place in its chapter, highlighted."""
    context, page, errors, bank, wraps = open_first_quiz(browser, base_url)
    answer_two_choice_questions(bank, wraps)
    page.wait_for_timeout(200)
    page.goto(f"{base_url}/book/review.html", wait_until="load")
    page.wait_for_timeout(500)
    assert "Nothing is due for review now" in page.locator("#attnlab-review").inner_text()
    page.evaluate("""() => { const kept = JSON.parse(localStorage.getItem('attnlab-quiz-v1'));
      for (const r of Object.values(kept)) r.history = r.history.map(h => ({t: h.t - 30 * 864e5, ok: h.ok}));
      localStorage.setItem('attnlab-quiz-v1', JSON.stringify(kept)); }""")
    page.reload(wait_until="load")
    page.wait_for_timeout(500)
    due = page.locator(".attnlab-review-due a")
    assert due.count() == 2
    due.first.click()
    page.wait_for_load_state("load")
    page.wait_for_selector(".attnlab-quiz-target", timeout=20_000)   # a big page, a busy machine
    assert page.locator(".attnlab-quiz-target").count() == 1
    assert not errors
    context.close()


def test_internal_links_resolve():
    """Every link from one page of the site to another reaches a page that exists, and the
    anchor it names is on that page; no link points at the book's public address (those are
    made relative by the build, so the site works offline)."""
    import re
    from html.parser import HTMLParser
    from urllib.parse import unquote, urldefrag, urljoin

    class Links(HTMLParser):
        def __init__(self):
            super().__init__()
            self.hrefs, self.ids = [], set()

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if attrs.get("id"):
                self.ids.add(attrs["id"])
            if tag == "a" and attrs.get("href"):
                self.hrefs.append(attrs["href"])

    config = (Path(__file__).resolve().parents[1] / "_config.yml").read_text()
    base = re.search(r"^\s+baseurl:\s*(\S+)", config, re.M).group(1)
    parsed = {}

    def parse(rel):
        if rel not in parsed:
            parsed[rel] = Links()
            parsed[rel].feed((SITE / rel).read_text(encoding="utf-8"))
        return parsed[rel]

    broken = []
    for page in PAGES:
        for href in parse(page).hrefs:
            if href.startswith(base):
                broken.append(f"{page}: {href} (absolute link to the book itself)")
            if re.match(r"^[a-z]+:", href) or href.startswith("//"):
                continue
            target, anchor = urldefrag(urljoin(page, unquote(href)))
            target = target or page
            if not (SITE / target).is_file():
                broken.append(f"{page}: {href} (no such page)")
            elif anchor and target.endswith(".html") and anchor not in parse(target).ids:
                broken.append(f"{page}: {href} (no such anchor)")
    assert not broken, "\n".join(broken)
