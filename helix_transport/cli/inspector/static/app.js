// helix-mesh inspect: the page. It draws what the CLI process sends (the tree is
// folded there, by helix_transport.tree; each event comes with its kind and its
// one-line summary, and the table of kinds from /api/event-kinds, so no kind's text
// is written here) and never parses data as HTML: every piece of text goes in
// through textContent, since event text is untrusted.
"use strict";

const GUARD_HEADER = "X-Helix-Inspect";
const table = {
  kinds: new Map(), // kind name -> { name, terminal, status } (helix_transport._events)
  statuses: [],
};

const state = {
  sessionId: null,
  source: null,
  tree: null,
  nodes: new Map(), // session id -> node (from the last tree)
  events: new Map(), // session id -> its events, in order: { event, kind, summary }
  selected: null,
};

// --- small helpers ---------------------------------------------------------------

function el(tag, options = {}, children = []) {
  const node = document.createElement(tag);
  if (options.className) node.className = options.className;
  if (options.text !== undefined) node.textContent = String(options.text);
  for (const [key, value] of Object.entries(options.data || {})) node.dataset[key] = value;
  for (const [key, value] of Object.entries(options.attrs || {})) node.setAttribute(key, value);
  node.append(...children);
  return node;
}

function statusClass(status) {
  return table.statuses.includes(status) ? `status-${status}` : "status-unknown";
}

function pretty(value) {
  if (value === null || value === undefined) return "-";
  return typeof value === "string" ? value : JSON.stringify(value, null, 2);
}

function seconds(start, end) {
  if (!start) return null;
  const from = Date.parse(start);
  const to = end ? Date.parse(end) : Date.now();
  return Math.max(to - from, 0) / 1000;
}

function formatDuration(value) {
  if (value === null) return "-";
  if (value < 1) return `${Math.round(value * 1000)} ms`;
  if (value < 60) return `${value.toFixed(1)} s`;
  const minutes = Math.floor(value / 60);
  return `${minutes} min ${String(Math.floor(value % 60)).padStart(2, "0")} s`;
}

function tokens(usage) {
  return (usage && usage.total_tokens ? usage.total_tokens : 0).toLocaleString("en");
}

function hashParams() {
  return new URLSearchParams(location.hash.slice(1));
}

function setHash(sessionId, nodeId) {
  const params = new URLSearchParams();
  if (sessionId) params.set("session", sessionId);
  if (nodeId && nodeId !== sessionId) params.set("node", nodeId);
  history.replaceState(null, "", "#" + params.toString());
}

// --- the service and its sessions ------------------------------------------------

async function loadKinds() {
  try {
    const body = await (await fetch("/api/event-kinds")).json();
    table.kinds = new Map(body.kinds.map((kind) => [kind.name, kind]));
    table.statuses = body.statuses;
  } catch (error) {
    document.getElementById("service").textContent = `cannot read the event kinds (${error})`;
  }
}

async function loadInfo() {
  const target = document.getElementById("service");
  try {
    const reply = await fetch("/api/info");
    const body = await reply.json();
    target.textContent = reply.ok
      ? `${body.address} · ${body.agent.agent_type}`
      : `unreachable: ${body.error}`;
  } catch (error) {
    target.textContent = `the inspect process does not answer (${error})`;
  }
}

async function loadSessions() {
  const roots = document.getElementById("roots-only").checked ? "1" : "0";
  const problem = document.getElementById("sessions-error");
  let body;
  try {
    const reply = await fetch(`/api/sessions?limit=50&roots_only=${roots}`);
    body = await reply.json();
    if (!reply.ok) throw new Error(body.error);
  } catch (error) {
    problem.textContent = `cannot list sessions: ${error.message || error}`;
    problem.hidden = false;
    return;
  }
  problem.hidden = true;
  const rows = body.sessions.map((summary) => {
    const row = el("tr", { data: { sessionId: summary.session_id } }, [
      el("td", { className: `status ${statusClass(summary.status)}`, text: summary.status }),
      el("td", { text: summary.agent_type }),
      el("td", { className: "id", text: summary.session_id, attrs: { title: summary.session_id } }),
      el("td", { text: summary.created_at ? new Date(summary.created_at).toLocaleTimeString() : "-" }),
    ]);
    if (summary.session_id === state.sessionId) row.classList.add("selected");
    row.addEventListener("click", () => openSession(summary.session_id));
    return row;
  });
  document.querySelector("#sessions tbody").replaceChildren(...rows);
}

// --- one session's live tree -----------------------------------------------------

function openSession(sessionId, nodeId) {
  if (state.source) state.source.close();
  state.sessionId = sessionId;
  state.selected = nodeId || sessionId;
  state.tree = null;
  state.events = new Map();
  setHash(sessionId, state.selected);
  document.getElementById("tree-title").textContent = `Tree of ${sessionId}`;
  for (const row of document.querySelectorAll("#sessions tbody tr")) {
    row.classList.toggle("selected", row.dataset.sessionId === sessionId);
  }
  showState("connecting", "");
  const source = new EventSource(`/api/sessions/${encodeURIComponent(sessionId)}/stream`);
  state.source = source;
  // Each connection replays the session from its start: begin again from nothing.
  source.onopen = () => {
    state.events = new Map();
  };
  source.addEventListener("events", (message) => {
    for (const { node, ...entry } of JSON.parse(message.data).events) {
      if (!state.events.has(node)) state.events.set(node, []);
      state.events.get(node).push(entry);
    }
    renderNode();
  });
  source.addEventListener("tree", (message) => {
    state.tree = JSON.parse(message.data).tree;
    renderTree();
    renderNode();
  });
  source.addEventListener("state", (message) => {
    const { state: name, detail } = JSON.parse(message.data);
    showState(name, detail);
    if (name === "ended" || name === "error") source.close(); // else the browser reconnects
  });
  source.onerror = () => {
    if (source.readyState !== EventSource.CLOSED) showState("reconnecting", "to helix-mesh inspect");
  };
}

function showState(name, detail) {
  const target = document.getElementById("tree-state");
  target.className = name;
  target.dataset.state = name;
  const words = {
    connecting: "connecting…",
    live: "live",
    reconnecting: "reconnecting",
    ended: "the session has ended",
    error: "error",
  };
  target.textContent = (words[name] || name) + (detail ? `: ${detail}` : "");
}

function renderTree() {
  state.nodes = new Map();
  const list = document.getElementById("tree");
  const totals = document.getElementById("tree-totals");
  if (!state.tree) {
    list.replaceChildren();
    totals.textContent = "";
    return;
  }
  list.replaceChildren(nodeItem(state.tree));
  const root = state.tree;
  totals.textContent =
    `${state.nodes.size} sessions · ${tokens(root.usage.total)} tokens in all ` +
    `(${tokens(root.usage.own)} the root's own) · ` +
    formatDuration(seconds(root.started_at, root.ended_at));
}

function nodeItem(node) {
  state.nodes.set(node.session_id, node);
  const took = formatDuration(seconds(node.started_at, node.ended_at));
  const own = tokens(node.usage.own);
  const total = tokens(node.usage.total);
  const row = el(
    "div",
    {
      className: `node node-${statusClass(node.status)}`,
      data: { sessionId: node.session_id, status: node.status },
      attrs: { role: "button", tabindex: "0" },
    },
    [
      el("span", { className: "agent", text: node.agent_type || "?" }),
      el("span", { className: "call", text: node.tool_call_id || "" }),
      el("span", { className: `status ${statusClass(node.status)}`, text: node.status }),
      el("span", {
        className: "figures",
        text: `${took} · ${node.step_count} steps completed · ${own} tokens own, ${total} total`,
      }),
    ],
  );
  if (node.session_id === state.selected) row.classList.add("selected");
  row.addEventListener("click", () => selectNode(node.session_id));
  row.addEventListener("keydown", (key) => {
    if (key.key === "Enter") selectNode(node.session_id);
  });
  const item = el("li", {}, [row]);
  if (node.children.length) item.append(el("ul", {}, node.children.map(nodeItem)));
  return item;
}

function selectNode(sessionId) {
  state.selected = sessionId;
  setHash(state.sessionId, sessionId);
  document.getElementById("interrupt-result").textContent = "";
  renderTree();
  renderNode();
}

// --- the selected node -------------------------------------------------------------

function renderNode() {
  const node = state.nodes.get(state.selected);
  document.getElementById("node-empty").hidden = Boolean(node);
  document.getElementById("node").hidden = !node;
  if (!node) return;
  document.getElementById("node-title").textContent = `${node.agent_type} ${node.session_id}`;
  const events = state.events.get(node.session_id) || [];
  const fields = [
    ["status", node.status],
    ["agent", node.agent_type],
    ["session", node.session_id],
    ["tool call", node.tool_call_id || "-"],
    ["service", node.address || "(the inspected one)"],
    ["started", node.started_at || "-"],
    ["ended", node.ended_at || "-"],
    ["duration", formatDuration(seconds(node.started_at, node.ended_at))],
    ["steps completed", node.step_count],
    ["usage (own)", `${tokens(node.usage.own)} tokens`],
    ["usage (total)", `${tokens(node.usage.total)} tokens`],
    ["events", events.length],
  ];
  document.getElementById("node-fields").replaceChildren(
    ...fields.flatMap(([label, value]) => [
      el("dt", { text: label }),
      el("dd", {
        text: value,
        className: label === "status" ? `status ${statusClass(node.status)}` : "",
        attrs: { id: `node-${label.replace(/\W+/g, "-")}` },
      }),
    ]),
  );
  const started = events.find((entry) => entry.kind === "run_started");
  document.getElementById("node-input").textContent = started
    ? pretty(started.event.run_started.input ?? started.event.run_started.input_json)
    : "-";
  document.getElementById("node-output").textContent = pretty(node.output);
  document.getElementById("node-error-box").hidden = !node.error;
  document.getElementById("node-error").textContent = node.error || "";
  // A suspended session can be interrupted as a running one (its requests are cancelled).
  document.getElementById("interrupt").disabled = !["running", "suspended"].includes(node.status);
  renderTimeline(events);
}

function renderTimeline(events) {
  const rows = [];
  const first = events.length ? events[0].event : null;
  const origin = first && first.time ? Date.parse(first.time) : null;
  let text = null; // consecutive text deltas read as one row
  for (const { event, kind, summary } of events) {
    if (kind === "text_delta" && text) {
      text.what.append(summary.lead);
      continue;
    }
    const at = origin !== null && event.time ? `+${formatDuration((Date.parse(event.time) - origin) / 1000)}` : "";
    const lead = el("span", { className: summary.tone ? `lead tone-${summary.tone}` : "lead", text: summary.lead });
    const what = el("span", { className: "what" }, [lead, summary.rest]);
    const row = el("li", { data: { kind, sequence: String(event.sequence) } }, [
      el("span", { className: "at", text: at }),
      el("span", { className: "seq", text: `#${event.sequence}` }),
      el("span", { className: "kind", text: kind.replace(/_/g, " ") }),
      what,
    ]);
    const terminal = table.kinds.has(kind) && table.kinds.get(kind).terminal;
    if (terminal) row.classList.add(summary.tone === "good" ? "terminal" : "bad");
    if (summary.tone === "bad") row.classList.add("bad");
    rows.push(row);
    text = kind === "text_delta" ? { what } : null;
  }
  document.getElementById("timeline").replaceChildren(...rows);
}

async function interruptSelected() {
  const node = state.nodes.get(state.selected);
  const result = document.getElementById("interrupt-result");
  if (!node) return;
  result.textContent = "asking…";
  try {
    const reply = await fetch("/api/interrupt", {
      method: "POST",
      headers: { "Content-Type": "application/json", [GUARD_HEADER]: "1" },
      body: JSON.stringify({
        session_id: node.session_id,
        address: node.address,
        reason: "interrupted from helix-mesh inspect",
      }),
    });
    const body = await reply.json();
    if (!reply.ok) throw new Error(body.error);
    result.textContent = body.accepted ? "interrupt recorded" : `already ${body.status}; nothing changed`;
  } catch (error) {
    result.textContent = `interrupt failed: ${error.message || error}`;
  }
}

// --- start -------------------------------------------------------------------------

async function start() {
  await loadKinds(); // before any event is drawn
  document.getElementById("roots-only").addEventListener("change", loadSessions);
  document.getElementById("interrupt").addEventListener("click", interruptSelected);
  loadInfo();
  loadSessions();
  setInterval(loadSessions, 3000);
  // Running durations move without events.
  setInterval(() => {
    if ([...state.nodes.values()].some((node) => node.status === "running")) {
      renderTree();
      renderNode();
    }
  }, 1000);
  const params = hashParams();
  if (params.get("session")) openSession(params.get("session"), params.get("node"));
}

start();
