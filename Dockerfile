# Multi-stage build of the kvplane controller.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY frontend ./frontend
COPY benches ./benches
COPY examples ./examples
RUN cargo build --release --locked --bin kvplane

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 kvplane
COPY --from=build /src/target/release/kvplane /usr/local/bin/kvplane
USER kvplane
# HTTP API + dashboard, PULL, ROUTER, heartbeat ROUTER (LMCache defaults).
EXPOSE 9000 8300 8400 8082
ENTRYPOINT ["kvplane"]
CMD ["serve"]
