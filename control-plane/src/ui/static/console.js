// Switchyard console: the little the pages need a script for. Every table reads without it.
"use strict";

// Failovers as they happen: the audit log's server-sent events, added at the top of the
// table. Cells are set with textContent, never as markup.
function followEvents(status) {
  const table = document.querySelector("#events tbody");
  if (!table || typeof EventSource === "undefined") return;
  const source = new EventSource(status.dataset.stream);
  source.addEventListener("open", () => { status.textContent = "Live: new events appear at the top as they arrive."; });
  source.addEventListener("error", () => { status.textContent = "Live: reconnecting…"; });
  source.addEventListener("failover", (message) => {
    let event;
    try { event = JSON.parse(message.data); } catch (_) { return; }
    if (table.querySelector(`tr[data-id="${CSS.escape(event.id)}"]`)) return;
    const row = document.createElement("tr");
    row.dataset.id = event.id;
    row.className = "row fresh";
    for (const cell of event.cells) {
      const td = document.createElement("td");
      td.textContent = cell;
      row.appendChild(td);
    }
    const empty = table.querySelector("tr.empty");
    if (empty) empty.remove();
    table.insertBefore(row, table.firstChild);
    while (table.rows.length > 200) table.deleteRow(-1);
  });
}

// Tables that change (nodes, breakers, a drill's verdict) are read again from the page
// itself every two seconds and swapped in place.
function refreshInPlace(parts) {
  const parser = new DOMParser();
  setInterval(async () => {
    if (document.hidden) return;
    let text;
    try {
      const response = await fetch(window.location.href, { credentials: "same-origin", redirect: "manual" });
      if (!response.ok) return;
      text = await response.text();
    } catch (_) { return; }
    const fresh = parser.parseFromString(text, "text/html");
    for (const part of parts) {
      const next = fresh.querySelector(`[data-refresh="${part.dataset.refresh}"]`);
      const current = document.querySelector(`[data-refresh="${part.dataset.refresh}"]`);
      if (next && current && next.innerHTML !== current.innerHTML) {
        current.replaceWith(document.importNode(next, true));
      }
    }
  }, 2000);
}

document.addEventListener("DOMContentLoaded", () => {
  const status = document.querySelector("[data-stream]");
  if (status) followEvents(status);
  const parts = document.querySelectorAll("[data-refresh]");
  if (parts.length) refreshInPlace(Array.from(parts));
});
