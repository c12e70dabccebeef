'use strict';
// ListSessions over the service's in-memory sessions: newest first (created_at, then
// session_id, both descending), keyset pages whose token holds where the page ended
// and a digest of the filters it was issued for. The service has no authentication,
// so every caller is the one owner and sees every session.

const crypto = require('node:crypto');

const DEFAULT_PAGE_SIZE = 50;
const MAX_PAGE_SIZE = 500;
const MAX_TOKEN = 2048;
const AGENT_TYPE = /^[a-z][a-z0-9_-]{0,62}$/;
const STATUSES = new Set([
  'SESSION_STATUS_RUNNING',
  'SESSION_STATUS_COMPLETED',
  'SESSION_STATUS_FAILED',
  'SESSION_STATUS_INTERRUPTED',
  'SESSION_STATUS_TERMINATED',
]);
// google.protobuf.Timestamp's range: years 1 to 9999.
const MIN_SECONDS = -62135596800;
const MAX_SECONDS = 253402300799;

/** A Timestamp as BigInt nanoseconds (a double cannot hold them exactly). */
function nanosOf(time) {
  return BigInt(time.seconds) * 1000000000n + BigInt(time.nanos);
}

/** Compare listing positions [nanos, id]: negative when `a` is listed before (newer). */
function compare(a, b) {
  if (a[0] !== b[0]) return a[0] > b[0] ? -1 : 1;
  if (a[1] === b[1]) return 0;
  return a[1] > b[1] ? -1 : 1;
}

function timeFilter(request, name, invalid) {
  const value = request[name];
  if (value === null || value === undefined) return null;
  if (value.seconds < MIN_SECONDS || value.seconds > MAX_SECONDS || value.nanos < 0 || value.nanos > 999999999) {
    throw invalid(name, 'not a valid Timestamp (years 1 to 9999, nanos 0..999999999)');
  }
  return nanosOf(value);
}

function makeToken(position, filters) {
  return Buffer.from(JSON.stringify([1, position[0].toString(), position[1], filters])).toString('base64url');
}

function readToken(token, filters, invalid) {
  const refused = () => invalid('page_token', 'not a page token of this service');
  if (token.length > MAX_TOKEN) throw refused();
  let parsed;
  try {
    parsed = JSON.parse(Buffer.from(token, 'base64url').toString('utf8'));
  } catch {
    throw refused();
  }
  if (!Array.isArray(parsed) || parsed.length !== 4 || parsed[0] !== 1) throw refused();
  const [, nanos, id, issuedFor] = parsed;
  if (typeof nanos !== 'string' || !/^-?\d{1,25}$/.test(nanos) || typeof id !== 'string') throw refused();
  if (issuedFor !== filters) throw invalid('page_token', 'issued for other filters: send the filters of the first page');
  return [BigInt(nanos), id];
}

/**
 * One page of `sessions` (the service's Map) for `request`.
 * @param {{agentType: string, invalid: (field: string, problem: string) => Error}} options
 */
function listSessions(sessions, request, { agentType, invalid }) {
  if (request.page_size < 0) throw invalid('page_size', 'must not be negative (0 for the default)');
  const size = Math.min(request.page_size || DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE);
  const statuses = new Set();
  request.statuses.forEach((status, index) => {
    if (!STATUSES.has(status)) {
      throw invalid(`statuses[${index}]`, `${status} is not a session status (RUNNING..TERMINATED)`);
    }
    statuses.add(status);
  });
  if (request.agent_type && !AGENT_TYPE.test(request.agent_type)) {
    throw invalid('agent_type', 'not an agent type ([a-z][a-z0-9_-]{0,62})');
  }
  const after = timeFilter(request, 'created_after', invalid);
  const before = timeFilter(request, 'created_before', invalid);
  const described = [[...statuses].sort(), request.agent_type, String(after), String(before), request.roots_only];
  const filters = crypto.createHash('sha256').update(JSON.stringify(described)).digest('hex').slice(0, 16);
  const from = request.page_token ? readToken(request.page_token, filters, invalid) : null;
  if (request.agent_type && request.agent_type !== agentType) return { sessions: [], next_page_token: '' };
  const position = (session) => [nanosOf(session.header.created_at), session.id];
  const listed = [...sessions.values()]
    .filter((session) => {
      const [created] = position(session);
      return (
        (statuses.size === 0 || statuses.has(session.status)) &&
        (after === null || created >= after) &&
        (before === null || created < before) &&
        !(request.roots_only && session.header.parent_session_id) &&
        (from === null || compare(from, position(session)) < 0)
      );
    })
    .sort((a, b) => compare(position(a), position(b)));
  const page = listed.slice(0, size);
  const more = listed.length > size;
  return {
    sessions: page.map((session) => {
      const terminal = session.terminal;
      return {
        session_id: session.id,
        agent_type: session.header.agent_type,
        status: session.status,
        parent_session_id: session.header.parent_session_id,
        created_at: session.header.created_at,
        updated_at: session.updatedAt,
        finished_at: terminal ? terminal.time : null,
        last_sequence: session.lastSequence,
      };
    }),
    next_page_token: more ? makeToken(position(page[page.length - 1]), filters) : '',
  };
}

module.exports = { listSessions };
