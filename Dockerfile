# The perdure image of docker-compose.yml: its workers (`perdure worker`), the host worker,
# the CLI, the codec server, the device and the bucket-setup job. Stateless: goal state lives
# in Temporal, artifacts and large payloads in the object store; /data (PERDURE_HOME) is
# each container's own.

# Stage 1 builds perdure's wheel from the build context; the image installs that wheel, so it
# runs exactly what `make smoke-installed` installs and checks, never the source tree.
FROM python:3.11-slim AS wheel
WORKDIR /src
COPY . /src
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist /src

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PERDURE_HOME=/data

# bubblewrap: the sandbox every shell command runs in (docs/guide/security.md, "Shell commands run in a
# sandbox"); the container must allow the user namespaces it needs (docker-compose.yml).
# git: the git tools.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap git \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 10001 perdure \
    && mkdir -p /data /workspaces \
    && chown perdure:perdure /data /workspaces

COPY --from=wheel /dist /dist
RUN pip install /dist/perdure-*.whl && rm -rf /dist

# A new named volume mounted on one of these directories (the host worker's workspaces on
# /workspaces) starts with the directory's owner, so the non-root worker can write there.
USER perdure
CMD ["perdure", "worker"]
