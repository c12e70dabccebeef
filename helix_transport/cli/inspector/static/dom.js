// Small helpers every part of the page shares: building elements (text always through
// textContent: event text is untrusted), formatting, the table of kinds, and the one
// way to send a call that changes something (with the header the inspect process
// requires of it).

export const GUARD_HEADER = "X-Helix-Inspect";

export const table = {
  kinds: new Map(), // kind name -> { name, terminal, status } (helix_transport._events)
  statuses: [],
};

export function el(tag, options = {}, children = []) {
  const node = document.createElement(tag);
  if (options.className) node.className = options.className;
  if (options.text !== undefined) node.textContent = String(options.text);
  for (const [key, value] of Object.entries(options.data || {})) node.dataset[key] = value;
  for (const [key, value] of Object.entries(options.attrs || {})) node.setAttribute(key, value);
  node.append(...children);
  return node;
}

export function statusClass(status) {
  return table.statuses.includes(status) ? `status-${status}` : "status-unknown";
}

export function pretty(value) {
  if (value === null || value === undefined) return "-";
  return typeof value === "string" ? value : JSON.stringify(value, null, 2);
}

export function seconds(start, end) {
  if (!start) return null;
  const from = Date.parse(start);
  const to = end ? Date.parse(end) : Date.now();
  return Math.max(to - from, 0) / 1000;
}

export function formatDuration(value) {
  if (value === null) return "-";
  if (value < 1) return `${Math.round(value * 1000)} ms`;
  if (value < 60) return `${value.toFixed(1)} s`;
  const minutes = Math.floor(value / 60);
  return `${minutes} min ${String(Math.floor(value % 60)).padStart(2, "0")} s`;
}

export function tokens(usage) {
  return (usage && usage.total_tokens ? usage.total_tokens : 0).toLocaleString("en");
}

export async function loadKinds() {
  const body = await (await fetch("/api/event-kinds")).json();
  table.kinds = new Map(body.kinds.map((kind) => [kind.name, kind]));
  table.statuses = body.statuses;
}

// A JSON reply's body, or an Error with the message the inspect process gave.
export async function replyJson(reply) {
  const body = await reply.json();
  if (!reply.ok) throw new Error(body.error || `HTTP ${reply.status}`);
  return body;
}

// POST a call that changes something (interrupt, answer) to the inspect process.
export async function post(path, body) {
  const reply = await fetch(path, {
    method: "POST",
    headers: { "Content-Type": "application/json", [GUARD_HEADER]: "1" },
    body: JSON.stringify(body),
  });
  return replyJson(reply);
}
