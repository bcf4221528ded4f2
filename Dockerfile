# dispatchd and the dispatch CLI, built on the official Swift image, run on slim Debian.
FROM swift:6.3-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends \
      libevent-dev libh2o-evloop-dev libpq-dev libssl-dev libcurl4-openssl-dev libnghttp2-dev libnats-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Package.swift ./
COPY Sources ./Sources
COPY Tests ./Tests
# The EmbedFiles plugin compiles web/ (the Activities view, openapi.json) and Migrations/ into
# dispatchd, and records the commit from .git: the image needs no files beside the binaries.
COPY Plugins ./Plugins
COPY web ./web
COPY Migrations ./Migrations
COPY .git ./.git
RUN swift build -c release --product dispatchd && swift build -c release --product dispatch

FROM swift:6.3-bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends \
      libevent-core-2.1-7 libevent-extra-2.1-7 libevent-pthreads-2.1-7 libevent-openssl-2.1-7 libh2o-evloop0.13 libpq5 libssl3 libnghttp2-14 libcurl4 libnats3.4 \
    && rm -rf /var/lib/apt/lists/* && useradd --system --uid 10001 dispatch
COPY --from=build /src/.build/release/dispatchd /src/.build/release/dispatch /usr/local/bin/
ENV DISPATCH_LISTEN=0.0.0.0:8080
USER dispatch
EXPOSE 8080
# `dispatchd check` asks /readyz on DISPATCH_LISTEN, so the check follows the configured port.
HEALTHCHECK --interval=10s --timeout=5s CMD ["dispatchd", "check"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["dispatchd"]
