/* Attention Lab: colour the book's Python code in the reader's browser.
 *
 * The build (attnlab_book._plain_code) ships each code cell as plain text in a
 * <pre data-attnlab-hl>, not as Pygments' one <span> per token, which tripled the bytes of a
 * code-heavy page. This script puts the colours back with the same Pygments class names
 * (k, kn, kc, ow, nb, bp, nf, nc, nd, s2, s1, sa, c1, mi, mf, o), so the theme's light and dark
 * code colours apply unchanged. Names and punctuation stay unwrapped: the theme draws them
 * in the block's own text colour. A long block arrives packed (raw deflate, base64, in
 * data-deflated: a quarter of the bytes) and is unpacked first with the browser's own
 * DecompressionStream, as the figures are; so do long printed outputs (pre[data-attnlab-text])
 * and the concept diagrams' SVG (data-deflated-html).
 * The library's source blocks (attnlab.show_source) come the same way, with their first line
 * number in data-first-line; their colours are in attnlab.css (a light plate in both themes).
 */
(function () {
  "use strict";
  var KEYWORDS = new Set(("assert async await break class continue def del elif else except " +
    "finally for global if lambda nonlocal pass raise return try while with yield match case")
    .split(" "));
  var IMPORTS = new Set(["import", "from", "as"]);
  var CONSTANTS = new Set(["True", "False", "None"]);
  var WORD_OPERATORS = new Set(["and", "or", "not", "in", "is"]);
  var BUILTINS = new Set(("abs all any bool bytes callable chr dict dir divmod enumerate eval " +
    "filter float format frozenset getattr hasattr hash hex id input int isinstance " +
    "issubclass iter len list map max min next object open ord pow print property range " +
    "repr reversed round set setattr slice sorted staticmethod classmethod str sum super " +
    "tuple type vars zip ValueError TypeError KeyError IndexError RuntimeError " +
    "AssertionError ImportError NotImplementedError Exception StopIteration").split(" "));
  var TOKEN = new RegExp([
    "(#[^\\n]*)",                                                        // 1 comment
    "([rRbBuUfF]{0,2})(\"\"\"[\\s\\S]*?\"\"\"|'''[\\s\\S]*?'''|" +       // 2 prefix, 3 string
      "\"(?:\\\\.|[^\"\\\\\\n])*\"|'(?:\\\\.|[^'\\\\\\n])*')",
    "(\\b0[xXbBoO][0-9a-fA-F_]+\\b|(?:\\b\\d[\\d_]*\\.?[\\d_]*|\\.\\d[\\d_]*)" +
      "(?:[eE][+-]?\\d+)?j?)",                                           // 4 number
    "(@[A-Za-z_][\\w.]*)",                                               // 5 decorator
    "([A-Za-z_]\\w*)",                                                   // 6 name
    "(\\*\\*=?|//=?|->|:=|[-+*/%@&|^~<>!=]=?)",                          // 7 operator
  ].join("|"), "g");

  function escape(text) {
    return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }
  function span(cls, text) { return '<span class="' + cls + '">' + escape(text) + "</span>"; }

  function colour(code) {
    var out = [], last = 0, previous = "", match;
    TOKEN.lastIndex = 0;
    while ((match = TOKEN.exec(code)) !== null) {
      if (match[0] === "") { TOKEN.lastIndex++; continue; }
      out.push(escape(code.slice(last, match.index)));
      last = TOKEN.lastIndex;
      if (match[1] !== undefined) out.push(span("c1", match[1]));
      else if (match[3] !== undefined) {
        if (match[2]) out.push(span("sa", match[2]));
        out.push(span(match[3][0] === "'" ? "s1" : "s2", match[3]));
      } else if (match[4] !== undefined) out.push(span(/[.eEj]/.test(match[4]) ? "mf" : "mi", match[4]));
      else if (match[5] !== undefined) out.push(span("nd", match[5]));
      else if (match[6] !== undefined) {
        var word = match[6], cls = null;
        if (previous === "def") cls = "nf";
        else if (previous === "class") cls = "nc";
        else if (IMPORTS.has(word)) cls = "kn";
        else if (CONSTANTS.has(word)) cls = "kc";
        else if (WORD_OPERATORS.has(word)) cls = "ow";
        else if (KEYWORDS.has(word)) cls = "k";
        else if (word === "self") cls = "bp";
        else if (BUILTINS.has(word) && code[match.index - 1] !== ".") cls = "nb";
        out.push(cls ? span(cls, word) : escape(word));
        previous = word;
        continue;
      } else out.push(span("o", match[7]));
      previous = "";
    }
    out.push(escape(code.slice(last)));
    return out.join("");
  }

  function unpack(text) {     // raw-deflated, base64 (attnlab_book._packed)
    var bytes = Uint8Array.from(atob(text), function (c) { return c.charCodeAt(0); });
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate-raw"));
    return new Response(stream).text();
  }

  function show(pre, code) {
    var html = colour(code), first = pre.getAttribute("data-first-line");
    if (first !== null) {         // attnlab.show_source: number the lines from the first
      var n = parseInt(first, 10), lines = html.split("\n");
      var width = String(n + lines.length - 1).length;
      html = lines.map(function (line, i) {
        return '<span class="linenos">' + String(n + i).padStart(width) + "</span>" + line;
      }).join("\n");
    }
    pre.innerHTML = html;
    pre.removeAttribute("data-attnlab-hl");
  }

  function unpackInto(el, attribute, put) {
    var packed = el.getAttribute(attribute);
    el.removeAttribute(attribute);
    unpack(packed).then(put).catch(function (err) {
      el.textContent = "This part of the page could not be unpacked here (" + err + ").";
      console.error("attnlab unpack", err);
    });
  }

  function run() {
    document.querySelectorAll("pre[data-attnlab-hl]").forEach(function (pre) {
      if (!pre.hasAttribute("data-deflated")) return show(pre, pre.textContent);
      unpackInto(pre, "data-deflated", function (code) { show(pre, code); });
    });
    document.querySelectorAll("pre[data-attnlab-text][data-deflated]").forEach(function (pre) {
      unpackInto(pre, "data-deflated", function (text) { pre.textContent = text; });
    });
    document.querySelectorAll("[data-deflated-html]").forEach(function (el) {
      unpackInto(el, "data-deflated-html", function (html) { el.innerHTML = html; });
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", run);
  else run();
  window.attnlabColourPython = colour;   // for the browser tests
})();
