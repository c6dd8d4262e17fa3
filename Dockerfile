# Multi-stage build of kvplane (one binary: serve, indexer, coordinator, node, bench).
# The build stage copies exactly what `cargo build --locked` needs; scripts/check-docker-context.sh
# (run by scripts/test.sh) checks that these COPY lines are enough.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
# Cargo.toml patches zeromq from vendor/zeromq.
COPY vendor ./vendor
COPY src ./src
# Embedded at compile time: the dashboard (rust-embed) and the worker library's docs. Test data
# (tests/conformance) is read by the tests at run time and is not needed here.
COPY frontend ./frontend
COPY docs ./docs
# Declared as [[bench]] targets, so the manifest needs them.
COPY benches ./benches
RUN cargo build --release --locked --bin kvplane

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 kvplane
COPY --from=build /src/target/release/kvplane /usr/local/bin/kvplane
USER kvplane
# Controller: HTTP API + dashboard, PULL, ROUTER, heartbeat ROUTER (LMCache defaults);
# indexer 13333; coordinator 9300; node 65432 (lm://) and its HTTP 9091.
EXPOSE 9000 8300 8400 8082 13333 9300 65432 9091
ENTRYPOINT ["kvplane"]
CMD ["serve"]
