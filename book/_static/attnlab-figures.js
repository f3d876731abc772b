/* Attention Lab: draw the book's plotly figures.
 *
 * The build (attnlab_book.PlotlyMimeRenderer) stores each figure in its div's
 * data-attnlab-figure attribute as raw-deflated, base64-encoded JSON: a third to a twentieth
 * of the bytes of plotly's own inline script. This unpacks each with the browser's
 * DecompressionStream and draws it with the site's plotly.js, sliders and hover included.
 */
(function () {
  "use strict";
  function unpack(text) {
    var bytes = Uint8Array.from(atob(text), function (c) { return c.charCodeAt(0); });
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate-raw"));
    return new Response(stream).text().then(JSON.parse);
  }
  function draw(div) {
    var packed = div.getAttribute("data-attnlab-figure");
    div.removeAttribute("data-attnlab-figure");
    return unpack(packed).then(function (figure) {
      var config = Object.assign({ displaylogo: false, responsive: true }, figure.config || {});
      // A text alternative for screen readers: the figure's title (its text, not its markup).
      var title = ((figure.layout || {}).title || {}).text || "";
      var label = document.createElement("span");
      label.innerHTML = title;
      div.setAttribute("role", "figure");
      div.setAttribute("aria-label", "Figure: " + (label.textContent || "interactive plot"));
      return Plotly.newPlot(div, figure.data, figure.layout || {}, config).then(function () {
        if (figure.frames) return Plotly.addFrames(div, figure.frames);
      });
    }).catch(function (err) {
      div.textContent = "This figure could not be drawn here (" + err + ").";
      console.error("attnlab figure", div.id, err);
    });
  }
  function run() {
    document.querySelectorAll("div[data-attnlab-figure]").forEach(draw);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", run);
  else run();
})();
