# syntax=docker/dockerfile:1
#
# The Node.js agent service, services/translator_node (agent type "translator-node"):
# server.js and the modules it requires, their production dependencies from
# package-lock.json, and the contract, proto/helix/agent/v1/agent.proto, which server.js
# loads at run time from ../../proto (nothing is generated).
#
#   docker build -f deploy/docker/translator-node.Dockerfile -t helix-translator-node:dev .
#   docker run --rm -p 50051:50051 helix-translator-node:dev
#
# The build context is the repository root; BuildKit reads the ignore file named after
# this Dockerfile (translator-node.Dockerfile.dockerignore), so the context is only
# proto/helix and services/translator_node. Sessions are JSONL files in --data-dir,
# /var/lib/helix/translator-node: mount a volume there (the manifests use a
# PersistentVolumeClaim), or a restarted container starts with no sessions.

ARG NODE_IMAGE=node:20-bookworm-slim

# --- deps: exactly the locked production dependencies, no install scripts -------------
FROM ${NODE_IMAGE} AS deps

WORKDIR /app/services/translator_node
COPY services/translator_node/package.json services/translator_node/package-lock.json ./
RUN npm ci --omit=dev --ignore-scripts --no-audit --no-fund \
    && npm cache clean --force

# --- runtime: the service as an unprivileged user -------------------------------------
FROM ${NODE_IMAGE} AS runtime

LABEL org.opencontainers.image.title="helix-translator-node" \
      org.opencontainers.image.description="A helix-mesh agent service in Node.js: translator-node" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV NODE_ENV=production \
    HELIX_HOST=0.0.0.0 \
    HELIX_PORT=50051

# The same layout as the repository: server.js finds the contract at ../../proto.
WORKDIR /app/services/translator_node
COPY proto/helix /app/proto/helix
COPY --from=deps /app/services/translator_node/node_modules ./node_modules
COPY services/translator_node/package.json services/translator_node/server.js \
     services/translator_node/listing.js services/translator_node/trace.js \
     services/translator_node/translator.js ./

# uid/gid 10001, numeric (Kubernetes' runAsNonRoot verifies it), as in the Python image.
# The data directory is the only place the user may write. The smoke test loads the
# contract as the service does, so a missing proto fails the build, not the first pod.
RUN install -d -o 10001 -g 10001 -m 0750 /var/lib/helix /var/lib/helix/translator-node \
    && node -e "require('./server.js').loadContract().AgentService || process.exit(1)"

USER 10001:10001
EXPOSE 50051

# node runs as PID 1 and handles SIGTERM itself: health NOT_SERVING, runs checkpointed,
# streams cut after 1 s (their readers resume elsewhere from their last sequence).
ENTRYPOINT ["node", "server.js"]
CMD ["--data-dir", "/var/lib/helix/translator-node"]
