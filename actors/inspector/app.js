// pi-host inspector: plain JavaScript, served by the host on its own port (same origin as the
// gateway). The token lives only in this page's memory: it is never put in a URL, never stored.
"use strict";

const $ = (id) => document.getElementById(id);
const state = {
  ws: null, token: null, nextId: 1, pending: new Map(), clientId: "inspector-" + randomHex(6),
  session: null, start: 0, sessionSub: null, live: new Map(), query: "", titles: new Map(),
};

function randomHex(bytes) {
  const a = new Uint8Array(bytes);
  crypto.getRandomValues(a);
  return Array.from(a, (b) => b.toString(16).padStart(2, "0")).join("");
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else if (k === "onclick") node.addEventListener("click", v);
    else node[k] = v;
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

// Untrusted text is only ever inserted as text nodes; <mark> wraps each match of the query.
function highlighted(text, query) {
  const frag = document.createDocumentFragment();
  const q = query.trim().toLowerCase();
  if (!q) { frag.append(text); return frag; }
  const lower = text.toLowerCase();
  let at = 0;
  for (;;) {
    const i = lower.indexOf(q, at);
    if (i < 0) break;
    frag.append(text.slice(at, i), el("mark", {}, text.slice(i, i + q.length)));
    at = i + q.length;
  }
  frag.append(text.slice(at));
  return frag;
}

function setStatus(text, kind) {
  const s = $("status");
  s.textContent = text;
  s.className = "status " + (kind || "");
}

// -- JSON-RPC over the WebSocket -----------------------------------------------------------
function call(method, params) {
  return new Promise((resolve, reject) => {
    const id = state.nextId++;
    state.pending.set(id, { resolve, reject });
    state.ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params: params || {} }));
  });
}

function onFrame(event) {
  const message = JSON.parse(event.data);
  for (const item of Array.isArray(message) ? message : [message]) {
    if (item.method === "event" && item.id === undefined) { onEvent(item.params); continue; }
    const slot = state.pending.get(item.id);
    if (!slot) continue;
    state.pending.delete(item.id);
    if (item.error) {
      const data = item.error.data || {};
      const err = new Error(`${data.code || "ERROR"}: ${item.error.message}`);
      err.code = data.code;
      slot.reject(err);
    } else slot.resolve(item.result);
  }
}

// One reconnect chain at most: a timer is armed only when none is armed and no attempt is under
// way, and only after a connection is lost (ws.onclose of the live socket) or an attempt failed.
// The delay doubles from RETRY_BASE_MS up to RETRY_CAP_MS, with jitter (a random point in the upper
// half), and resets once an attempt succeeds; a refused token (1008 / UNAUTHENTICATED) stops it.
const RETRY_BASE_MS = 1000;
const RETRY_CAP_MS = 10000;
const retry = { timer: null, attempt: 0, busy: false, stopped: false };

function connect(token) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`ws://${location.host}/`);
    state.ws = ws;
    let opened = false;
    ws.onmessage = onFrame;
    ws.onerror = () => reject(new Error("the host refused the connection"));
    ws.onclose = (ev) => {
      reject(new Error(`connection closed (${ev.code})`));
      if (ws !== state.ws) return;
      for (const slot of state.pending.values()) slot.reject(new Error("connection closed"));
      state.pending.clear();
      if (!state.token) return;  // still on the login form: login() reports the failure
      if (ev.code === 1008) { stopRetrying(`the host refused this page (${ev.reason || "policy"}); log in again`); return; }
      if (opened) {
        setStatus(`disconnected (${ev.code}${ev.reason ? " " + ev.reason : ""})`, "bad");
        scheduleReconnect();
      }
    };
    ws.onopen = () => {
      opened = true;
      call("host.hello", { token, clientId: state.clientId, clientKind: "ui", protocol: 1 })
        .then((hello) => resolve(hello), reject);
    };
  });
}

function stopRetrying(why) {
  retry.stopped = true;
  if (retry.timer !== null) clearTimeout(retry.timer);
  retry.timer = null;
  setStatus(why, "bad");
}

function scheduleReconnect() {
  if (retry.timer !== null || retry.busy || retry.stopped || !state.token) return;
  const ceiling = Math.min(RETRY_CAP_MS, RETRY_BASE_MS * 2 ** retry.attempt);
  const delay = ceiling / 2 + Math.random() * (ceiling / 2);
  retry.attempt += 1;
  setStatus(`waiting for a host on ${location.host}; attempt ${retry.attempt} in ${(delay / 1000).toFixed(1)} s`, "bad");
  retry.timer = setTimeout(() => { retry.timer = null; reconnect(); }, delay);
}

async function reconnect() {
  retry.busy = true;
  try {
    await connect(state.token);
  } catch (err) {
    retry.busy = false;
    if (err.code === "UNAUTHENTICATED") stopRetrying("the host refused the token; log in again");
    else scheduleReconnect();
    return;
  }
  retry.busy = false;
  const attempts = retry.attempt;
  retry.attempt = 0;
  try {
    await afterLogin();
    setStatus(`reconnected after ${attempts} attempt(s)`, "ok");
  } catch (err) {
    setStatus(String(err.message || err), "bad");  // a drop while reloading: its onclose retries
  }
}

// -- login ---------------------------------------------------------------------------------
async function login(token) {
  const hello = await connect(token);
  state.token = token;
  retry.stopped = false;
  retry.attempt = 0;
  $("login").hidden = true;
  $("app").hidden = false;
  $("search-form").hidden = false;
  setStatus(`connected · host ${hello.hostVersion}`, "ok");
  await afterLogin();
}

async function afterLogin() {
  setStatus("connected", "ok");
  await call("events.subscribe", {
    topics: ["session.created", "session.updated", "session.deleted", "notification.created",
             "plan.requested", "plan.resolved", "approval.requested", "approval.resolved",
             "interaction.requested", "interaction.resolved"],
  });
  await Promise.all([loadSessions(), loadNotifications(), loadApprovals()]);
  if (state.session) await openSession(state.session, { keepWindow: false });
}

async function exchangeCode(code) {
  const response = await fetch("/login", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ code }),
    credentials: "omit", cache: "no-store",
  });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || `login refused (${response.status})`);
  return body.token;
}

// -- lists ---------------------------------------------------------------------------------
// Events arrive faster than the reads they trigger answer: two loads of one list may be in flight, and the
// older one may answer last. Only the newest load of each list is drawn (an older answer would put back
// what the newer one already saw change: a question asked between the two reads vanished for good).
const loads = new Map();
function newest(list) {
  const mine = (loads.get(list) || 0) + 1;
  loads.set(list, mine);
  return () => loads.get(list) === mine;
}

async function loadSessions() {
  const current = newest("sessions");
  const res = await call("session.list", { limit: 200 });
  if (!current()) return;
  for (const s of res.sessions) state.titles.set(s.id, s.title || "(untitled)");
  const list = $("sessions");
  list.replaceChildren(...res.sessions.map((s) => el("li", {
    "data-id": s.id, class: s.id === state.session ? "active" : "", onclick: () => openSession(s.id),
  }, el("span", { class: "count" }, s.messageCount), s.title || "(untitled)")));
}

async function loadNotifications() {
  const current = newest("notifications");
  const res = await call("notifications.list", { limit: 20 });
  if (!current()) return;
  $("unread").textContent = res.unreadCount ? `(${res.unreadCount} unread)` : "";
  $("notifications").replaceChildren(...res.notifications.map((n) =>
    el("li", {}, `${n.kind}: ${n.sessionTitle || n.sessionId}`)));
}

async function loadApprovals() {
  // Everything waiting for the user: tool permissions (answered here), questions, plans/goals.
  const current = newest("approvals");
  const [tools, questions, plans] = await Promise.all([
    call("approvals.pending", {}), call("interactions.pending", {}), call("plans.pending", {}),
  ]);
  if (!current()) return;
  const rows = [
    ...tools.pending.map((r) => el("li", { class: "approval", "data-request": r.requestId },
      `permission in ${titleOf(r.sessionId)}: ${r.argsSummary || r.tool} (risk ${r.risk}) `,
      ...r.options.map((o) => el("button", {
        class: `answer ${o.decision}`, "data-option": o.id, title: o.label,
        onclick: () => answerApproval(r, o.id),
      }, o.label)))),
    ...questions.pending.map((r) => el("li", { class: "question", "data-request": r.requestId },
      `question in ${titleOf(r.sessionId)}: ${r.question}` +
      (r.choices.length ? ` [${r.choices.map((c) => c.label).join(" / ")}]` : ""))),
    ...plans.pending.map((a) => el("li", { class: "plan", "data-request": a.requestId },
      `${a.kind} in ${titleOf(a.sessionId)}: ${a.title || a.requestId}`)),
  ];
  $("approvals").replaceChildren(...(rows.length ? rows : [el("li", {}, "none")]));
}

function titleOf(sessionId) {
  return state.titles.get(sessionId) || sessionId;
}

async function answerApproval(request, optionId) {
  try {
    await call("approvals.respond", { sessionId: request.sessionId, requestId: request.requestId, optionId });
  } catch (err) {
    setStatus(String(err.message || err), "bad");
  }
  await loadApprovals();
}

// -- one session -----------------------------------------------------------------------------
function blockText(b) {
  if (b.type === "text") return b.text;
  if (b.type === "tool_call") return null;
  if (b.type === "thinking") return "";
  return `[${b.type}]`;
}

function renderMessage(m, live) {
  const tags = [];
  const meta = m.meta || {};
  if (meta.interrupted) tags.push(el("span", { class: "tag" }, "interrupted"));
  if (live) tags.push(el("span", { class: "tag" }, "streaming"));
  if (m.deleted) tags.push(el("span", { class: "tag" }, "deleted"));
  const body = [];
  for (const b of m.blocks || []) {
    const text = blockText(b);
    if (text === null) {
      body.push(el("span", { class: "tool" }, `tool ${b.name}(${JSON.stringify(b.args || {})}) ${b.status || ""}: ` +
        String(b.result ?? "").slice(0, 300)));
    } else if (text) body.push(highlighted(text, state.query));
  }
  return el("li", { class: `msg ${m.role}${live ? " live" : ""}`, "data-id": m.id, "data-seq": m.seq || "" },
    el("span", { class: "who" }, `${m.seq ? "#" + m.seq + " " : ""}${m.role}`, ...tags), ...body);
}

function renderLive() {
  const shown = new Set(Array.from($("messages").children, (li) => li.dataset.id));
  $("live").replaceChildren(...Array.from(state.live.values())
    .filter((m) => !shown.has(m.id)).map((m) => renderMessage(m, true)));
}

async function openSession(id, opts) {
  const changed = id !== state.session;
  state.session = id;
  for (const li of $("sessions").children) li.classList.toggle("active", li.dataset.id === id);
  if (changed) state.live.clear();
  const page = await call("session.get", { sessionId: id, messageLimit: 30 });
  $("session-title").textContent = page.session.title || id;
  showWindow(page, false);
  if (state.sessionSub) {
    try { await call("events.unsubscribe", { subscriptionId: state.sessionSub }); } catch (err) { /* gone */ }
  }
  const sub = await call("events.subscribe", {
    topics: ["session.message", "session.inflight", "session.queue", "turn.started", "turn.ended"], sessionId: id,
  });
  state.sessionSub = sub.subscriptionId;
  await Promise.all([loadQueue(), loadBranches()]);
}

function showWindow(page, prepend) {
  state.start = page.messageStart;
  const items = page.messages.map((m) => renderMessage(m, false));
  if (prepend) $("messages").prepend(...items);
  else $("messages").replaceChildren(...items);
  $("older").hidden = !page.hasMoreBefore;
  // one numbering, the messages' own seq (#1 is the first message; the wire's messageStart is #first - 1)
  const shown = $("messages");
  $("window-info").textContent = shown.children.length
    ? `messages #${shown.firstElementChild.dataset.seq}–#${shown.lastElementChild.dataset.seq} of ${page.totalMessages}`
    : `no messages (of ${page.totalMessages})`;
  $("compactions").replaceChildren(...(page.compactions.length ? page.compactions.map((c) =>
    el("li", {}, `${c.id}: through ${c.throughMessageId} (${c.tokensBefore} tokens) — ${c.summary}`))
    : [el("li", {}, "none")]));
  renderLive();
}

async function loadOlder() {
  const page = await call("session.get", { sessionId: state.session, messageBefore: state.start, messageLimit: 30 });
  showWindow(page, true);
}

async function loadQueue() {
  const q = await call("session.queueList", { sessionId: state.session });
  $("queue").replaceChildren(...(q.entries.length ? q.entries.map((e) => el("li", {}, e.content))
    : [el("li", {}, q.held ? "empty (held: no agent attached)" : "empty")]));
}

async function loadBranches() {
  const r = await call("session.listRevisions", { sessionId: state.session });
  $("branches").replaceChildren(...(r.revisions.length ? r.revisions.map((b) =>
    el("li", {}, `${b.rootUserId} #${b.revisionIndex}: ${b.messageCount} messages${b.isActive ? " (live)" : ""}`))
    : [el("li", {}, "none")]));
}

// -- events ----------------------------------------------------------------------------------
function onEvent(ev) {
  const data = ev.data || {};
  switch (ev.topic) {
    case "session.inflight":
      if (ev.sessionId === state.session && data.message) {
        state.live.set(data.message.id, data.message);
        renderLive();
      }
      break;
    case "session.message":
      if (ev.sessionId === state.session) {
        state.live.delete(data.message.id);
        refreshWindow();
      }
      break;
    case "session.queue":
      if (ev.sessionId === state.session) loadQueue();
      break;
    case "turn.ended":
      if (ev.sessionId === state.session) refreshWindow();
      break;
    case "session.created": case "session.updated": case "session.deleted":
      loadSessions();
      break;
    case "notification.created":
      loadNotifications();
      break;
    case "plan.requested": case "plan.resolved":
    case "approval.requested": case "approval.resolved":
    case "interaction.requested": case "interaction.resolved":
      loadApprovals();
      break;
  }
}

let refreshing = null;
function refreshWindow() {
  if (refreshing) return;
  refreshing = setTimeout(async () => {
    refreshing = null;
    const page = await call("session.get", { sessionId: state.session, messageLimit: 30 });
    showWindow(page, false);
  }, 50);
}

// -- search ------------------------------------------------------------------------------------
async function search(query) {
  state.query = query;
  const box = $("search-results");
  if (!query.trim()) { box.hidden = true; return; }
  const res = await call("search.sessions", { query, limit: 20 });
  box.hidden = false;
  box.replaceChildren(el("h2", {}, `${res.totalMessageMatches} matching messages in ${res.totalSessions} sessions`),
    ...res.results.flatMap((r) => [
      el("div", { class: "hit", "data-session": r.sessionId, onclick: () => openSession(r.sessionId) },
        el("strong", {}, highlighted(r.title || r.sessionId, query)), ` — ${r.messageMatches} matches`),
      ...r.snippets.map((s) => el("div", {
        class: "hit snippet", "data-session": r.sessionId, onclick: () => openAround(r.sessionId, s.messageId),
      }, `#${s.seq} ${s.role}: `, highlighted(s.snippet, query))),
    ]));
}

async function openAround(sessionId, messageId) {
  await openSession(sessionId);
  const page = await call("session.get", { sessionId, messageAround: messageId, messageLimit: 30 });
  showWindow(page, false);
}

// -- start -------------------------------------------------------------------------------------
$("login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const input = $("token-input");
  const token = input.value.trim();
  input.value = "";
  try { await login(token); } catch (err) { $("login-error").textContent = String(err.message || err); }
});
$("search-form").addEventListener("submit", (ev) => { ev.preventDefault(); search($("search-input").value); });
$("older").addEventListener("click", () => loadOlder());

(async () => {
  const match = location.hash.match(/^#code=([A-Za-z0-9_-]+)$/);
  if (match) {
    history.replaceState(null, "", location.pathname);  // the code leaves the address bar at once
    try { await login(await exchangeCode(match[1])); } catch (err) {
      $("login-error").textContent = String(err.message || err);
    }
  }
})();
