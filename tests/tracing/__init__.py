"""Tracing tests: lifecycle hooks, OpenTelemetry spans, Langfuse over OTLP/HTTP."""
