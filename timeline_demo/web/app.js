// Polls /api/timeline every POLL_MS and updates the list in place (no reload): tweets that arrived after the
// first load stay highlighted for NEW_MS.
"use strict";
const POLL_MS = 500;
const NEW_MS = 15000;
const params = new URLSearchParams(location.search);
let user = params.get("user") || "u1";
const limit = params.get("limit") || "50";
let seen = new Map(); // tweet_id -> when first shown (ms), 0 for the first load
let first = true;

document.getElementById("user").value = user;
document.getElementById("pick").addEventListener("submit", (ev) => {
  ev.preventDefault();
  user = document.getElementById("user").value.trim() || user;
  history.replaceState(null, "", "?user=" + encodeURIComponent(user));
  seen = new Map();
  first = true;
  refresh();
});

function render(data) {
  const ol = document.getElementById("timeline");
  const now = Date.now();
  for (const t of data.tweets) if (!seen.has(t.tweet_id)) seen.set(t.tweet_id, first ? 0 : now);
  const items = data.tweets.map((t) => {
    const li = document.createElement("li");
    li.dataset.tweetId = t.tweet_id;
    if (seen.get(t.tweet_id) > 0) li.dataset.arrived = "live"; // came in after the first load
    if (now - seen.get(t.tweet_id) < NEW_MS) li.className = "new";
    const when = t.ts ? new Date(t.ts).toISOString().replace("T", " ").slice(0, 19) : "";
    li.innerHTML = '<span class="id"></span><span class="who"></span><span class="when"></span><div class="text"></div>';
    li.querySelector(".id").textContent = t.tweet_id;
    li.querySelector(".who").textContent = "@" + (t.user_id || "?");
    li.querySelector(".when").textContent = when;
    li.querySelector(".text").textContent = t.text || "";
    return li;
  });
  ol.replaceChildren(...items);
  first = false;
  document.getElementById("status").textContent =
    `@${data.user_id}: ${data.tweets.length} tweets shown, generation ${data.generation}` +
    (data.last_batch_id != null ? `, last batch ${data.last_batch_id}` : "") +
    `, updated ${new Date().toLocaleTimeString()}`;
}

async function refresh() {
  try {
    const r = await fetch(`api/timeline?user=${encodeURIComponent(user)}&limit=${limit}`, { cache: "no-store" });
    if (!r.ok) throw new Error(`HTTP ${r.status}: ${await r.text()}`);
    render(await r.json());
  } catch (e) {
    document.getElementById("status").textContent = "error: " + e.message;
  }
}

refresh();
setInterval(refresh, POLL_MS);
