#!/usr/bin/env node
'use strict';
// A helix-mesh agent service in Node.js: `helix.agent.v1.AgentService` over
// @grpc/grpc-js, loaded at run time from ../../proto/helix/agent/v1/agent.proto
// (the contract; nothing is generated), serving the translator agent of translator.js.
//
//   node server.js --port 50071 --data-dir .helix/translator-node [--host 127.0.0.1]
//
// Every session's log is a JSONL file in --data-dir: a `session` header, then
// `event`, `checkpoint` (after every step) and `interrupt` records, appended in
// order. An event is written to the file before any reader sees it; the file is
// fsync'ed at every step boundary, interrupt and terminal event. On start the
// service reloads every file and resumes the sessions that were running: it
// appends `run_resumed` and continues after the last checkpointed step. One
// process per data directory (a `LOCK` file holds its pid).
//
// Environment: HELIX_SCRIPTED_DELAY_MS (delay before each event of a run, default 0),
// HELIX_HOST / HELIX_PORT (defaults for --host / --port).

const crypto = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { HealthImplementation } = require('grpc-health-check');
// The version @grpc/proto-loader uses (package.json pins the same), for the request
// byte checks and the error details trailer.
const protobuf = require('protobufjs');

const { traceContextOf, traceFields } = require('./trace');
const translator = require('./translator');
const { listSessions } = require('./listing');

const PROTO_ROOT = path.resolve(__dirname, '..', '..', 'proto');
const PROTO_FILE = 'helix/agent/v1/agent.proto';
const SERVICE_NAME = 'helix.agent.v1.AgentService';

const SESSION_ID = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,511}$/;
const MAX_INPUT_BYTES = 1 << 20;
const MAX_METADATA_ENTRIES = 64;
const MAX_METADATA_KEY = 128;
const MAX_METADATA_VALUE = 4096;
const MAX_REASON = 4096;
const MAX_EVENTS_PER_MESSAGE = 256;
const MAX_SEQUENCE = Number.MAX_SAFE_INTEGER; // 2^53 - 1: the contract's largest from_sequence
// gRPC fails a call whose metadata passes 8-16 KiB, and a status travels in it twice
// (message and details): text taken from the caller's request is cut to stay below.
const MAX_STATUS_MESSAGE = 1024;
const MAX_VIOLATION_FIELD = 256;

const TERMINAL_STATUS = {
  completed: 'SESSION_STATUS_COMPLETED',
  failed: 'SESSION_STATUS_FAILED',
  interrupted: 'SESSION_STATUS_INTERRUPTED',
  terminated: 'SESSION_STATUS_TERMINATED',
};

// The optional parts of the contract served here (`DescribeResponse.capabilities`): no
// Continue, no SubmitInput (no tool waits for a person), no abort (see Interrupt).
const CAPABILITIES = ['list_sessions'];

// A terminal event's usage (own and subtree's): this agent calls no model and has no
// children, so both are zero, said explicitly.
const NO_TOKENS = { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 };
const TERMINAL_USAGE = { usage: NO_TOKENS, total_usage: NO_TOKENS };

/** The generated-at-load-time `helix.agent.v1` package. */
function loadContract() {
  const definition = protoLoader.loadSync(PROTO_FILE, {
    includeDirs: [PROTO_ROOT],
    keepCase: true, // field names exactly as in the proto (snake_case)
    longs: Number, // int64 sequences fit easily in a double
    enums: String,
    defaults: true,
    oneofs: true,
  });
  return grpc.loadPackageDefinition(definition).helix.agent.v1;
}

// --- errors -----------------------------------------------------------------------

class RpcError extends Error {
  /** `violations`: [[field, problem]], sent as google.rpc.BadRequest field violations. */
  constructor(code, details, violations = []) {
    super(details);
    this.code = code;
    this.details = details;
    this.violations = violations;
  }
}

const invalid = (field, problem) =>
  new RpcError(grpc.status.INVALID_ARGUMENT, `${field}: ${problem}`, [[field, problem]]);
const notFound = (id) => new RpcError(grpc.status.NOT_FOUND, `session '${id}' not found`);

// The few google.rpc messages of the `grpc-status-details-bin` trailer. No google/rpc
// protos ship with grpc-js, so they are declared here; `Any` is google.protobuf.Any
// on the wire (the same two fields), which is all a reader decodes.
const RPC_DETAILS = protobuf.parse(
  `syntax = "proto3";
  package google.rpc;
  message Any { string type_url = 1; bytes value = 2; }
  message Status { int32 code = 1; string message = 2; repeated Any details = 3; }
  message BadRequest {
    message FieldViolation { string field = 1; string description = 2; }
    repeated FieldViolation field_violations = 1;
  }`,
  { keepCase: true },
).root;
const RpcStatus = RPC_DETAILS.lookupType('google.rpc.Status');
const BadRequest = RPC_DETAILS.lookupType('google.rpc.BadRequest');

const cut = (text, most) => (text.length <= most ? text : `${text.slice(0, most - 1)}…`);

/** The trailer of an INVALID_ARGUMENT: a google.rpc.Status with a BadRequest, as the contract asks. */
function badRequestTrailer(code, message, violations) {
  const badRequest = BadRequest.encode({
    field_violations: violations.map(([field, description]) => ({
      field: cut(field, MAX_VIOLATION_FIELD),
      description: cut(description, MAX_STATUS_MESSAGE),
    })),
  }).finish();
  const status = RpcStatus.encode({
    code,
    message,
    details: [{ type_url: 'type.googleapis.com/google.rpc.BadRequest', value: badRequest }],
  }).finish();
  const metadata = new grpc.Metadata();
  metadata.set('grpc-status-details-bin', Buffer.from(status));
  return metadata;
}

/** A gRPC status for any error; unexpected ones are logged with a reference, never sent. */
function toStatus(err) {
  if (err instanceof translator.InvalidInput) err = invalid(err.field, err.problem);
  if (err instanceof RpcError) {
    const details = cut(err.details, MAX_STATUS_MESSAGE);
    if (err.code !== grpc.status.INVALID_ARGUMENT) return { code: err.code, details };
    return { code: err.code, details, metadata: badRequestTrailer(err.code, details, err.violations) };
  }
  const ref = crypto.randomBytes(6).toString('hex');
  log(`unhandled error (ref ${ref}): ${err && err.stack ? err.stack : err}`);
  return { code: grpc.status.INTERNAL, details: `internal error (ref ${ref}); see the server log` };
}

function log(message) {
  process.stderr.write(`${new Date().toISOString()} translator-node: ${message}\n`);
}

// --- validation -------------------------------------------------------------------

/**
 * Characters (code points) in `text`: the contract's limits count characters, and a
 * JS string's `length` counts UTF-16 code units (two for an emoji).
 */
function charCount(text) {
  let count = 0;
  for (const _ of text) count += 1; // iterates by code point
  return count;
}

/** True when `text` has more than `most` characters (without counting a short one). */
const longerThan = (text, most) => text.length > most && charCount(text) > most;

function checkSessionId(value, field = 'session_id') {
  if (!value) throw invalid(field, 'must not be empty');
  if (!SESSION_ID.test(value)) {
    throw invalid(field, 'must be 1-512 characters from [A-Za-z0-9_.:-], starting with a letter or digit');
  }
  return value;
}

function checkMetadata(metadata) {
  const entries = Object.entries(metadata || {});
  if (entries.length > MAX_METADATA_ENTRIES) {
    throw invalid('metadata', `more than ${MAX_METADATA_ENTRIES} entries`);
  }
  for (const [key, value] of entries) {
    if (!key || longerThan(key, MAX_METADATA_KEY)) {
      throw invalid('metadata', `keys must be 1-${MAX_METADATA_KEY} characters`);
    }
    if (longerThan(value, MAX_METADATA_VALUE)) {
      throw invalid(`metadata[${key}]`, `longer than ${MAX_METADATA_VALUE} characters`);
    }
  }
  return Object.fromEntries(entries);
}

/** JSON text with sorted keys and no whitespace: equal JSON values give equal texts. */
function canonicalJson(value) {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  if (value !== null && typeof value === 'object') {
    const keys = Object.keys(value).sort();
    return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(value[k])}`).join(',')}}`;
  }
  return JSON.stringify(value);
}

const fingerprint = (inputJson) =>
  crypto.createHash('sha256').update(canonicalJson(JSON.parse(inputJson))).digest('hex');

function timestamp(ms = Date.now()) {
  return { seconds: Math.floor(ms / 1000), nanos: (ms % 1000) * 1e6 };
}

// --- request bytes ------------------------------------------------------------------
//
// grpc-js parses a request before any handler runs, and protobufjs quietly replaces
// bytes that are not UTF-8 with U+FFFD, while a request that does not parse at all
// becomes INTERNAL. The contract wants INVALID_ARGUMENT naming the field (or
// `request`) for both, so each method's deserializer is wrapped: it checks the raw
// bytes first and, when they are bad, returns a marker the handler rejects.

const UNPARSABLE = Symbol('unparsable request');
const utf8 = new TextDecoder('utf-8', { fatal: true });

function isUtf8(bytes) {
  try {
    utf8.decode(bytes);
    return true;
  } catch {
    return false;
  }
}

/**
 * The path of the first string field of `bytes` (a `type` message) that is not
 * UTF-8, or null; throws on bytes that are no protobuf. A bad key or value of a map
 * names the map, as the Python servers do.
 */
function notUtf8Field(type, bytes, prefix = '') {
  const reader = protobuf.Reader.create(bytes);
  while (reader.pos < reader.len) {
    const tag = reader.uint32();
    const field = type.fieldsById[tag >>> 3];
    if (!field || (tag & 7) !== 2) {
      reader.skipType(tag & 7); // throws on an invalid wire type
      continue;
    }
    const payload = reader.bytes(); // throws when cut short
    const path = prefix + field.name;
    if (field.map) {
      const entry = protobuf.Reader.create(payload);
      while (entry.pos < entry.len) {
        const entryTag = entry.uint32();
        const entryType = (entryTag >>> 3) === 1 ? field.keyType : field.type;
        if ((entryTag & 7) === 2 && entryType === 'string') {
          if (!isUtf8(entry.bytes())) return path;
        } else {
          entry.skipType(entryTag & 7);
        }
      }
    } else if (field.type === 'string') {
      if (!isUtf8(payload)) return path;
    } else if (field.resolvedType instanceof protobuf.Type) {
      const found = notUtf8Field(field.resolvedType, payload, `${path}.`);
      if (found) return found;
    } // else packed numbers or bytes: nothing to check
  }
  return null;
}

/** `requestDeserialize` that answers bad bytes with an UNPARSABLE marker instead of throwing. */
function strictDeserializer(type, deserialize) {
  const typeName = type.fullName.replace(/^\./, '');
  return (bytes) => {
    let field;
    try {
      field = notUtf8Field(type, bytes);
      if (!field) return deserialize(bytes);
    } catch {
      return { [UNPARSABLE]: invalid('request', `cannot be parsed as a ${typeName} (malformed protobuf)`) };
    }
    return { [UNPARSABLE]: invalid(field, 'not valid UTF-8') };
  };
}

/** `definition` (a service from proto-loader) with every request deserializer made strict. */
function strictService(definition) {
  const root = new protobuf.Root();
  // google/protobuf/*.proto are built into protobufjs; everything else is ours.
  root.resolvePath = (origin, target) =>
    target.startsWith('google/protobuf/') ? target : path.join(PROTO_ROOT, target);
  root.loadSync(PROTO_FILE, { keepCase: true });
  const service = root.lookupService(SERVICE_NAME);
  service.resolveAll();
  const strict = {};
  for (const [name, method] of Object.entries(definition)) {
    const type = service.methods[name].resolvedRequestType;
    strict[name] = { ...method, requestDeserialize: strictDeserializer(type, method.requestDeserialize) };
  }
  return strict;
}

/** The request of `call`; throws the INVALID_ARGUMENT of a request that did not parse. */
function requestOf(call) {
  const request = call.request;
  if (request && request[UNPARSABLE]) throw request[UNPARSABLE];
  return request;
}

// --- one session: its log file and its in-memory view -------------------------------

class Session {
  constructor(header, file) {
    this.header = header; // {session_id, agent_type, input_json, input_hash, parent_session_id, metadata, created_at, trace}
    this.file = file;
    this.fd = null;
    this.events = []; // events[i].sequence === i + 1
    this.step = 0; // last checkpointed (completed) step
    this.interrupt = null; // {reason} once an interrupt is recorded
    this.updatedAt = header.created_at;
    this.listeners = new Set(); // live readers: (event) => void
    this.wake = null; // cuts the run's current pause short
  }

  get id() {
    return this.header.session_id;
  }

  get lastSequence() {
    return this.events.length;
  }

  /** The terminal event, once there is one. */
  get terminal() {
    const last = this.events[this.events.length - 1];
    return last && payloadOf(last) in TERMINAL_STATUS ? last : null;
  }

  get status() {
    const terminal = this.terminal;
    return terminal ? TERMINAL_STATUS[payloadOf(terminal)] : 'SESSION_STATUS_RUNNING';
  }

  /** Append one record to the file (and fsync it when `sync`). */
  write(record, sync = false) {
    if (this.fd === null) this.fd = fs.openSync(this.file, 'a');
    fs.writeSync(this.fd, `${JSON.stringify(record)}\n`);
    if (sync) fs.fdatasyncSync(this.fd);
  }

  close() {
    if (this.fd !== null) fs.closeSync(this.fd);
    this.fd = null;
  }

  /** Append an event: to the file first, then to the readers. */
  append(step, kind, payload, { sync = false } = {}) {
    const now = timestamp();
    const event = {
      sequence: this.events.length + 1,
      session_id: this.id,
      agent_type: this.header.agent_type,
      time: now,
      step,
      [kind]: payload,
    };
    const terminal = kind in TERMINAL_STATUS;
    this.write({ type: 'event', event }, sync || terminal);
    this.events.push(event);
    this.updatedAt = now;
    for (const listener of [...this.listeners]) {
      try {
        listener(event);
      } catch (err) {
        this.listeners.delete(listener); // a reader that went away must not stop the run
        log(`session ${this.id}: dropping a reader: ${err}`);
      }
    }
    if (terminal) {
      this.close();
      log(`session ${this.id} ended ${kind}${traceFields(this.header.trace)}`);
    }
    return event;
  }

  checkpoint(step) {
    this.write({ type: 'checkpoint', step, last_sequence: this.lastSequence }, true);
    this.step = step;
    this.updatedAt = timestamp();
  }
}

function payloadOf(event) {
  for (const key of Object.keys(event)) {
    if (!['sequence', 'session_id', 'agent_type', 'time', 'step', 'payload'].includes(key)) return key;
  }
  return '';
}

/** Read one session's file; a torn last line (the process died mid-write) is cut off. */
function loadSession(file) {
  const buffer = fs.readFileSync(file);
  const end = buffer.lastIndexOf(0x0a) + 1;
  if (end < buffer.length) {
    log(`${path.basename(file)}: dropping a torn last record (${buffer.length - end} bytes)`);
    fs.truncateSync(file, end);
  }
  const lines = buffer.subarray(0, end).toString('utf8').split('\n').filter(Boolean);
  if (lines.length === 0) return null;
  const records = lines.map((line) => JSON.parse(line));
  if (records[0].type !== 'session') throw new Error(`${file}: no session header`);
  const session = new Session(records[0], file);
  for (const record of records.slice(1)) {
    if (record.type === 'event') {
      if (record.event.sequence !== session.events.length + 1) {
        throw new Error(`${file}: event ${record.event.sequence} after ${session.events.length}`);
      }
      session.events.push(record.event);
      session.updatedAt = record.event.time;
    } else if (record.type === 'checkpoint') {
      session.step = record.step;
    } else if (record.type === 'interrupt') {
      session.interrupt = session.interrupt || { reason: record.reason };
    }
  }
  return session;
}

class Stopped extends Error {}
class Interrupted extends Error {}

// --- the service --------------------------------------------------------------------

class TranslatorService {
  constructor({ dataDir, delayMs }) {
    this.dataDir = dataDir;
    this.delayMs = delayMs;
    this.sessions = new Map();
    this.accepting = true;
    this.stopping = false;
    this.runs = new Set();
  }

  fileFor(sessionId) {
    // Long ids would exceed a file name's 255 bytes: those are named by their hash.
    const name = sessionId.length <= 200 ? sessionId : crypto.createHash('sha256').update(sessionId).digest('hex');
    return path.join(this.dataDir, `${name}.jsonl`);
  }

  load() {
    for (const name of fs.readdirSync(this.dataDir).sort()) {
      if (!name.endsWith('.jsonl')) continue;
      const session = loadSession(path.join(this.dataDir, name));
      if (session) this.sessions.set(session.id, session);
    }
  }

  /** Resume every session left running by a previous process; returns how many. */
  resumeAll() {
    let resumed = 0;
    for (const session of this.sessions.values()) {
      if (session.terminal) continue;
      session.append(session.step + 1, 'run_resumed', { step: session.step + 1, reason: 'restart' }, { sync: true });
      log(`session ${session.id} resumed at step ${session.step + 1}${traceFields(session.header.trace)}`);
      this.launch(session);
      resumed += 1;
    }
    return resumed;
  }

  launch(session) {
    const run = this.run(session).finally(() => this.runs.delete(run));
    this.runs.add(run);
  }

  /** Wait before the next event (HELIX_SCRIPTED_DELAY_MS); an interrupt or a stop cuts it short. */
  pause(session) {
    return new Promise((resolve) => {
      let done = false;
      const finish = () => {
        if (done) return;
        done = true;
        session.wake = null;
        clearTimeout(timer);
        resolve();
      };
      const timer = setTimeout(finish, this.delayMs);
      session.wake = finish;
    }).then(() => {
      if (this.stopping) throw new Stopped();
      if (session.interrupt) throw new Interrupted();
    });
  }

  /** The run loop: continues after the last checkpointed step until a terminal event. */
  async run(session) {
    let step = session.step + 1;
    try {
      const input = translator.parseInput(session.header.input_json);
      const plan = translator.plan(input);
      const steps = 1 + plan.chunks.length;
      const emit = async (kind, payload) => {
        await this.pause(session);
        session.append(step, kind, payload);
      };
      for (; step <= steps; step += 1) {
        await emit('step_started', {});
        if (step === 1) {
          const call = plan.lookup;
          await emit('tool_start', {
            tool_call_id: call.tool_call_id,
            tool_name: call.tool_name,
            arguments_json: JSON.stringify(call.arguments),
          });
          await emit('tool_end', {
            tool_call_id: call.tool_call_id,
            tool_name: call.tool_name,
            result_json: JSON.stringify(call.result),
            is_error: false,
          });
        } else {
          for (const word of plan.chunks[step - 2]) await emit('text_delta', { text: word });
        }
        session.checkpoint(step);
      }
      step = steps;
      await this.pause(session);
      const outputJson = JSON.stringify(plan.output);
      session.append(step, 'output', { output_json: outputJson });
      session.append(step, 'completed', { output_json: outputJson, ...TERMINAL_USAGE });
    } catch (err) {
      if (err instanceof Stopped) return; // checkpointed; the next process resumes it
      if (err instanceof Interrupted) {
        session.append(step, 'interrupted', { reason: session.interrupt.reason, ...TERMINAL_USAGE });
        return;
      }
      const { details } = toStatus(err);
      if (!session.terminal) {
        session.append(step, 'failed', { error: details, failure_reason: 'internal', ...TERMINAL_USAGE });
      }
    }
  }

  // --- RPCs ---

  /** `callMetadata`: the call's gRPC metadata, for the caller's trace context. */
  Start(request, callMetadata) {
    const sessionId = request.session_id ? checkSessionId(request.session_id) : crypto.randomUUID().replace(/-/g, '');
    if (request.parent_session_id) checkSessionId(request.parent_session_id, 'parent_session_id');
    if (Buffer.byteLength(request.input_json, 'utf8') > MAX_INPUT_BYTES) {
      throw invalid('input_json', `larger than ${MAX_INPUT_BYTES} bytes`);
    }
    translator.parseInput(request.input_json);
    const metadata = checkMetadata(request.metadata);
    const inputJson = request.input_json || '{}';
    const inputHash = fingerprint(inputJson);
    const existing = this.sessions.get(sessionId);
    if (existing) {
      if (existing.header.input_hash !== inputHash) {
        throw new RpcError(
          grpc.status.ALREADY_EXISTS,
          `session '${sessionId}' already exists with a different input`,
        );
      }
      return { session_id: sessionId, created: false, status: existing.status, agent_type: existing.header.agent_type };
    }
    if (!this.accepting) {
      throw new RpcError(grpc.status.UNAVAILABLE, 'server is shutting down; not starting new sessions');
    }
    const header = {
      type: 'session',
      session_id: sessionId,
      agent_type: translator.AGENT_TYPE,
      input_json: inputJson,
      input_hash: inputHash,
      parent_session_id: request.parent_session_id,
      metadata,
      created_at: timestamp(),
      trace: traceContextOf(callMetadata),
    };
    const session = new Session(header, this.fileFor(sessionId));
    session.write(header, true);
    this.sessions.set(sessionId, session);
    session.append(0, 'run_started', {
      input_json: inputJson,
      parent_session_id: request.parent_session_id,
      metadata,
    });
    log(`session ${sessionId} started${traceFields(header.trace)}`);
    this.launch(session);
    return { session_id: sessionId, created: true, status: session.status, agent_type: translator.AGENT_TYPE };
  }

  Stream(call) {
    let request;
    let session;
    try {
      request = requestOf(call);
      checkSessionId(request.session_id);
      if (request.from_sequence < 0) throw invalid('from_sequence', 'must not be negative');
      // int64 arrives as a double (`longs: Number`): any value from 2^53 up rounds to
      // 2^53 or more, never below, so this comparison is exact where it matters.
      if (request.from_sequence > MAX_SEQUENCE) {
        throw invalid('from_sequence', `larger than ${MAX_SEQUENCE}, past any log`);
      }
      session = this.sessions.get(request.session_id);
      if (!session) throw notFound(request.session_id);
    } catch (err) {
      call.emit('error', toStatus(err));
      return;
    }
    const after = request.from_sequence;
    // Replay, then tail. Node runs this synchronously: no event can be appended
    // between the replay and the listener, so the reader sees no gap and no repeat.
    const backlog = session.events.slice(after);
    for (let i = 0; i < backlog.length; i += MAX_EVENTS_PER_MESSAGE) {
      call.write({ events: backlog.slice(i, i + MAX_EVENTS_PER_MESSAGE) });
    }
    if (session.terminal) {
      call.end();
      return;
    }
    const listener = (event) => {
      if (call.cancelled) {
        session.listeners.delete(listener);
        return;
      }
      // A reader past the end gets no event, but its stream still ends with the
      // session (the contract: promptly once the session has finished).
      if (event.sequence > after) call.write({ events: [event] });
      if (payloadOf(event) in TERMINAL_STATUS) {
        session.listeners.delete(listener);
        call.end();
      }
    };
    session.listeners.add(listener);
    call.on('cancelled', () => session.listeners.delete(listener));
    call.on('close', () => session.listeners.delete(listener));
  }

  GetStatus(request) {
    const session = this.session(checkSessionId(request.session_id));
    const terminal = session.terminal;
    const kind = terminal ? payloadOf(terminal) : '';
    return {
      session_id: session.id,
      agent_type: session.header.agent_type,
      status: session.status,
      output_json: kind === 'completed' ? terminal.completed.output_json : '',
      error: kind === 'failed' ? terminal.failed.error : '',
      failure_reason: kind === 'failed' ? terminal.failed.failure_reason : '',
      last_sequence: session.lastSequence,
      step_count: session.step,
      created_at: session.header.created_at,
      updated_at: session.updatedAt,
      finished_at: terminal ? terminal.time : null,
      usage: NO_TOKENS,
      parent_session_id: session.header.parent_session_id,
    };
  }

  Interrupt(request) {
    const sessionId = checkSessionId(request.session_id);
    if (longerThan(request.reason, MAX_REASON)) throw invalid('reason', `longer than ${MAX_REASON} characters`);
    // `abort` (not among CAPABILITIES) is taken as a plain interrupt, as by any service
    // older than the field: with no Continue here, an interrupted session never runs
    // again either, and a parent's abort cascading down stops this child at once (an
    // error would leave it running).
    const session = this.session(sessionId);
    if (session.terminal) return { status: session.status, accepted: false };
    if (!session.interrupt) {
      session.write({ type: 'interrupt', reason: request.reason, time: timestamp() }, true); // durable first
      session.interrupt = { reason: request.reason };
    }
    if (session.wake) session.wake(); // then prompt: the run stops at once
    return { status: 'SESSION_STATUS_RUNNING', accepted: true };
  }

  Describe() {
    return {
      agent_type: translator.AGENT_TYPE,
      description: translator.DESCRIPTION,
      input_schema_json: JSON.stringify(translator.INPUT_SCHEMA),
      output_schema_json: JSON.stringify(translator.OUTPUT_SCHEMA),
      tool_names: translator.TOOL_NAMES,
      capabilities: CAPABILITIES,
    };
  }

  ListSessions(request) {
    return listSessions(this.sessions, request, { agentType: translator.AGENT_TYPE, invalid });
  }

  session(sessionId) {
    const session = this.sessions.get(sessionId);
    if (!session) throw notFound(sessionId);
    return session;
  }

  /** The handlers grpc-js calls. */
  handlers() {
    const unary = (method) => (call, callback) => {
      try {
        callback(null, method.call(this, requestOf(call), call.metadata));
      } catch (err) {
        callback(toStatus(err));
      }
    };
    return {
      Start: unary(this.Start),
      Stream: (call) => {
        try {
          this.Stream(call);
        } catch (err) {
          call.emit('error', toStatus(err));
        }
      },
      GetStatus: unary(this.GetStatus),
      Interrupt: unary(this.Interrupt),
      Describe: unary(this.Describe),
      ListSessions: unary(this.ListSessions),
    };
  }

  /** Stop taking sessions; running ones stop at their next pause, checkpointed. */
  async stop() {
    this.accepting = false;
    this.stopping = true;
    for (const session of this.sessions.values()) if (session.wake) session.wake();
    await Promise.allSettled([...this.runs]);
    for (const session of this.sessions.values()) session.close();
  }
}

// --- process ------------------------------------------------------------------------

function parseArgs(argv) {
  const options = {
    host: process.env.HELIX_HOST || '127.0.0.1',
    port: Number(process.env.HELIX_PORT || 50071),
    dataDir: path.join('.helix', translator.AGENT_TYPE),
  };
  for (let i = 0; i < argv.length; i += 1) {
    const [flag, inline] = argv[i].split(/=(.*)/s);
    const value = () => (inline !== undefined ? inline : argv[++i]);
    if (flag === '--host') options.host = value();
    else if (flag === '--port') options.port = Number(value());
    else if (flag === '--data-dir') options.dataDir = value();
    else if (flag === '-h' || flag === '--help') {
      process.stdout.write('usage: node server.js [--host HOST] [--port PORT] [--data-dir DIR]\n');
      process.exit(0);
    } else {
      process.stderr.write(`server.js: unknown argument ${argv[i]}\n`);
      process.exit(2);
    }
  }
  if (!Number.isInteger(options.port) || options.port < 0 || options.port > 65535) {
    process.stderr.write(`server.js: --port must be 0-65535\n`);
    process.exit(2);
  }
  return options;
}

/** One process per data directory: a LOCK file with the owner's pid (stale after a crash). */
function lockDataDir(dataDir) {
  const lockFile = path.join(dataDir, 'LOCK');
  try {
    const pid = Number(fs.readFileSync(lockFile, 'utf8'));
    if (pid && pid !== process.pid) {
      try {
        process.kill(pid, 0);
        throw new Error(`data directory ${dataDir} is in use by process ${pid}`);
      } catch (err) {
        if (err.code !== 'ESRCH') throw err;
      }
    }
  } catch (err) {
    if (err.code !== 'ENOENT') throw err;
  }
  fs.writeFileSync(lockFile, String(process.pid));
}

async function main() {
  const options = parseArgs(process.argv.slice(2));
  const delayMs = Math.max(0, Number(process.env.HELIX_SCRIPTED_DELAY_MS || 0)) || 0;
  fs.mkdirSync(options.dataDir, { recursive: true });
  lockDataDir(options.dataDir);

  const contract = loadContract();
  const service = new TranslatorService({ dataDir: options.dataDir, delayMs });
  service.load();

  const server = new grpc.Server();
  server.addService(strictService(contract.AgentService.service), service.handlers());
  const health = new HealthImplementation({ '': 'NOT_SERVING', [SERVICE_NAME]: 'NOT_SERVING' });
  health.addToServer(server);
  const port = await new Promise((resolve, reject) => {
    server.bindAsync(`${options.host}:${options.port}`, grpc.ServerCredentials.createInsecure(), (err, bound) =>
      err ? reject(err) : resolve(bound),
    );
  });
  const resumed = service.resumeAll();
  health.setStatus('', 'SERVING');
  health.setStatus(SERVICE_NAME, 'SERVING');
  process.stdout.write(
    `helix-mesh: agent '${translator.AGENT_TYPE}' listening on ${options.host}:${port} ` +
      `(resumed ${resumed} session(s))\n`,
  );

  let stopping = false;
  const shutdown = async (signal) => {
    if (stopping) return;
    stopping = true;
    log(`${signal}: draining`);
    health.setStatus('', 'NOT_SERVING');
    health.setStatus(SERVICE_NAME, 'NOT_SERVING');
    await service.stop();
    // Open streams of running sessions would never end: give them a moment, then cut
    // them (their readers reconnect to the next process from their last sequence).
    const force = setTimeout(() => server.forceShutdown(), 1000);
    server.tryShutdown(() => {
      clearTimeout(force);
      fs.rmSync(path.join(options.dataDir, 'LOCK'), { force: true });
      process.exit(0);
    });
  };
  process.on('SIGTERM', () => shutdown('SIGTERM'));
  process.on('SIGINT', () => shutdown('SIGINT'));
}

if (require.main === module) {
  main().catch((err) => {
    log(`fatal: ${err && err.stack ? err.stack : err}`);
    process.exit(1);
  });
}

module.exports = { TranslatorService, loadContract, canonicalJson };
