'use strict';
// W3C Trace Context (https://www.w3.org/TR/trace-context/) read from incoming gRPC
// metadata, as the Python services' callers send it (`traceparent`).
//
// The service calls no other service and exports no spans: it continues the caller's
// trace in its log instead. A session remembers the context of the Start that created
// it (in its file's header, so a restarted process still knows it) and every log line
// about the session carries `trace_id=` and the caller's span as `parent_span_id=`.
// A service that called others would send `traceparent` on, with a span id of its own,
// and `tracestate` unchanged; this one has nothing to send them on, so it keeps neither.

// version-traceid-parentid-flags, lower-case hex; a later version may append fields.
const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/**
 * `{trace_id, parent_span_id}` of the `traceparent` in `metadata` (a grpc.Metadata),
 * or null when there is none or it is invalid (W3C: ignore it, never fail the call).
 */
function traceContextOf(metadata) {
  const values = metadata.get('traceparent');
  if (values.length !== 1) return null; // none, or several: invalid
  const match = TRACEPARENT.exec(String(values[0]).trim());
  if (!match) return null;
  const [, version, traceId, parentId, , rest] = match;
  if (version === 'ff' || (version === '00' && rest !== undefined)) return null;
  if (/^0+$/.test(traceId) || /^0+$/.test(parentId)) return null;
  return { trace_id: traceId, parent_span_id: parentId };
}

/** ` trace_id=... parent_span_id=...` for a log line, or '' without a trace. */
function traceFields(trace) {
  return trace ? ` trace_id=${trace.trace_id} parent_span_id=${trace.parent_span_id}` : '';
}

module.exports = { traceContextOf, traceFields };
