# dispatchd and the dispatch CLI, built on the official Swift image, run on slim Debian.
FROM swift:6.3-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends libevent-dev libpq-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Package.swift ./
COPY Sources ./Sources
COPY Tests ./Tests
# The EmbedFiles plugin compiles web/ (the Activities view, openapi.json) into dispatchd.
COPY Plugins ./Plugins
COPY web ./web
RUN swift build -c release --product dispatchd && swift build -c release --product dispatch

FROM swift:6.3-bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends \
      libevent-core-2.1-7 libevent-extra-2.1-7 libevent-pthreads-2.1-7 libpq5 curl \
    && rm -rf /var/lib/apt/lists/* && useradd --system --uid 10001 dispatch
COPY --from=build /src/.build/release/dispatchd /src/.build/release/dispatch /usr/local/bin/
COPY Migrations /usr/share/dispatch/migrations
ENV DISPATCH_MIGRATIONS_DIR=/usr/share/dispatch/migrations \
    DISPATCH_LISTEN=0.0.0.0:8080
USER dispatch
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s CMD curl -fsS http://127.0.0.1:8080/readyz || exit 1
ENTRYPOINT ["dispatchd"]
