// helix-mesh inspect: the page. It draws what the CLI process sends (the tree is
// folded there, by helix_transport.tree; each event comes with its kind and its
// one-line summary, and the table of kinds from /api/event-kinds, so no kind's text
// is written here) and never parses data as HTML: every piece of text goes in
// through textContent, since event text is untrusted.
//
// Modules: dom.js (helpers, the guarded POST), sessions.js (the services and the
// session list, as a stream of changes), answers.js (requests for input and their
// answers); this one opens a session's tree and shows its nodes.

import { clearRequests, renderRequests } from "./answers.js";
import { el, formatDuration, loadKinds, post, pretty, replyJson, seconds, statusClass, table, tokens } from "./dom.js";
import { currentListAddress, markSelected, startSessions, watch } from "./sessions.js";

const state = {
  sessionId: null,
  address: null, // the service of the open session: where its stream, answers go
  source: null,
  tree: null,
  nodes: new Map(), // session id -> node (from the last tree)
  events: new Map(), // session id -> its events, in order: { event, kind, summary }
  selected: null,
  trail: [], // the sessions opened before this one on other services: { sessionId, address }
  inspected: null,
};

function hashParams() {
  return new URLSearchParams(location.hash.slice(1));
}

function setHash() {
  const params = new URLSearchParams();
  if (state.sessionId) params.set("session", state.sessionId);
  if (state.selected && state.selected !== state.sessionId) params.set("node", state.selected);
  if (state.address && state.address !== state.inspected) params.set("address", state.address);
  history.replaceState(null, "", "#" + params.toString());
}

// --- one session's live tree -----------------------------------------------------

// Open `sessionId` on the service at `address` (the inspected one when not given).
function openSession(sessionId, { address = null, nodeId = null, trail = null } = {}) {
  if (state.source) state.source.close();
  state.sessionId = sessionId;
  state.address = address || state.inspected;
  state.selected = nodeId || sessionId;
  state.tree = null;
  state.events = new Map();
  if (trail !== null) state.trail = trail;
  clearRequests();
  setHash();
  document.getElementById("tree-title").textContent = `Tree of ${sessionId}`;
  document.getElementById("tree-where").hidden = state.address === state.inspected && !state.trail.length;
  document.getElementById("tree-address").textContent = `on ${state.address}`;
  document.getElementById("back").hidden = !state.trail.length;
  markSelected(sessionId);
  showState("connecting", "");
  const query = new URLSearchParams({ address: state.address });
  const source = new EventSource(`/api/sessions/${encodeURIComponent(sessionId)}/stream?${query}`);
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
    renderRequests(state.tree, () => ({ sessionId: state.sessionId, address: state.address }));
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
  totals.dataset.tokens = String(root.usage.total.total_tokens);
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
      data: { sessionId: node.session_id, status: node.status, tokens: String(node.usage.total.total_tokens) },
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
  setHash();
  document.getElementById("interrupt-result").textContent = "";
  document.getElementById("elsewhere-result").textContent = "";
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
    ["service", node.address || (node.session_id === state.sessionId ? state.address : "its parent's")],
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
  // A child has a log of its own on its service: open it there (the service its
  // parent logged, or the one the registry names for its agent type).
  document.getElementById("elsewhere").hidden = node.session_id === state.sessionId;
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

// The service of `node`: the one its parent logged; else the open session's for the
// root, and the one the registry names for its agent type for a child.
async function serviceOf(node) {
  if (node.address) return node.address;
  if (node.session_id === state.sessionId) return state.address;
  const query = new URLSearchParams({ agent_type: node.agent_type });
  return (await replyJson(await fetch(`/api/resolve?${query}`))).address;
}

async function interruptSelected() {
  const node = state.nodes.get(state.selected);
  const result = document.getElementById("interrupt-result");
  if (!node) return;
  result.textContent = "asking…";
  try {
    const body = await post("/api/interrupt", {
      session_id: node.session_id,
      address: node.address || state.address,
      reason: "interrupted from helix-mesh inspect",
    });
    result.textContent = body.accepted ? "interrupt recorded" : `already ${body.status}; nothing changed`;
  } catch (error) {
    result.textContent = `interrupt failed: ${error.message || error}`;
  }
}

async function openSelectedElsewhere() {
  const node = state.nodes.get(state.selected);
  const result = document.getElementById("elsewhere-result");
  if (!node) return;
  let address;
  try {
    address = await serviceOf(node);
  } catch (error) {
    result.textContent = `no service for ${node.agent_type}: ${error.message || error}`;
    return;
  }
  const trail = [...state.trail, { sessionId: state.sessionId, address: state.address }];
  openSession(node.session_id, { address, trail });
  if (currentListAddress() !== address) watch(address);
}

function back() {
  const trail = [...state.trail];
  const previous = trail.pop();
  if (!previous) return;
  openSession(previous.sessionId, { address: previous.address, trail });
  if (currentListAddress() !== previous.address) watch(previous.address);
}

// --- start -------------------------------------------------------------------------

async function start() {
  try {
    await loadKinds(); // before any event is drawn
  } catch (error) {
    document.getElementById("service").textContent = `cannot read the event kinds (${error})`;
  }
  document.getElementById("interrupt").addEventListener("click", interruptSelected);
  document.getElementById("open-elsewhere").addEventListener("click", openSelectedElsewhere);
  document.getElementById("back").addEventListener("click", back);
  await startSessions((sessionId, address) => openSession(sessionId, { address, trail: [] }));
  state.inspected = (await replyJson(await fetch("/api/services"))).inspected;
  // Running durations move without events.
  setInterval(() => {
    if ([...state.nodes.values()].some((node) => node.status === "running")) {
      renderTree();
      renderNode();
    }
  }, 1000);
  const params = hashParams();
  if (params.get("session")) {
    const address = params.get("address");
    if (address) await watch(address);
    openSession(params.get("session"), { address, nodeId: params.get("node") });
  }
}

start();
