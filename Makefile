# The two commands a newcomer needs: `make run` and `make test`. Both install what is missing.
SWIFT ?= $(shell command -v swift || echo /opt/swift/usr/bin/swift)

.PHONY: run test build deps test-deps bench bench-full clean

deps:
	@./scripts/install-deps.sh

test-deps:
	@./scripts/install-deps.sh --tests

build: deps
	$(SWIFT) build -c release

# Starts dispatchd on 127.0.0.1:8080 with a private PostgreSQL under ./.dispatch
# (unless DATABASE_URL is set). The development API key is in ./.dispatch/dev-key.
run: build
	./.build/release/dispatchd

# Every test: unit, server integration (real PostgreSQL the tests start themselves), CLI, bench smoke.
# All are XCTest; the empty Swift Testing pass is skipped so the last line is the real summary.
test: test-deps
	$(SWIFT) build --build-tests
	$(SWIFT) test --skip-build --disable-swift-testing

bench: deps
	./bench/run

bench-full: deps
	./bench/run --full

clean:
	rm -rf .build
