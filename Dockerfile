# syntax=docker/dockerfile:1
# The vmop operator image.
#
#   docker build -t registry.example.com/vmop/vmop:0.1.0 .
#
# Base: a glibc build on distroless/cc rather than a static musl binary. The binary links only
# libc, libm and libgcc_s (check with `ldd target/release/vmop`), which distroless/cc ships and
# nothing else: no shell, no package manager, non-root by default. A musl build was not chosen:
# Cranelift (plugin compilation) and tokio allocate heavily from many threads, where musl's
# allocator is much slower; and the glibc build is the one the tests exercise. Builder and
# runtime are the same Debian release, so the glibc the binary was linked against is present.
#
# Without a container engine, scripts/image.sh builds the same final stage from the same inputs
# (the binary, the libraries it links, CA certificates, the nonroot user) as an OCI archive;
# that is the image the in-cluster tests run.

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-trixie AS build
WORKDIR /src
# The whole workspace: cargo needs every member's manifest. .dockerignore keeps target/ out.
COPY . .
# Cache mounts keep the registry and the target directory across builds; the binary is copied
# out of the cache mount because it is not part of the image layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p vmop --bin vmop \
    && install -D -m 0755 target/release/vmop /out/vmop

FROM gcr.io/distroless/cc-debian13:nonroot
COPY --from=build /out/vmop /usr/local/bin/vmop
# 65532 is distroless's `nonroot`; numeric so that runAsNonRoot can verify it.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/vmop"]
CMD ["run", "--plugin-dir=/plugins", "--cache-dir=/cache", "--log-format=json"]
