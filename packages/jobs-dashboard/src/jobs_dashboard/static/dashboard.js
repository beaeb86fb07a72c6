// jobs-dashboard: live updates, selection helpers and confirmations. Vanilla JS, no build step.
//
// Live updates poll: every second the page fetches its own URL again and swaps each element
// marked data-live whose markup changed (ticked boxes stay ticked; a region holding the field
// being typed in is left alone). Polling stops while the tab is hidden and resumes, at once,
// when it shows again. Server-sent events were rejected: one held connection per open tab, and
// every page would need a second, event-shaped rendering of the same data.
(function () {
  "use strict";

  var INTERVAL_MS = 1000;
  // A request the server never answers must not stop the updates for good: it is abandoned.
  var TIMEOUT_MS = 10000;
  var busy = false;

  function setStatus(text) {
    var el = document.getElementById("live-status");
    if (el) {
      el.textContent = text;
      el.dataset.state = text.split(" ")[0];
    }
  }

  function editing(region) {
    var active = document.activeElement;
    if (!active || active === document.body || !region.contains(active)) return false;
    return active.tagName === "INPUT" || active.tagName === "TEXTAREA" || active.tagName === "SELECT";
  }

  function ticked() {
    var kept = {};
    document.querySelectorAll("input[type=checkbox]:checked").forEach(function (box) {
      kept[box.name + "\u0000" + box.value] = true;
    });
    return kept;
  }

  function retick(kept) {
    document.querySelectorAll("input[type=checkbox]").forEach(function (box) {
      if (kept[box.name + "\u0000" + box.value]) box.checked = true;
    });
  }

  async function refresh() {
    if (document.hidden || busy || !document.querySelector("[data-live][id]")) return;
    busy = true;
    try {
      var response = await fetch(window.location.href, {
        headers: { "X-Dashboard-Live": "1" },
        credentials: "same-origin",
        cache: "no-store",
        signal: AbortSignal.timeout(TIMEOUT_MS),
      });
      if (!response.ok) {
        setStatus("stale (" + response.status + ")");
        return;
      }
      var fresh = new DOMParser().parseFromString(await response.text(), "text/html");
      var kept = ticked();
      fresh.querySelectorAll("[data-live][id]").forEach(function (region) {
        var old = document.getElementById(region.id);
        if (!old || editing(old) || old.innerHTML === region.innerHTML) return;
        old.replaceWith(document.importNode(region, true));
      });
      retick(kept);
      // A poll sent just before the tab was hidden must not claim the page is live again.
      setStatus(document.hidden ? "paused (tab hidden)" : "live");
    } catch (error) {
      setStatus("offline");
    } finally {
      busy = false;
    }
  }

  document.addEventListener("visibilitychange", function () {
    if (document.hidden) {
      setStatus("paused (tab hidden)");
    } else {
      refresh();
    }
  });

  document.addEventListener("submit", function (event) {
    var form = event.target;
    var message = form.dataset ? form.dataset.confirm : null;
    if (message && !window.confirm(message)) event.preventDefault();
  });

  document.addEventListener("change", function (event) {
    var box = event.target;
    if (!box.matches || !box.matches("[data-select-all]")) return;
    document.querySelectorAll("input[type=checkbox][name=id]").forEach(function (row) {
      row.checked = box.checked;
    });
  });

  window.setInterval(refresh, INTERVAL_MS);
})();
