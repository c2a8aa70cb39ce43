// mq console: confirmations, sortable and filterable tables, live counts and rate charts.
// Part of mq (MIT OR Apache-2.0); no third-party code, nothing fetched but this console's API.
"use strict";

// A form with data-confirm asks first.
document.addEventListener("submit", function (e) {
  var msg = e.target.getAttribute("data-confirm");
  if (msg && !window.confirm(msg)) e.preventDefault();
});

function cellValue(td) {
  var v = td.getAttribute("data-v");
  return v !== null ? v : td.textContent.trim();
}

// Sortable tables: click a header with data-sort="num" or "text".
document.querySelectorAll("table.sortable th[data-sort]").forEach(function (th) {
  th.tabIndex = 0;
  function sort() {
    var table = th.closest("table"), body = table.tBodies[0];
    var idx = Array.prototype.indexOf.call(th.parentNode.children, th);
    var asc = th.getAttribute("aria-sort") !== "ascending";
    th.parentNode.querySelectorAll("th").forEach(function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", asc ? "ascending" : "descending");
    var num = th.getAttribute("data-sort") === "num";
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = cellValue(a.cells[idx]), y = cellValue(b.cells[idx]);
      var c = num ? (parseFloat(x) || 0) - (parseFloat(y) || 0) : x.localeCompare(y);
      return asc ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  th.addEventListener("click", sort);
  th.addEventListener("keydown", function (e) { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sort(); } });
});

// Filters: <input data-filter="TABLE-ID"> hides rows whose name does not contain the text.
document.querySelectorAll("input[data-filter]").forEach(function (input) {
  var table = document.getElementById(input.getAttribute("data-filter"));
  input.addEventListener("input", function () {
    var t = input.value.toLowerCase();
    Array.prototype.forEach.call(table.tBodies[0].rows, function (r) {
      r.hidden = t !== "" && (r.getAttribute("data-name") || "").toLowerCase().indexOf(t) < 0;
    });
  });
});

// Live pages: every 2 s the counts and rates come from /api/v1 and the charts are redrawn.
var live = document.querySelector("[data-live]");
function fmtRate(x) { return x >= 100 ? x.toFixed(0) : x.toFixed(1); }
function getJSON(url) {
  return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
    .then(function (r) { if (!r.ok) throw new Error(r.status); return r.json(); });
}
function rowsByName() {
  var m = {};
  live.querySelectorAll("tr[data-name]").forEach(function (r) { m[r.getAttribute("data-name")] = r; });
  return m;
}
function setField(scope, f, text) {
  var el = scope.querySelector('[data-f="' + f + '"]');
  if (el && el.textContent !== text) el.textContent = text;
  if (el && el.hasAttribute("data-v")) el.setAttribute("data-v", text);
}
function draw(svg, pts) {
  if (!svg || !pts) return;
  var n = pts.length, max = 1;
  pts.forEach(function (p) { max = Math.max(max, p[1], p[2]); });
  function line(k) {
    return pts.map(function (p, i) {
      var x = n > 1 ? (i * 120) / (n - 1) : 0;
      var y = 29 - (p[k] / max) * 27;
      return x.toFixed(1) + "," + y.toFixed(1);
    }).join(" ");
  }
  svg.querySelector(".s").setAttribute("points", line(1));
  svg.querySelector(".r").setAttribute("points", line(2));
  svg.setAttribute("aria-label", "peak " + fmtRate(max) + " messages/s");
}
function refresh() {
  if (document.hidden) return;
  var rows = rowsByName();
  // The page's own slice of the queue list (the API pages it).
  var q = live.getAttribute("data-query");
  q = q ? "?" + q : "";
  getJSON("/api/v1/queues" + q).then(function (d) {
    d.queues.forEach(function (q) {
      var r = rows[q.name];
      if (!r) return;
      setField(r, "messages", String(q.messages));
      setField(r, "send_per_sec", fmtRate(q.send_per_sec));
      setField(r, "receive_per_sec", fmtRate(q.receive_per_sec));
    });
  }).catch(function () {});
  if (live.getAttribute("data-live") !== "overview") return;
  getJSON("/api/v1/broker").then(function (b) {
    var cards = live.querySelector(".cards");
    ["queues", "messages", "outgoing_queues"].forEach(function (f) { setField(cards, f, String(b[f])); });
    setField(cards, "send_per_sec", fmtRate(b.send_per_sec));
    setField(cards, "receive_per_sec", fmtRate(b.receive_per_sec));
  }).catch(function () {});
  getJSON("/api/v1/rates" + q).then(function (d) {
    Object.keys(d.queues).forEach(function (name) {
      var r = rows[name];
      if (r) draw(r.querySelector("svg.spark"), d.queues[name]);
    });
  }).catch(function () {});
}
if (live) { refresh(); setInterval(refresh, 2000); }
