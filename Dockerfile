# syntax=docker/dockerfile:1.7
# agentd: a multi-stage build. The builder caches the cargo registry and the target directory
# between builds (BuildKit cache mounts), so only changed crates recompile; the runtime stage is
# a slim Debian with the binary, a non-root user and /data as the only writable place.

FROM rust:1.95-slim-bookworm AS builder
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY migrations ./migrations
# Besides src/, the binary embeds openapi.yaml and the AppUI's files from ui/.
COPY src ./src
COPY ui ./ui
COPY openapi.yaml ./
# Cargo reads every target the manifest declares ([[bench]] and any [[example]] or [[test]])
# before it builds one, so their files must be present even though only the binary is built.
COPY benches ./benches
COPY examples ./examples
COPY tests ./tests
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin agentd --bin agentd-sandbox \
    && install -m 0755 target/release/agentd target/release/agentd-sandbox /usr/local/bin/

FROM debian:bookworm-slim AS runtime
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="agentd" \
      org.opencontainers.image.description="A server that hosts LLM agent sessions for a browser app" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="MIT OR Apache-2.0"
# Debian's package versions roll within a release; pinning them would break rebuilds.
# tini is PID 1: it forwards SIGTERM to agentd and reaps processes that tools leave behind.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl tini \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 agentd \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/agentd \
       --shell /usr/sbin/nologin agentd \
    && mkdir -p /data \
    && chown 10001:10001 /data
# agentd-sandbox, the launcher in front of every command, must sit beside agentd.
COPY --from=builder /usr/local/bin/agentd /usr/local/bin/agentd-sandbox /usr/local/bin/
USER 10001:10001
WORKDIR /data
# Inside the container agentd listens on every interface; give it AGENTD_AUTH_TOKEN (or
# [[server.users]] in a config file), since without one the API, shell tool included, is open
# to anyone who can reach the port.
ENV AGENTD_BIND=0.0.0.0:8080 \
    AGENTD_DATA_DIR=/data \
    AGENTD_WORKSPACE=/data/workspace \
    AGENTD_LOG=info
VOLUME ["/data"]
EXPOSE 8080
# /healthz is public, so the check needs no token; the port follows AGENTD_BIND.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["sh", "-c", "curl -fsS \"http://127.0.0.1:${AGENTD_BIND##*:}/healthz\" || exit 1"]
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/agentd"]
CMD ["serve"]
