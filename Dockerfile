# The grandrounds worker image (used by docker-compose.yml; runs against any Kafka cluster).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    # hnswlib compiles on install; a portable build gives the same results on any x86-64.
    HNSWLIB_NO_NATIVE=1

RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md ./
COPY grandrounds ./grandrounds
COPY handlers ./handlers
COPY store ./store
COPY streams ./streams
COPY replay ./replay
COPY examples ./examples
# CPU-only torch (for the MiniLM embedder) keeps the image a few GB smaller than the CUDA default.
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu .

# Each worker keeps its own DuckDB file (one writing process per file): mount a volume here.
VOLUME /data
ENTRYPOINT ["grandrounds"]
CMD ["worker", "--broker", "kafka://kafka:19092", "--db", "/data/worker.duckdb"]
