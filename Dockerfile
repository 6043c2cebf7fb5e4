# syntax=docker/dockerfile:1.7
# agentd: a multi-stage build. The builder caches the cargo registry and the target directory
# between builds (BuildKit cache mounts), so only changed crates recompile; the runtime stage is
# a slim Debian with the binary, a non-root user and /data as the only writable place.

FROM rust:1.95-slim-bookworm AS builder
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY migrations ./migrations
COPY src ./src
COPY benches ./benches
COPY examples ./examples
COPY openapi.yaml ./
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin agentd \
    && install -m 0755 target/release/agentd /usr/local/bin/agentd

FROM debian:bookworm-slim AS runtime
# Debian's package versions roll within a release; pinning them would break rebuilds.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 agentd \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/agentd \
       --shell /usr/sbin/nologin agentd \
    && mkdir -p /data \
    && chown 10001:10001 /data
COPY --from=builder /usr/local/bin/agentd /usr/local/bin/agentd
USER 10001:10001
WORKDIR /data
ENV AGENTD_BIND=0.0.0.0:8080 \
    AGENTD_DATA_DIR=/data \
    AGENTD_WORKSPACE=/data/workspace \
    AGENTD_LOG=info
VOLUME ["/data"]
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["sh", "-c", "curl -fsS http://127.0.0.1:8080/healthz || exit 1"]
ENTRYPOINT ["/usr/local/bin/agentd"]
CMD ["serve"]
