// The requests for input waiting anywhere in the open tree (each node's
// pending_requests, from the fold), and their answers: approve or deny an approval,
// send a client tool's result (JSON) or its error. An answer goes, as `helix-mesh
// respond` sends it, to the open session's service with the request's path (the
// inspect process calls SubmitInput with the CLI's credentials).
//
// The list is updated in place, request by request, so what a person is typing in
// one survives the tree being redrawn under it.

import { el, post, pretty } from "./dom.js";

const shown = new Map(); // "session id/request id" -> its <li>

// Draw the pending requests of `tree`; `target()` is { sessionId, address } of the
// open session (where the answer goes).
export function renderRequests(tree, target) {
  const pending = [];
  const walk = (node) => {
    for (const request of node.pending_requests || []) pending.push(request);
    for (const child of node.children) walk(child);
  };
  if (tree) walk(tree);
  const keys = new Set(pending.map(key));
  for (const [k, item] of shown) {
    if (keys.has(k)) continue;
    if (item.dataset.answered === "true") {
      // Answered from this page: its answer's outcome stays in view (the tree may see
      // the request answered before the answer's own reply comes back).
      item.classList.add("answered");
      continue;
    }
    item.remove();
    shown.delete(k);
  }
  const list = document.getElementById("requests");
  for (const request of pending) {
    if (!shown.has(key(request))) {
      const item = requestItem(request, target);
      shown.set(key(request), item);
      list.append(item);
    }
  }
  const answered = [...shown.values()].some((item) => item.dataset.answered === "true");
  document.getElementById("requests-panel").hidden = pending.length === 0 && !answered;
}

export function clearRequests() {
  for (const item of shown.values()) item.remove();
  shown.clear();
  document.getElementById("requests-panel").hidden = true;
}

function key(request) {
  return `${request.session_id}/${request.request_id}`;
}

function requestItem(request, target) {
  const wanted = request.kind === "approval" ? "approval" : "a result (client tool)";
  const result = el("span", { className: "answer-result muted" });
  const item = el(
    "li",
    {
      className: "request",
      data: { requestId: request.request_id, sessionId: request.session_id, kind: request.kind },
    },
    [
      el("div", { className: "request-head" }, [
        el("strong", { text: request.tool_name }),
        ` needs ${wanted} · request ${request.request_id} · session `,
        el("span", { className: "id", text: request.session_id }),
        request.deadline ? ` · expires ${new Date(request.deadline).toLocaleTimeString()}` : "",
      ]),
      el("pre", { className: "arguments", text: pretty(request.arguments) }),
    ],
  );
  const send = async (answer) => {
    item.dataset.answered = "true";
    for (const button of item.querySelectorAll("button")) button.disabled = true;
    result.textContent = "sending…";
    const { sessionId, address } = target();
    try {
      const body = await post("/api/answer", {
        session_id: sessionId,
        address,
        request_id: request.request_id,
        path: request.path,
        ...answer,
      });
      result.textContent = body.applied
        ? `${body.answer}: sent (session ${body.status})`
        : `${body.answer}: already answered so; nothing changed`;
    } catch (error) {
      result.textContent = `answer failed: ${error.message || error}`;
      item.dataset.answered = "";
      for (const button of item.querySelectorAll("button")) button.disabled = false;
    }
  };
  item.append(request.kind === "approval" ? approvalControls(send) : resultControls(send), result);
  return item;
}

function approvalControls(send) {
  const reason = el("input", { className: "reason", attrs: { type: "text", placeholder: "reason (optional)" } });
  const approve = el("button", { className: "approve", text: "Approve", attrs: { type: "button" } });
  const deny = el("button", { className: "deny", text: "Deny", attrs: { type: "button" } });
  approve.addEventListener("click", () => send({ approved: true, reason: reason.value }));
  deny.addEventListener("click", () => send({ approved: false, reason: reason.value }));
  return el("div", { className: "controls" }, [reason, approve, deny]);
}

function resultControls(send) {
  const text = el("textarea", {
    className: "result",
    attrs: { rows: "3", placeholder: "the tool's result as JSON, or an error text", spellcheck: "false" },
  });
  const problem = el("span", { className: "error" });
  const asResult = el("button", { className: "send-result", text: "Send result", attrs: { type: "button" } });
  const asError = el("button", { className: "send-error", text: "Send as error", attrs: { type: "button" } });
  asResult.addEventListener("click", () => {
    try {
      JSON.parse(text.value);
    } catch (error) {
      problem.textContent = `not JSON: ${error.message}`;
      return;
    }
    problem.textContent = "";
    send({ result_json: text.value });
  });
  asError.addEventListener("click", () => send({ error: text.value || "failed" }));
  return el("div", { className: "controls" }, [text, asResult, asError, problem]);
}
