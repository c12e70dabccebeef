// The official @a2a-js/sdk client against a helix-mesh service's A2A endpoint.
// Run by tests/interop/test_a2a_js.py; prints one JSON line per result.
//
//   node client.mjs delegate URL      stream to input-required, approve, stream to the end
//   node client.mjs start URL         stream, printing the task id, then each event's sequence
//   node client.mjs resubscribe URL TASK   resubscribe; the sequences and the last state
//   node client.mjs cancel URL        stream to input-required, then cancel the task
import { randomUUID } from "node:crypto";
import { ClientFactory } from "@a2a-js/sdk/client";
import { Role, TaskState } from "@a2a-js/sdk";

const [mode, url, taskId] = process.argv.slice(2);
const client = await new ClientFactory().createFromUrl(url);

function message(fields) {
  return {
    messageId: randomUUID(),
    contextId: "",
    taskId: "",
    role: Role.ROLE_USER,
    parts: [],
    metadata: undefined,
    extensions: [],
    referenceTaskIds: [],
    ...fields,
  };
}

function request(fields) {
  return { tenant: "", message: message(fields), configuration: undefined, metadata: undefined };
}

function ask(text) {
  return request({ parts: [{ content: { $case: "text", value: text } }] });
}

function approve(task) {
  const answer = { approved: true, reason: "from node" };
  return request({ taskId: task, parts: [{ content: { $case: "data", value: answer } }] });
}

// The helix metadata of a status or artifact update; undefined for the task itself.
function helix(event) {
  const payload = event.payload;
  if (payload?.$case === "statusUpdate" || payload?.$case === "artifactUpdate") {
    return payload.value.metadata?.helix;
  }
  return undefined;
}

async function collect(stream, onEvent = () => {}) {
  const seen = { task: undefined, sequences: [], depths: new Set(), state: undefined, data: undefined };
  for await (const event of stream) {
    if (event.payload?.$case === "task") seen.task = event.payload.value.id;
    const h = helix(event);
    if (h) {
      // An update of joined text deltas covers first_sequence .. sequence.
      for (let n = Number(h.first_sequence ?? h.sequence); n <= Number(h.sequence); n++) {
        seen.sequences.push(n);
      }
      seen.depths.add(h.path.length);
      onEvent(Number(h.sequence));
    }
    if (event.payload?.$case === "statusUpdate") {
      const status = event.payload.value.status;
      seen.state = TaskState[status.state];
      const first = status.message?.parts?.[0]?.content;
      seen.data = first?.$case === "data" ? first.value : undefined;
    }
  }
  return { ...seen, depths: [...seen.depths].sort() };
}

function print(value) {
  process.stdout.write(JSON.stringify(value) + "\n");
}

if (mode === "delegate") {
  const asked = await collect(client.sendMessageStream(ask("mail ops@example.com from node")));
  print({ step: "asked", ...asked });
  const done = await collect(client.sendMessageStream(approve(asked.task)));
  const task = await client.getTask({ id: asked.task });
  print({ step: "done", ...done, final: TaskState[task.status.state], output: task.artifacts[0]?.parts[0]?.content?.value });
} else if (mode === "start") {
  for await (const event of client.sendMessageStream(ask("mail ops@example.com from node, killed"))) {
    if (event.payload?.$case === "task") print({ step: "task", task: event.payload.value.id });
    const h = helix(event);
    if (h) print({ step: "event", sequence: Number(h.sequence) });
  }
} else if (mode === "resubscribe") {
  const seen = await collect(client.resubscribeTask({ id: taskId }));
  print({ step: "resubscribed", ...seen });
  const done = await collect(client.sendMessageStream(approve(taskId)));
  print({ step: "done", ...done });
} else if (mode === "cancel") {
  const asked = await collect(client.sendMessageStream(ask("mail ops@example.com to cancel")));
  const task = await client.cancelTask({ id: asked.task });
  print({ step: "canceled", task: asked.task, path: asked.data?.input_required?.[0]?.path, state: TaskState[task.status.state] });
} else {
  throw new Error(`unknown mode ${mode}`);
}
