# syntax=docker/dockerfile:1
#
# allot and allotctl as static binaries on a distroless base, run as a
# non-root user (65532, "nonroot"). Build and push:
#
#   docker build -t REGISTRY/allot:TAG .
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/allot:TAG --push .
#
# (BuildKit, Docker's default builder since 23.0: RUN --mount caches and
# $BUILDPLATFORM) then point deploy/kubernetes at it
# (deploy/kubernetes/README.md). The
# image runs `allot COMMAND`: regional, coordinator, dev, ...; allotctl is
# at /usr/local/bin/allotctl.

# The Go of go.mod's go line; the build runs on the build machine's
# platform and cross-compiles (no emulation).
ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS
ARG TARGETARCH
WORKDIR /src
# Modules first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags='-s -w' -o /out/ ./cmd/allot ./cmd/allotctl

# Static binaries: no libc, no shell. The distroless image adds CA
# certificates, /etc/passwd with the nonroot user, and tzdata.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/allot /out/allotctl /usr/local/bin/
USER 65532:65532
# regional: gRPC 8081, HTTP 8080; coordinator: gRPC 8070, HTTP 8071. Both
# listen on 127.0.0.1 unless --grpc-addr/--http-addr say otherwise.
EXPOSE 8080 8081 8070 8071
ENTRYPOINT ["/usr/local/bin/allot"]
CMD ["help"]
