# keyrelay's container image: docs/deployment.md#container-image says how to build and run
# it, and what CI checks in place of building it (tests/deploy.rs runs this file's command
# line, user, paths and signals on the built binary).
#
#   docker build -t keyrelay .
#   docker run --rm -p 8080:8080 -v "$PWD/etc:/etc/keyrelay:ro" -v keyrelay-data:/var/lib/keyrelay \
#       --env-file keys.env keyrelay

FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY . .
# --locked: the image is built from Cargo.lock as committed, never from a fresh resolve.
# The release profile strips the binary (Cargo.toml), which keeps the image small.
RUN cargo build --release --locked --bin keyrelay
# The state directory, made here because the runtime image has no shell: owned by the
# nonroot user, so a fresh named volume mounted on it is writable too (Docker copies the
# ownership into an empty volume).
RUN mkdir -p /out/var/lib/keyrelay
# libgcc_s, the one library keyrelay loads besides glibc (below), at its multiarch path.
RUN lib="/lib/$(gcc -dumpmachine)" && mkdir -p "/out/root$lib" \
    && cp -L "$lib/libgcc_s.so.1" "/out/root$lib/"

# glibc and nothing else: no shell, no package manager, no OpenSSL (keyrelay uses rustls
# with built-in roots); uid 65532 "nonroot". Same Debian release as the build stage, so
# the binary finds the glibc it was linked to. keyrelay needs one library more than glibc,
# libgcc_s (see ldd), copied from the build stage: distroless/cc would bring it with libstdc++,
# libgomp and libssl, about 9 MB that nothing here loads and that would put the image
# over 30 MB (docs/deployment.md#image-size).
FROM gcr.io/distroless/base-nossl-debian12:nonroot
COPY --from=build /out/root/ /
COPY --from=build /src/target/release/keyrelay /usr/local/bin/keyrelay
COPY --from=build --chown=65532:65532 /out/var/lib/keyrelay /var/lib/keyrelay
USER 65532:65532
# proxy.toml (mount it read-only; a ConfigMap's symlink swap is picked up as a reload) and
# data_dir (the pins journal and the local CA: keep it across restarts).
VOLUME ["/etc/keyrelay", "/var/lib/keyrelay"]
WORKDIR /var/lib/keyrelay
EXPOSE 8080
# SIGTERM drains: listeners close, requests in flight get [timeouts] drain (30 s) to finish.
# Give `docker stop` at least that: `docker stop -t 40`.
STOPSIGNAL SIGTERM
# No HEALTHCHECK: the image has no curl or shell, and the orchestrators keyrelay is run
# under probe /healthz and /readyz themselves (Kubernetes ignores HEALTHCHECK; see
# deploy/kubernetes/keyrelay.yaml).
ENTRYPOINT ["/usr/local/bin/keyrelay"]
CMD ["--config", "/etc/keyrelay/proxy.toml"]
