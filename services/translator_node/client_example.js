#!/usr/bin/env node
'use strict';
// A Node.js client of any helix-mesh agent service (here: a Python one), straight
// from the proto: start a session, stream it, drop the connection on purpose after
// a few events, reconnect with `from_sequence` = the last sequence seen, and read
// on to the terminal event. It checks what the contract promises: every sequence
// from 1 to the terminal event, each exactly once, in order.
//
//   node client_example.js ADDRESS INPUT_JSON [--drop-after N] [--session-id ID]
//   node client_example.js 127.0.0.1:50061 '{"topic": "event log replay"}' --drop-after 5
//
// Prints one summary line; exits 0 when the log was whole, 1 on a gap, a duplicate
// or an error, 2 on bad arguments.

const path = require('node:path');

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_ROOT = path.resolve(__dirname, '..', '..', 'proto');
const TERMINAL = ['completed', 'failed', 'interrupted', 'terminated'];
const RETRYABLE = [grpc.status.UNAVAILABLE, grpc.status.CANCELLED, grpc.status.INTERNAL, grpc.status.UNKNOWN];

const { AgentService } = grpc.loadPackageDefinition(
  protoLoader.loadSync('helix/agent/v1/agent.proto', {
    includeDirs: [PROTO_ROOT],
    keepCase: true,
    longs: Number,
    enums: String,
    defaults: true,
    oneofs: true,
  }),
).helix.agent.v1;

function usage(message) {
  process.stderr.write(
    `client_example: ${message}\nusage: node client_example.js ADDRESS INPUT_JSON [--drop-after N] [--session-id ID]\n`,
  );
  process.exit(2);
}

function parseArgs(argv) {
  const positional = [];
  const options = { dropAfter: 5, sessionId: '' };
  for (let i = 0; i < argv.length; i += 1) {
    if (argv[i] === '--drop-after') options.dropAfter = Number(argv[++i]);
    else if (argv[i] === '--session-id') options.sessionId = argv[++i] || '';
    else if (argv[i].startsWith('--')) usage(`unknown option ${argv[i]}`);
    else positional.push(argv[i]);
  }
  if (positional.length !== 2) usage('ADDRESS and INPUT_JSON are required');
  if (!Number.isInteger(options.dropAfter) || options.dropAfter < 1) usage('--drop-after must be a positive integer');
  [options.address, options.input] = positional;
  return options;
}

const connect = (address) => new AgentService(address, grpc.credentials.createInsecure());

function unary(client, method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: Date.now() + 10_000 }, (err, reply) => (err ? reject(err) : resolve(reply)));
  });
}

const kindOf = (event) => event.payload;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * One Stream call from `from`. Feeds every event to `onEvent`; after `dropAfter`
 * events (if set) it drops the connection itself: cancels the call and closes the
 * client's channel. Resolves with how the call ended.
 */
function streamOnce(client, sessionId, from, onEvent, dropAfter) {
  return new Promise((resolve) => {
    let received = 0;
    let settled = false;
    const settle = (outcome) => {
      if (!settled) {
        settled = true;
        resolve(outcome);
      }
    };
    const call = client.Stream({ session_id: sessionId, from_sequence: from });
    call.on('data', (response) => {
      if (settled) return;
      for (const event of response.events) {
        received += 1;
        if (onEvent(event)) return settle({ end: 'terminal' });
      }
      if (dropAfter && received >= dropAfter) {
        call.cancel();
        client.close();
        settle({ end: 'dropped', received });
      }
    });
    call.on('error', (err) => settle({ end: 'error', error: err }));
    call.on('end', () => settle({ end: 'eof' }));
  });
}

async function main() {
  const options = parseArgs(process.argv.slice(2));
  let client = connect(options.address);
  const started = await unary(client, 'Start', { session_id: options.sessionId, input_json: options.input });
  const sessionId = started.session_id;

  const seen = [];
  const problems = [];
  let last = 0;
  let terminal = null;
  const onEvent = (event) => {
    seen.push(event.sequence);
    if (event.sequence <= last) problems.push(`duplicate: sequence ${event.sequence} after ${last}`);
    else if (event.sequence !== last + 1) problems.push(`gap: sequence ${event.sequence} after ${last}`);
    last = Math.max(last, event.sequence);
    if (TERMINAL.includes(kindOf(event))) terminal = event;
    return terminal !== null;
  };

  let dropped = null;
  let reconnects = 0;
  for (let attempt = 0; terminal === null; attempt += 1) {
    const outcome = await streamOnce(client, sessionId, last, onEvent, dropped === null ? options.dropAfter : 0);
    if (outcome.end === 'terminal') break;
    if (outcome.end === 'dropped') {
      dropped = last;
    } else if (outcome.end === 'error' && !RETRYABLE.includes(outcome.error.code)) {
      throw outcome.error;
    } else if (attempt > 50) {
      throw new Error(`gave up reconnecting: ${outcome.error ? outcome.error.message : outcome.end}`);
    } else {
      await sleep(Math.min(1000, 50 * 2 ** Math.min(attempt, 5))); // a break: back off, then resume
    }
    // Reconnect on a new channel and continue right after the last sequence seen.
    client.close();
    client = connect(options.address);
    reconnects += 1;
  }

  const status = await unary(client, 'GetStatus', { session_id: sessionId });
  client.close();
  const n = terminal.sequence;
  const whole = seen.length === n && seen.every((sequence, i) => sequence === i + 1);
  if (!whole && problems.length === 0) problems.push(`saw ${seen.length} events for sequences 1..${n}`);
  if (status.last_sequence !== n) problems.push(`GetStatus.last_sequence is ${status.last_sequence}, the stream ended at ${n}`);
  if (dropped === null) problems.push(`the session ended before ${options.dropAfter} events: nothing was dropped`);

  const what =
    `session ${sessionId} (${started.agent_type}): ${seen.length} events, ended ${kindOf(terminal)}; ` +
    `dropped the connection after sequence ${dropped}, reconnected ${reconnects} time(s)`;
  if (problems.length > 0) {
    process.stdout.write(`client_example: FAILED ${what}: ${problems.join('; ')}\n`);
    process.exit(1);
  }
  process.stdout.write(`client_example: ok ${what}; saw sequences 1..${n} exactly once\n`);
}

main().catch((err) => {
  process.stdout.write(`client_example: FAILED ${err && err.details ? `${grpc.status[err.code]}: ${err.details}` : err}\n`);
  process.exit(1);
});
