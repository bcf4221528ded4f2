# The two commands a newcomer needs: `make run` and `make test`. Both install what is missing.
SWIFT ?= $(shell command -v swift || echo /opt/swift/usr/bin/swift)
PREFIX ?= /usr/local
DESTDIR ?=

.PHONY: run test test-tsan test-asan build deps test-deps bench bench-full install uninstall compose-env clean

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

# Every test: unit, server integration (real PostgreSQL the tests start themselves), CLI,
# browser, the clients (the Python client's pytest suite runs from PythonClientTests), bench
# smoke. All are XCTest, run by scripts/run-tests: independent classes side by side, each in an
# xctest process of its own that shares nothing with the others (its own PostgreSQL cluster,
# copied from one initialised once per run, its own servers on kernel-chosen ports); the
# longest first. Its last line is the summary; a test listed but not run fails the run.
# The server classes that concern delivery between servers run a second time with every test
# server on a NATS cluster instead of LISTEN/NOTIFY (contract §10: every delivery guarantee
# holds with either carrier): the streams, the feed, POST /v1/changes, several servers on one
# database, the carrier's own truths, drain and resume, stale ends, cancel hints (the list and
# why: NATS_CLASSES in scripts/run-tests). TEST_WORKERS: processes at once (most of a test's
# time is waiting for processes, not CPU, so more than the cores).
TEST_WORKERS ?= 4
test: test-deps
	$(SWIFT) build --build-tests
	./scripts/run-tests $(TEST_WORKERS)

# The NATS client and carrier tests under ThreadSanitizer: libnats's threads must meet
# Dispatch's state only through the hand-off to each worker's loop.
test-tsan: test-deps
	$(SWIFT) build --build-tests --build-path .build-tsan -Xswiftc -sanitize=thread
	TSAN_OPTIONS=halt_on_error=1 $(SWIFT) test --skip-build --build-path .build-tsan --disable-swift-testing \
	  --filter 'NATSClientTests|NATSCarrierTests'

# The code that manages raw memory by hand under AddressSanitizer, in process: the HTTP layer's
# pooled read buffers, in-place chunked decoding and output queues (HTTPServerWireTests: requests,
# refusals, streams whose clients leave or stop reading, on a real loop), the loop's one-shot
# events, the curl and libpq shells. A use-after-free or double free halts the run. Leaks are not checked:
# LeakSanitizer cannot follow Swift's weak-reference side tables (XCTest's test cases read as leaked).
test-asan: test-deps
	$(SWIFT) build --build-tests --build-path .build-asan -Xswiftc -sanitize=address
	ASAN_OPTIONS=halt_on_error=1:detect_leaks=0 $(SWIFT) test --skip-build --build-path .build-asan --disable-swift-testing \
	  --filter 'HTTPServerWireTests|PGConnectionShellTests|EventPriorityTests|CurlHTTP1Tests|H2ClientTests|H2ClientNginxTests'

bench: deps
	./bench/run

bench-full: deps
	./bench/run --full

# dispatchd and dispatch into $(PREFIX)/bin, the systemd unit beside them (docs/deploy.md).
# The binaries carry their migrations and web files: nothing else is installed.
install: build
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/systemd/system
	install -m 0755 .build/release/dispatchd .build/release/dispatch $(DESTDIR)$(PREFIX)/bin/
	sed 's|/usr/local/|$(PREFIX)/|g' contrib/dispatchd.service > $(DESTDIR)$(PREFIX)/lib/systemd/system/dispatchd.service

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/dispatchd $(DESTDIR)$(PREFIX)/bin/dispatch $(DESTDIR)$(PREFIX)/lib/systemd/system/dispatchd.service

# A .env for docker-compose.yml with random secrets (kept if it exists).
compose-env:
	@if [ -f .env ]; then echo ".env exists; not touching it"; else \
	  umask 077; { echo "POSTGRES_PASSWORD=$$(openssl rand -hex 24)"; \
	    echo "DISPATCH_BOOTSTRAP_KEY=dsp_$$(openssl rand -hex 24)"; \
	    echo "DISPATCH_TOKEN_KEY=$$(openssl rand -hex 32)"; \
	    echo "DISPATCH_WEBHOOK_SECRET=$$(openssl rand -hex 32)"; \
	    echo "NATS_PASSWORD=$$(openssl rand -hex 24)"; } > .env; \
	  echo "wrote .env (mode 0600)"; fi

clean:
	rm -rf .build
