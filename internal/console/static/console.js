// Quill console: draws the overview's charts and refreshes them every ten
// seconds while the page is open. No other script runs on the console's
// pages (the Content-Security-Policy allows only this file).
"use strict";

(function () {
  const charts = document.querySelectorAll("canvas[data-chart]");
  if (charts.length === 0) return;

  function draw(canvas, series, colors) {
    const ctx = canvas.getContext("2d");
    const w = canvas.width, h = canvas.height, pad = 22;
    ctx.clearRect(0, 0, w, h);
    let max = 0, n = 0;
    for (const s of series) {
      n = Math.max(n, s.length);
      for (const v of s) max = Math.max(max, v);
    }
    ctx.fillStyle = "#667";
    ctx.font = "11px sans-serif";
    ctx.fillText(max === 0 ? "0" : String(Math.round(max * 100) / 100), 2, 11);
    ctx.strokeStyle = "#ccd";
    ctx.beginPath();
    ctx.moveTo(pad, h - pad + 0.5);
    ctx.lineTo(w, h - pad + 0.5);
    ctx.stroke();
    if (n < 2) {
      ctx.fillText("no data yet", w / 2 - 30, h / 2);
      return;
    }
    series.forEach((s, i) => {
      ctx.strokeStyle = colors[i];
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      s.forEach((v, j) => {
        const x = pad + (j * (w - pad)) / (n - 1);
        const y = h - pad - (max === 0 ? 0 : (v / max) * (h - pad - 14));
        if (j === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
      });
      ctx.stroke();
    });
  }

  function render(d) {
    const m = d.minutes || [], b = d.backlog || [];
    const by = {
      backlog: [[b.map((x) => x.pending)], ["#2a6fdb"]],
      oldest: [[b.map((x) => x.oldest_age_seconds)], ["#b8860b"]],
      published: [[m.map((x) => x.published), m.map((x) => x.duplicates)], ["#2a6fdb", "#c0392b"]],
      worker: [[m.map((x) => x.processed), m.map((x) => x.failed)], ["#27ae60", "#c0392b"]],
      latency: [[m.map((x) => x.latency_p50_seconds), m.map((x) => x.latency_p99_seconds)], ["#2a6fdb", "#8e44ad"]],
    };
    for (const c of charts) {
      const s = by[c.dataset.chart];
      if (s) draw(c, s[0], s[1]);
    }
    for (const el of document.querySelectorAll("[data-figure]")) {
      const k = el.dataset.figure, v = d[k];
      if (v === undefined) continue;
      el.textContent = k === "oldest_age_seconds" ? v.toFixed(1) + " s" : String(v);
      el.parentElement.classList.toggle("bad", (k === "parked" || k === "dead_letters") && v > 0);
    }
    // Every consumer's open dead letters, by name: made of text nodes
    // and a query built by URLSearchParams, never markup from the data.
    const list = document.querySelector("[data-by-consumer]");
    if (list && d.dead_letters_by_consumer) {
      list.replaceChildren(...d.dead_letters_by_consumer.map((x) => {
        const li = document.createElement("li"), a = document.createElement("a");
        a.href = "/console/dead-letters?" + new URLSearchParams({ consumer: x.consumer });
        a.textContent = x.consumer;
        li.append(a, " " + x.open);
        return li;
      }));
    }
    document.body.dataset.updated = String(d.t);
  }

  async function refresh() {
    try {
      const r = await fetch("/console/overview.json", { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (r.ok) render(await r.json());
    } catch (e) {
      // The next refresh tries again; the page keeps its last figures.
    }
  }
  refresh();
  setInterval(refresh, 10000);
})();
