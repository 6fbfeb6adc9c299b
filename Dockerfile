# blockjanitor: the node agent's and the fleet console's image (blockjanitor-agent, agentctl,
# blockjanitor-console; the DaemonSet runs the first, deploy/console the last).
#
#   docker build -t blockjanitor .                      # builds the binaries from source (default target)
#   cargo build --locked --release --bins && \
#   strip --strip-debug target/release/blockjanitor-agent target/release/agentctl target/release/blockjanitor-console && \
#   docker build --target runtime-prebuilt --build-arg BIN_DIR=target/release -t blockjanitor .
#                                                       # takes binaries already built on a bookworm host
#                                                       # (the release profile keeps debug info: strip it)
#
# Build args: BASE (the Debian bookworm image the runtime's libraries come from; default
# debian:bookworm-slim), BUILDER (the Rust toolchain image; default rust:1-bookworm), BIN_DIR
# (runtime-prebuilt: where in the build context the three binaries are).
#
# The runtime image is not bookworm-slim itself (75 MB before anything is added): it is an empty
# image holding the two binaries and exactly the bookworm libraries they load (libc, libgcc_s,
# libudev1 and its dependencies), collected by deploy/image/collect-rootfs.sh. No shell and no
# package manager at runtime; the entrypoint is exec form.
#
# Stages are ordered so that `--target runtime-prebuilt` never reaches the builder stage (older
# builders, podman 4 among them, build every stage up to the target).

ARG BASE=debian:bookworm-slim
ARG BUILDER=rust:1-bookworm

# bookworm with libudev1 (installed only when the base lacks it) and the collection script.
FROM ${BASE} AS runtime-base
RUN dpkg-query -W -f='${Status}\n' libudev1 2>/dev/null | grep -q 'ok installed' \
    || (apt-get update && apt-get install -y --no-install-recommends libudev1 && rm -rf /var/lib/apt/lists/*)
COPY deploy/image/collect-rootfs.sh /usr/local/sbin/collect-rootfs.sh

# Binaries from the build context (a bookworm-compatible glibc build).
FROM scratch AS bins-prebuilt
ARG BIN_DIR=target/release
COPY ${BIN_DIR}/blockjanitor-agent ${BIN_DIR}/agentctl ${BIN_DIR}/blockjanitor-console /out/

FROM runtime-base AS rootfs-prebuilt
COPY --from=bins-prebuilt /out/ /in/
RUN /usr/local/sbin/collect-rootfs.sh /rootfs /in/blockjanitor-agent /in/agentctl /in/blockjanitor-console

# What every runtime image says about itself and how it starts (both runtime targets build on it).
FROM scratch AS runtime-meta
LABEL org.opencontainers.image.title="blockjanitor" \
      org.opencontainers.image.description="Per-node agent that finds stale block devices and who holds them, and cleans them safely" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.base.name="debian:bookworm-slim"
ENV BLOCKJANITOR_SOCKET=/run/blockjanitor/agent.sock
ENTRYPOINT ["/usr/local/bin/blockjanitor-agent"]
CMD ["serve", "--config", "/etc/blockjanitor/agent.toml"]

FROM runtime-meta AS runtime-prebuilt
COPY --from=rootfs-prebuilt /rootfs/ /

# Building from source.
FROM ${BUILDER} AS builder
RUN apt-get update && apt-get install -y --no-install-recommends libudev-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock rustfmt.toml ./
COPY agent agent
COPY proto proto
COPY rpc rpc
COPY ctl ctl
COPY console console
COPY tests tests
COPY fuzz fuzz
RUN cargo build --locked --release -p blockjanitor --bin blockjanitor-agent -p blockjanitor-ctl --bin agentctl \
        -p blockjanitor-console --bin blockjanitor-console \
    && mkdir /out \
    && cp target/release/blockjanitor-agent target/release/agentctl target/release/blockjanitor-console /out/ \
    && strip --strip-debug /out/blockjanitor-agent /out/agentctl /out/blockjanitor-console

FROM runtime-base AS rootfs-built
COPY --from=builder /out/ /in/
RUN /usr/local/sbin/collect-rootfs.sh /rootfs /in/blockjanitor-agent /in/agentctl /in/blockjanitor-console

FROM runtime-meta AS runtime
COPY --from=rootfs-built /rootfs/ /
