# syntax=docker/dockerfile:1
#
# Build:  docker build -t gateway:0.1.0 .
# Run:    docker run --rm -p 8080:8080 gateway:0.1.0
# Config: /etc/gateway/gateway.toml (mount your own over it); the image ships
#         config/gateway.toml and config/public from this repository there.
# CI:     scripts/container-check.sh builds this file with buildah, compares the
#         image's USER/ENTRYPOINT/CMD/ENV/EXPOSE with the lines below, and runs it.
#
# No apt-get in either stage: the build needs only the Rust toolchain (no C
# dependencies) and the runtime only glibc, so there are no package versions
# to pin (hadolint DL3008). If you add packages, pin them or add an inline
# `# hadolint ignore=DL3008` with the reason.

FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY . .
# The cache mounts keep the registry and target dir between builds; the binary
# is copied out of the cached target dir in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
    && install -m 0755 target/release/gateway /usr/local/bin/gateway

FROM debian:bookworm-slim
RUN groupadd --system --gid 10001 gateway \
    && useradd --system --uid 10001 --gid gateway --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin gateway
COPY --from=build /usr/local/bin/gateway /usr/local/bin/gateway
COPY config/gateway.toml /etc/gateway/gateway.toml
COPY config/public /etc/gateway/public
# The shipped config listens on loopback; in a container it must listen on
# all interfaces. Environment overrides win over the file (GATEWAY__SECTION__KEY).
ENV GATEWAY__SERVER__LISTEN=0.0.0.0:8080
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/gateway"]
CMD ["--config", "/etc/gateway/gateway.toml"]
