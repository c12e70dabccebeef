// The services this page may call and the recent sessions of the one picked. The list
// is one server-sent event stream (/api/sessions/watch): the inspect process lists
// the sessions and sends the list again only when it changed; the page never asks on
// a timer.

import { el, replyJson, statusClass } from "./dom.js";

const list = {
  address: null, // the service whose sessions are listed
  inspected: null,
  source: null,
  onOpen: () => {},
  selected: null, // the open session's id, marked in the list
};

export function currentListAddress() {
  return list.address;
}

export function markSelected(sessionId) {
  list.selected = sessionId;
  for (const row of document.querySelectorAll("#sessions tbody tr")) {
    row.classList.toggle("selected", row.dataset.sessionId === sessionId);
  }
}

// Start listing: `onOpen(sessionId, address)` when a row is clicked.
export async function startSessions(onOpen) {
  list.onOpen = onOpen;
  document.getElementById("roots-only").addEventListener("change", () => watch(list.address));
  document.getElementById("service-select").addEventListener("change", (change) => {
    watch(change.target.value);
  });
  await refreshServices();
  watch(list.inspected);
}

// The services the page may call, in the picker: the inspected one, child services
// trees named, services the registry named for an agent type.
export async function refreshServices() {
  let body;
  try {
    body = await replyJson(await fetch("/api/services"));
  } catch (error) {
    document.getElementById("service").textContent = `the inspect process does not answer (${error.message || error})`;
    return;
  }
  list.inspected = body.inspected;
  const picker = document.getElementById("service-select");
  const current = list.address || body.inspected;
  picker.replaceChildren(
    ...body.addresses.map((address) =>
      el("option", { text: address === body.inspected ? `${address} (inspected)` : address, attrs: { value: address } }),
    ),
  );
  picker.value = current;
}

// List the sessions of `address` (the picker follows), from now on.
export async function watch(address) {
  if (!address) return;
  if (list.source) list.source.close();
  if (![...document.getElementById("service-select").options].some((o) => o.value === address)) {
    await refreshServices();
  }
  list.address = address;
  document.getElementById("service-select").value = address;
  describe(address);
  const roots = document.getElementById("roots-only").checked ? "1" : "0";
  const query = new URLSearchParams({ limit: "50", roots_only: roots, address });
  const source = new EventSource(`/api/sessions/watch?${query}`);
  list.source = source;
  const problem = document.getElementById("sessions-error");
  source.addEventListener("sessions", (message) => {
    problem.hidden = true;
    draw(JSON.parse(message.data).sessions);
  });
  const say = (said) => {
    problem.textContent = `cannot list sessions: ${said}`;
    problem.hidden = false;
  };
  source.addEventListener("failure", (message) => say(JSON.parse(message.data).error));
  // The response broke (the browser reconnects by itself).
  source.onerror = () => say("the inspect process does not answer");
}

async function describe(address) {
  const target = document.getElementById("service");
  try {
    const body = await replyJson(await fetch(`/api/info?${new URLSearchParams({ address })}`));
    target.textContent = `${body.agent.agent_type}`;
  } catch (error) {
    target.textContent = `unreachable: ${error.message || error}`;
  }
}

function draw(sessions) {
  const rows = sessions.map((summary) => {
    const row = el("tr", { data: { sessionId: summary.session_id, status: summary.status } }, [
      el("td", { className: `status ${statusClass(summary.status)}`, text: summary.status }),
      el("td", { text: summary.agent_type }),
      el("td", { className: "id", text: summary.session_id, attrs: { title: summary.session_id } }),
      el("td", { text: summary.created_at ? new Date(summary.created_at).toLocaleTimeString() : "-" }),
    ]);
    if (summary.session_id === list.selected) row.classList.add("selected");
    row.addEventListener("click", () => list.onOpen(summary.session_id, list.address));
    return row;
  });
  document.querySelector("#sessions tbody").replaceChildren(...rows);
}
