# The perdure orchestrator worker for docker-compose.yml (`perdure worker`).
# Stateless: goal state lives in Temporal, artifacts on the volume at /data.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PERDURE_HOME=/data

RUN useradd --create-home --uid 10001 perdure \
    && mkdir -p /data \
    && chown perdure:perdure /data

WORKDIR /app
COPY . /app
RUN pip install /app

# A new named volume mounted on /data starts with this directory's owner, so
# the non-root worker can write artifacts there.
USER perdure
CMD ["perdure", "worker"]
