# syntax=docker/dockerfile:1
# The gpuscale container image, for building with Docker/BuildKit where a registry is reachable
# (.github/workflows/image.yml builds it for linux/amd64 and linux/arm64). It is the image that
# scripts/build-image.sh assembles without pulling anything: the build stage compiles the same
# release binary with the same features and runs the same scripts/image-rootfs.sh (Debian bookworm
# packages, the user, the CA bundle), and the final stage is that root file system on `scratch`
# with the same user, working folder, entrypoint, environment and labels. tests/image_definition.rs
# checks that this file and scripts/build-image.sh --print-config agree; docs/image.md explains.
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg SOURCE_DATE_EPOCH="$(git log -1 --format=%ct)" \
#     --build-arg REVISION="$(git rev-parse HEAD)" \
#     --build-arg CREATED="$(date -u -d @"$(git log -1 --format=%ct)" +%Y-%m-%dT%H:%M:%SZ)" \
#     -t ghcr.io/gpuscale/gpuscale:0.1.0 .
#
# The project's own CI cannot build this file (no registry for the base images); it builds and
# tests scripts/build-image.sh's image (scripts/test-image.sh).

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
ARG SOURCE_DATE_EPOCH=0
WORKDIR /src
COPY . .
# The same path mappings as scripts/build-image.sh (checkout, cargo home, target folder).
RUN RUSTFLAGS="--remap-path-prefix=/src=/gpuscale --remap-path-prefix=/usr/local/cargo=/cargo --remap-path-prefix=/src/target=/target" \
    cargo build --profile container --locked --features aws,gcp --bin gpuscale
RUN apt-get update \
    && scripts/image-rootfs.sh target/container/gpuscale /rootfs /packages.txt \
    && cat /packages.txt

FROM scratch
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=1970-01-01T00:00:00Z
COPY --from=build /rootfs/ /
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
WORKDIR /home/nonroot
ENTRYPOINT ["/usr/bin/gpuscale"]
LABEL org.opencontainers.image.title="gpuscale"
LABEL org.opencontainers.image.description="Kubernetes GPU cluster autoscaler and placement scheduler with first-class GPU sharing"
LABEL org.opencontainers.image.source="https://github.com/gpuscale/gpuscale"
LABEL org.opencontainers.image.licenses="Apache-2.0"
LABEL org.opencontainers.image.version="${VERSION}"
LABEL org.opencontainers.image.revision="${REVISION}"
LABEL org.opencontainers.image.created="${CREATED}"
