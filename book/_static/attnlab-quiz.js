/* Attention Lab: quizzes that remember, the "Your progress" page and the "Review" page.
 *
 * Each chapter's quiz is drawn by jupyterquiz; `attnlab.quiz.show_quiz` puts a marker before it,
 * <div class="attnlab-quiz" data-bank="NN_name" data-ids='["NN-...", ...]'>, whose ids are the
 * bank's stable question ids in the order jupyterquiz draws them (questions are not shuffled).
 * This script keeps, for each id, what the reader answered and whether it was right, in this
 * browser's localStorage only (nothing is sent anywhere), shows it again on a later visit, and
 * offers a reset. A classic script, not a module, so it also runs from file://.
 */
(function () {
  "use strict";
  var KEY = "attnlab-quiz-v1";
  var restoring = false;

  function load() {
    try { return JSON.parse(window.localStorage.getItem(KEY)) || {}; } catch (e) { return {}; }
  }
  function store(answers) {
    try { window.localStorage.setItem(KEY, JSON.stringify(answers)); } catch (e) { /* private mode */ }
  }

  /* One answer to one question: the first attempt decides "right on the first try". */
  function record(id, bank, answer, correct) {
    var answers = load();
    var r = answers[id] || { bank: bank, attempts: 0 };
    r.attempts += 1;
    if (r.attempts === 1) r.firstCorrect = correct;
    r.correct = correct;
    r.everCorrect = Boolean(r.everCorrect || correct);
    r.answer = answer;
    r.when = Date.now();
    r.history = (r.history || []).concat([{ t: r.when, ok: correct }]).slice(-50);
    answers[id] = r;
    store(answers);
  }

  function feedbackOf(wrap) {
    var fb = wrap.querySelector(".Feedback");
    if (!fb) return null;
    if (fb.classList.contains("correct")) return true;
    if (fb.classList.contains("incorrect")) return false;
    return null;
  }

  function answerText(label) {
    var span = label.querySelector("span");
    return (span ? span.textContent : label.textContent).trim();
  }

  function summary(ids) {
    var answers = load(), answered = 0, first = 0;
    ids.forEach(function (id) {
      if (answers[id]) { answered += 1; if (answers[id].firstCorrect) first += 1; }
    });
    return { answered: answered, first: first, total: ids.length };
  }

  function statusText(ids) {
    var s = summary(ids);
    if (!s.answered) return "Your answers are kept in this browser only.";
    return "Kept in this browser: " + s.answered + " of " + s.total + " answered, " +
      s.first + " right on the first try.";
  }

  function attach(marker) {
    var ids = JSON.parse(marker.dataset.ids || "[]"), bank = marker.dataset.bank;
    var cell = marker.closest(".cell_output") || marker.parentElement.parentElement;
    var root = cell && cell.querySelector("[data-shufflequestions]");
    if (!root) return false;
    var wraps = root.querySelectorAll(".Quiz");
    if (wraps.length !== ids.length) return false;

    var status = document.createElement("div");
    status.className = "attnlab-quiz-status";
    var text = document.createElement("span");
    var reset = document.createElement("button");
    reset.type = "button";
    reset.className = "attnlab-quiz-reset";
    reset.textContent = "Reset my answers";
    reset.setAttribute("aria-label", "Forget this chapter's quiz answers kept in this browser");
    status.appendChild(text);
    status.appendChild(reset);
    root.parentNode.insertBefore(status, root.nextSibling);
    var refresh = function () { text.textContent = statusText(ids) + " "; };

    Array.prototype.forEach.call(wraps, function (wrap, i) {
      var id = ids[i];
      wrap.dataset.questionId = id;
      var anchor = document.createElement("span");   // #q-<id>: the review page links here
      anchor.id = "q-" + id;
      wrap.parentNode.insertBefore(anchor, wrap);
      if (window.location.hash === "#q-" + id) {
        wrap.classList.add("attnlab-quiz-target");
        window.setTimeout(function () { anchor.scrollIntoView(); }, 300);
      }
      var lastClick = -1;
      wrap.addEventListener("click", function (event) {
        if (restoring) return;          // a kept answer being shown again, not a new one
        var label = event.target.closest && event.target.closest(".MCButton");
        if (!label) return;
        // a click on a label also clicks the radio inside it: count one answer, not two
        if (event.timeStamp - lastClick < 100) return;
        lastClick = event.timeStamp;
        window.setTimeout(function () {
          var right = feedbackOf(wrap);
          if (right !== null) { record(id, bank, answerText(label), right); refresh(); }
        }, 0);
      }, true);
      wrap.addEventListener("keypress", function (event) {
        var input = event.target;
        if (!input.classList || !input.classList.contains("Input-text")) return;
        if (event.key !== "Enter" && event.keyCode !== 13) return;
        var typed = input.value;
        window.setTimeout(function () {
          var right = feedbackOf(wrap);
          if (right !== null) { record(id, bank, typed, right); refresh(); }
        }, 0);
      }, true);
    });

    restore(wraps, ids);
    refresh();
    reset.addEventListener("click", function () {
      var answers = load();
      ids.forEach(function (id) { delete answers[id]; });
      store(answers);
      window.location.reload();
    });
    return true;
  }

  /* Show each kept answer again by replaying it through jupyterquiz (not counted again). */
  function restore(wraps, ids) {
    var answers = load();
    restoring = true;
    try {
      Array.prototype.forEach.call(wraps, function (wrap, i) {
        var r = answers[ids[i]];
        if (!r || r.answer === undefined) return;
        var input = wrap.querySelector("input.Input-text");
        if (input) {
          input.value = r.answer;
          // jupyterquiz checks event.keyCode, which a synthetic KeyboardEvent cannot set
          if (input.onkeypress) input.onkeypress.call(input, { which: 13, keyCode: 13 });
          return;
        }
        Array.prototype.forEach.call(wrap.querySelectorAll(".MCButton"), function (label) {
          if (answerText(label) === r.answer) label.click();
        });
      });
    } finally {
      restoring = false;
    }
  }

  function attachAll(tries) {
    var pending = Array.prototype.filter.call(
      document.querySelectorAll(".attnlab-quiz:not([data-attached])"), function (m) {
        if (attach(m)) { m.dataset.attached = "1"; return false; }
        return true;
      });
    if (pending.length && tries > 0) window.setTimeout(function () { attachAll(tries - 1); }, 200);
  }

  /* The "Your progress" page: one row per chapter, from window.ATTNLAB_BANKS (written at build). */
  function progressPage(host) {
    var banks = window.ATTNLAB_BANKS || [];
    var root = document.documentElement.dataset.content_root || "";
    var table = document.createElement("table");
    table.className = "table attnlab-progress";
    var head = table.createTHead().insertRow();
    ["Chapter", "Questions", "Answered", "Right first try"].forEach(function (h) {
      var th = document.createElement("th"); th.textContent = h; head.appendChild(th);
    });
    var body = table.createTBody(), totals = { answered: 0, first: 0, total: 0 };
    banks.forEach(function (b) {
      var s = summary(b.ids), row = body.insertRow();
      var link = document.createElement("a");
      link.href = root + b.url + "#check-yourself";
      link.textContent = b.title;
      row.insertCell().appendChild(link);
      [s.total, s.answered, s.first].forEach(function (v) { row.insertCell().textContent = String(v); });
      totals.answered += s.answered; totals.first += s.first; totals.total += s.total;
    });
    var foot = table.createTFoot().insertRow();
    ["All chapters", totals.total, totals.answered, totals.first].forEach(function (v) {
      foot.insertCell().textContent = String(v);
    });
    host.textContent = "";
    host.appendChild(table);
    var reset = document.createElement("button");
    reset.type = "button";
    reset.className = "attnlab-quiz-reset";
    reset.textContent = "Reset all my answers";
    reset.addEventListener("click", function () {
      try { window.localStorage.removeItem(KEY); } catch (e) { /* nothing kept */ }
      progressPage(host);
    });
    host.appendChild(reset);
  }

  /* Spaced review with FSRS (ts-fsrs, loaded by the review page only). Each question's card is
   * rebuilt by replaying its answers in order: the first answer, and each answer given once the
   * card is due, is a review (right: Good; wrong: Again); answers before the due date (a second
   * try, a reread) leave the schedule alone. Replaying keeps the stored data a plain log. */
  function card(history) {
    var F = window.FSRS, scheduler = F.fsrs(F.generatorParameters({ enable_fuzz: false }));
    var c = F.createEmptyCard(new Date(history[0].t));
    history.forEach(function (h, i) {
      var when = new Date(h.t);
      if (i === 0 || when >= c.due) c = scheduler.next(c, when, h.ok ? F.Rating.Good : F.Rating.Again).card;
    });
    return c;
  }

  function when(due, now) {
    var hours = (due - now) / 36e5;
    var minutes = Math.max(1, Math.round(hours * 60));
    if (hours < 1) return "in " + minutes + (minutes === 1 ? " minute" : " minutes");
    if (hours < 24) return "in " + Math.round(hours) + " hours";
    return "on " + due.toLocaleDateString();
  }

  function reviewPage(host) {
    var answers = load(), banks = window.ATTNLAB_BANKS || [], texts = window.ATTNLAB_QUESTIONS || {};
    var root = document.documentElement.dataset.content_root || "", now = new Date();
    var due = [], later = [];
    banks.forEach(function (b) {
      b.ids.forEach(function (id) {
        var r = answers[id];
        if (!r || !r.history || !r.history.length) return;
        var c = card(r.history);
        (c.due <= now ? due : later).push({ id: id, bank: b, card: c });
      });
    });
    due.sort(function (a, b) { return a.card.due - b.card.due; });
    later.sort(function (a, b) { return a.card.due - b.card.due; });
    host.textContent = "";
    var head = document.createElement("p");
    head.className = "attnlab-review-count";
    head.textContent = due.length ? due.length + " question" + (due.length > 1 ? "s" : "") +
      " due for review." : "Nothing is due for review now.";
    host.appendChild(head);
    var list = document.createElement("ol");
    list.className = "attnlab-review-due";
    due.forEach(function (d) {
      var item = document.createElement("li"), link = document.createElement("a");
      link.href = root + d.bank.url + "#q-" + d.id;
      link.innerHTML = texts[d.id] || d.id;   // the bank's own HTML, as the quiz shows it
      var where = document.createElement("span");
      where.className = "attnlab-review-where";
      where.textContent = " (" + d.bank.title + (d.card.lapses ? ", missed " + d.card.lapses + "×" : "") + ")";
      item.appendChild(link); item.appendChild(where); list.appendChild(item);
    });
    if (due.length) host.appendChild(list);
    if (later.length) {
      var next = document.createElement("p");
      next.textContent = later.length + " more answered question" + (later.length > 1 ? "s" : "") +
        " scheduled; the next is due " + when(later[0].card.due, now) + ".";
      host.appendChild(next);
    }
  }

  function start() {
    attachAll(25);
    var host = document.getElementById("attnlab-progress");
    if (host) progressPage(host);
    var review = document.getElementById("attnlab-review");
    if (review && window.FSRS) reviewPage(review);
  }
  if (document.readyState === "complete") start();
  else window.addEventListener("load", start);
})();
