#!/usr/bin/python3
"""A local stand-in for Apple's push service (APNs) for Dispatch's tests.

Serves HTTP/2 over TLS (`POST /3/device/<token>`), checks every request the
way APNs does plus Dispatch's Live Activity payload contract, records it, and
answers 200 or an APNs-style error.  A plain HTTP/1.1 JSON control API on
127.0.0.1 lets tests read the recorded requests and script answers.

Needs Debian's python3-h2 and python3-jwt: run it with /usr/bin/python3.
See README.md beside this file.
"""

import argparse
import asyncio
import base64
import collections
import concurrent.futures
import hashlib
import json
import logging
import os
import re
import signal
import ssl
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import hpack.hpack
import jwt

log = logging.getLogger("fake_apns")

PATH_PREFIX = "/3/device/"
BROADCAST_PREFIX = "/4/broadcasts/apps/"
MANAGE_PREFIX = "/1/apps/"
MAX_PAYLOAD = 4096
MAX_BROADCAST_PAYLOAD = 5120
MAX_CHANNELS = 10000  # per app and environment
MAX_FUTURE_IAT = 60  # seconds a JWT's iat may lie ahead of our clock
GOAWAY_GRACE = 1.0  # seconds from our GOAWAY until we close the connection
HEX = re.compile(r"[0-9a-fA-F]*")
LOWER_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
EVENTS = ("start", "update", "end")
CONTENT_STATE_KEYS = frozenset({"state", "progress", "status", "attempt", "seq", "updatedAt", "cancelRequested"})
ATTRIBUTE_KEYS = frozenset({"activityId", "taskName", "machine", "systemImage"})
ALERT_END_STATES = ("error", "rejected")

# Reason used for a scripted answer that gives a status but no reason.
DEFAULT_REASONS = {
    400: "BadDeviceToken",
    403: "ExpiredProviderToken",
    410: "Unregistered",
    413: "PayloadTooLarge",
    429: "TooManyRequests",
    500: "InternalServerError",
    503: "ServiceUnavailable",
}


def cache_long_huffman_strings():
    """Make hpack remember what it decoded for long Huffman strings.

    nghttp2 (libcurl, curl) never adds `authorization` to the HPACK table, so
    every request carries the ~250-byte JWT as a Huffman literal, and hpack's
    pure-Python decoder spends more time on it than everything else a request
    costs.  The JWT is the same for many requests: a cache makes it a lookup.
    """
    decode, cache = hpack.hpack.decode_huffman, {}

    def cached(data):
        if len(data) < 64:
            return decode(data)
        key = bytes(data)
        value = cache.get(key)
        if value is None:
            if len(cache) >= 1024:
                cache.clear()
            value = cache[key] = decode(key)
        return value
    hpack.hpack.decode_huffman = cached


class Rejected(Exception):
    """A request APNs would refuse: status, reason and (for tests) detail."""

    def __init__(self, status, reason, detail=None):
        super().__init__(reason)
        self.status, self.reason, self.detail = status, reason, detail


# --- request checks ---------------------------------------------------------

def is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_path(method, path):
    """Return the device token named by the path."""
    if not path.startswith(PATH_PREFIX):
        raise Rejected(404, "BadPath", path)
    if method != "POST":
        raise Rejected(405, "MethodNotAllowed", method)
    token = path[len(PATH_PREFIX):]
    if not token:
        raise Rejected(400, "MissingDeviceToken")
    if len(token) % 2 or not 32 <= len(token) <= 512 or not HEX.fullmatch(token):
        raise Rejected(400, "BadDeviceToken", "token must be even-length hex, 16-256 bytes")
    return token


def check_headers(headers, topic):
    if headers.get("apns-topic") is None:
        raise Rejected(400, "MissingTopic")
    if headers["apns-topic"] != topic + ".push-type.liveactivity":
        raise Rejected(400, "BadTopic", headers["apns-topic"])
    if headers.get("apns-push-type") != "liveactivity":
        raise Rejected(400, "InvalidPushType", headers.get("apns-push-type"))
    if headers.get("apns-priority") not in ("5", "10"):
        raise Rejected(400, "BadPriority", headers.get("apns-priority"))
    expiration = headers.get("apns-expiration")
    if expiration is not None and not expiration.isdigit():
        raise Rejected(400, "BadExpirationDate", expiration)
    apns_id = headers.get("apns-id")
    if apns_id is not None and not LOWER_UUID.fullmatch(apns_id):
        raise Rejected(400, "BadMessageId", apns_id)


def parse_payload(body, limit=MAX_PAYLOAD):
    if not body:
        raise Rejected(400, "PayloadEmpty")
    if len(body) > limit:
        raise Rejected(413, "PayloadTooLarge", f"{len(body)} bytes")
    try:
        return json.loads(body, parse_constant=reject_constant)
    except ValueError as error:
        raise Rejected(400, "BadPayload", f"not JSON: {error}") from None


def reject_constant(name):
    raise ValueError(f"{name} is not JSON")


def require(condition, detail):
    """Reject a payload that breaks Dispatch's contract (CONTRACT.md 5.2)."""
    if not condition:
        raise Rejected(400, "InvalidPayload", detail)


def check_payload(payload):
    require(isinstance(payload, dict), "payload is not an object")
    aps = payload.get("aps")
    require(isinstance(aps, dict), "aps is not an object")
    event = aps.get("event")
    require(event in EVENTS, f"event {event!r}")
    require(is_int(aps.get("timestamp")), "timestamp is not an int")
    check_content_state(aps.get("content-state"))
    for key in ("stale-date", "dismissal-date"):
        require(key not in aps or is_int(aps[key]), f"{key} is not an int")
    require((event == "end") == ("dismissal-date" in aps), "dismissal-date goes with end only")
    require(event != "end" or "stale-date" not in aps, "stale-date goes with start and update only")
    is_start = event == "start"
    # iOS 18: a start asks for an update token, or subscribes to a broadcast channel.
    if is_start:
        require(("input-push-token" in aps) != ("input-push-channel" in aps),
                "start carries input-push-token or input-push-channel, one of them")
        require("input-push-token" not in aps or aps["input-push-token"] == 1, "input-push-token is not 1")
        require("input-push-channel" not in aps or (isinstance(aps["input-push-channel"], str)
                                                   and aps["input-push-channel"]), "input-push-channel is not a string")
    else:
        require("input-push-token" not in aps and "input-push-channel" not in aps,
                "input-push-token and input-push-channel go with start only")
    require(is_start == ("attributes-type" in aps), "attributes-type goes with start only")
    require(is_start == ("attributes" in aps), "attributes go with start only")
    if is_start:
        require(isinstance(aps["attributes-type"], str), "attributes-type is not a string")
        check_attributes(aps["attributes"])
    alert_allowed = is_start or (
        event == "end" and aps["content-state"]["state"] in ALERT_END_STATES)
    require(alert_allowed or "alert" not in aps, f"alert not allowed with {event}")
    if is_start or "alert" in aps:
        check_alert(aps.get("alert"))


def check_content_state(state):
    require(isinstance(state, dict), "content-state is not an object")
    require(state.keys() == CONTENT_STATE_KEYS,
            f"content-state keys {sorted(state)} != {sorted(CONTENT_STATE_KEYS)}")
    require(isinstance(state["state"], str), "content-state.state is not a string")
    require(state["progress"] is None or is_number(state["progress"]), "progress")
    require(state["status"] is None or isinstance(state["status"], str), "status")
    for key in ("attempt", "seq"):
        require(is_int(state[key]), f"content-state.{key} is not an int")
    require(is_number(state["updatedAt"]), "content-state.updatedAt is not a number")
    require(isinstance(state["cancelRequested"], bool), "content-state.cancelRequested is not a boolean")


def check_attributes(attributes):
    require(isinstance(attributes, dict), "attributes is not an object")
    missing = ATTRIBUTE_KEYS - attributes.keys()
    require(not missing, f"attributes lack {sorted(missing)}")


def check_alert(alert):
    require(isinstance(alert, dict), "alert is not an object")
    require(isinstance(alert.get("title"), str) and isinstance(alert.get("body"), str),
            "alert needs title and body strings")


# --- provider token (JWT) ---------------------------------------------------

class TokenVerifier:
    """Checks provider tokens.  Each distinct JWT string is verified once (an
    ES256 check costs far more than the rest of a request); only the age is
    checked per request."""

    def __init__(self, public_key, team_id, key_id):
        self.public_key, self.team_id, self.key_id = public_key, team_id, key_id
        self.cache = {}  # JWT string -> (sha256 hex, iat or None, problem or None)

    def check(self, authorization, now, max_age):
        """Return (hash, iat, Rejected or None) for a request's authorization."""
        if not authorization:
            return None, None, Rejected(403, "MissingProviderToken")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None, None, Rejected(403, "InvalidProviderToken", "not a bearer token")
        entry = self.cache.get(token)
        if entry is None:
            entry = self.cache[token] = self.verify(token)
        digest, iat, problem = entry
        if problem:
            return digest, iat, Rejected(403, "InvalidProviderToken", problem)
        if iat < now - max_age:
            return digest, iat, Rejected(403, "ExpiredProviderToken",
                                         f"iat {iat} is {now - iat:.0f} s old")
        if iat > now + MAX_FUTURE_IAT:
            return digest, iat, Rejected(403, "InvalidProviderToken", f"iat {iat} is in the future")
        return digest, iat, None

    def verify(self, token):
        """Check header, signature and the claims that do not depend on time."""
        digest = hashlib.sha256(token.encode()).hexdigest()
        try:
            header = jwt.get_unverified_header(token)
            claims = jwt.decode(token, self.public_key, algorithms=["ES256"],
                                options={"verify_exp": False, "verify_iat": False,
                                         "verify_nbf": False, "verify_aud": False})
        except jwt.PyJWTError as error:
            return digest, None, str(error)
        iat = claims.get("iat") if is_int(claims.get("iat")) else None
        problem = (
            "alg is not ES256" if header.get("alg") != "ES256" else
            f"kid {header.get('kid')!r}" if header.get("kid") != self.key_id else
            f"iss {claims.get('iss')!r}" if claims.get("iss") != self.team_id else
            "iat is not an int" if iat is None else None)
        return digest, iat, problem


# --- shared state (touched only on the event loop's thread) -----------------

class Fake:
    """Recorded requests, scripted answers, settings and open connections."""

    def __init__(self, args, verifier):
        self.topic = args.topic
        self.default_max_age = args.max_jwt_age
        self.max_age = args.max_jwt_age
        self.default_min_interval = args.min_jwt_interval
        self.min_interval = args.min_jwt_interval
        # The team's provider tokens APNs took: JWT hash -> when first taken.  A new one
        # sooner than min_interval after the last one taken is refused (Apple: at most one
        # token update every 20 minutes).
        self.tokens_taken = {}
        # This instance's APNs environment, and the environment of tokens the tests declared:
        # a token of another environment (or of none) is a BadDeviceToken here, as with Apple.
        self.environment = args.environment
        self.token_environments = {}
        # Broadcast channels of this environment: id -> {"message-storage-policy", ...}.
        self.channels = {}
        self.broadcast_enabled = True
        self.max_channels = MAX_CHANNELS
        self.verifier = verifier
        self.requests = []
        self.scripts = {}     # token or "*" -> deque of answer items
        self.otherwise = {}   # token or "*" -> answer item once its queue is empty
        self.connections = {}  # connection id -> APNsConnection
        self.connections_opened = 0
        self.refused_streams = 0
        # HTTP/2 PING frames received (answered by h2 unless the connection is silent).
        self.pings = 0

    def handle(self, conn, stream_id, raw_headers, body):
        """Check and record one complete request, then answer it."""
        now = time.time()
        headers = {name.lower(): value for name, value in raw_headers}
        record = new_record(conn.id, stream_id, headers, now, conn.listener)
        self.requests.append(record)
        try:
            item = self.admit(record, len(raw_headers), body, now)
        except Rejected as rejected:
            record["detail"] = rejected.detail
            log.info("stream %d on connection %d: %d %s (%s)", stream_id, conn.id,
                     rejected.status, rejected.reason, rejected.detail)
            item = {"status": rejected.status, "reason": rejected.reason}
        else:
            record["scripted"] = item is not None
        conn.perform(stream_id, record, item or {"status": 200})

    def admit(self, record, header_count, body, now):
        """Run APNs' checks; return the scripted answer for the token, if any."""
        headers = record["headers"]
        path = headers.get(":path", "")
        if record["listener"] == "manage":
            return self.admit_management(record, header_count, body, now)
        if path.startswith(BROADCAST_PREFIX):
            return self.admit_broadcast(record, header_count, body, now)
        if path.startswith(PATH_PREFIX):  # recorded even when malformed
            record["token"] = path[len(PATH_PREFIX):]
        token = check_path(headers.get(":method"), path)
        if len(headers) != header_count:
            raise Rejected(400, "DuplicateHeaders")
        record["jwtHash"], record["jwtIat"], rejected = self.verifier.check(
            headers.get("authorization"), now, self.max_age)
        if rejected:
            raise rejected
        self.take_token(record["jwtHash"], now)
        self.authenticated_on(record)
        check_headers(headers, self.topic)
        record["body"] = payload = parse_payload(body)
        check_payload(payload)
        declared = self.token_environments.get(token.lower())
        if declared is not None and declared != self.environment:
            raise Rejected(400, "BadDeviceToken", f"a {declared} token sent to {self.environment}")
        # A channel lives in one environment: a phone of this environment cannot subscribe to
        # a channel of the other (APNs takes the push; the phone fails to start the activity).
        channel = payload["aps"].get("input-push-channel")
        if channel is not None and channel not in self.channels:
            raise Rejected(400, "BadChannelId", f"input-push-channel {channel} is not a channel of {self.environment}")
        return self.next_answer(token)

    def authenticate(self, record, headers, header_count, now):
        if len(headers) != header_count:
            raise Rejected(400, "DuplicateHeaders")
        record["jwtHash"], record["jwtIat"], rejected = self.verifier.check(
            headers.get("authorization"), now, self.max_age)
        if rejected:
            raise rejected
        self.take_token(record["jwtHash"], now)
        self.authenticated_on(record)

    def bundle_of(self, path, prefix):
        rest = path[len(prefix):]
        bundle, _, tail = rest.partition("/")
        if bundle != self.topic:
            raise Rejected(400, "BadTopic", f"bundle id {bundle!r}")
        return tail

    def channel_of(self, headers, required=True):
        channel = headers.get("apns-channel-id")
        if channel is None:
            raise Rejected(400, "MissingChannelId")
        try:
            valid = len(base64.b64decode(channel, validate=True)) > 0
        except ValueError:
            valid = False
        if not valid:
            raise Rejected(400, "BadChannelId", channel)
        if channel not in self.channels:
            raise Rejected(400, "ChannelNotRegistered", channel)
        return channel

    def admit_broadcast(self, record, header_count, body, now):
        """POST /4/broadcasts/apps/<bundle id>: one push to every phone on a channel."""
        headers = record["headers"]
        if headers.get(":method") != "POST":
            raise Rejected(405, "MethodNotAllowed", headers.get(":method"))
        if self.bundle_of(headers.get(":path", ""), BROADCAST_PREFIX):
            raise Rejected(404, "BadPath", headers.get(":path"))
        record["channel"] = "push"
        self.authenticate(record, headers, header_count, now)
        record["channelId"] = channel = self.channel_of(headers)
        push_type = headers.get("apns-push-type")
        if push_type is None:
            raise Rejected(400, "MissingPushType")
        if push_type != "liveactivity":
            raise Rejected(400, "InvalidPushType", push_type)
        if headers.get("apns-priority") not in ("1", "5", "10"):
            raise Rejected(400, "BadPriority", headers.get("apns-priority"))
        expiration = headers.get("apns-expiration")
        if expiration is None or not expiration.isdigit():
            raise Rejected(400, "BadExpirationDate", expiration)
        if self.channels[channel]["message-storage-policy"] == 0 and expiration != "0":
            raise Rejected(400, "BadExpirationDate", "a channel that stores nothing takes apns-expiration 0 only")
        record["body"] = payload = parse_payload(body, MAX_BROADCAST_PAYLOAD)
        check_payload(payload)
        require(payload["aps"]["event"] != "start", "a channel cannot start a Live Activity")
        record["channel"] = "push"
        return self.next_answer(channel) or {"status": 200, "headers": [
            ("apns-request-id", str(uuid.uuid4())), ("apns-unique-id", str(uuid.uuid4()))]}

    def admit_management(self, record, header_count, body, now):
        """The channel management API: create, read, list, delete."""
        headers = record["headers"]
        method, path = headers.get(":method"), headers.get(":path", "")
        if not path.startswith(MANAGE_PREFIX):
            raise Rejected(404, "BadPath", path)
        tail = self.bundle_of(path, MANAGE_PREFIX)
        if tail not in ("channels", "all-channels"):
            raise Rejected(404, "BadPath", path)
        record["channel"] = {"POST": "create", "GET": "read", "DELETE": "delete"}.get(method) \
            if tail == "channels" else "list"
        self.authenticate(record, headers, header_count, now)
        request_id = headers.get("apns-request-id") or str(uuid.uuid4())
        if tail == "all-channels":
            if method != "GET":
                raise Rejected(405, "MethodNotAllowed", method)
            return {"status": 200, "headers": [("apns-request-id", request_id)],
                    "body": {"channels": sorted(self.channels)}}
        if method == "POST":
            record["channel"] = "create"
            try:
                spec = json.loads(body or b"null")
            except ValueError:
                raise Rejected(400, "BadPayload", "not JSON") from None
            if not isinstance(spec, dict):
                raise Rejected(400, "BadPayload", "not an object")
            record["body"] = spec
            if "push-type" not in spec:
                raise Rejected(400, "MissingPushType")
            if spec["push-type"] != "LiveActivity":
                raise Rejected(400, "InvalidPushType", spec["push-type"])
            policy = spec.get("message-storage-policy")
            if policy not in (0, 1) or isinstance(policy, bool):
                raise Rejected(400, "BadMessageStoragePolicy", repr(policy))
            scripted = self.next_answer("create")
            if scripted:
                return scripted
            if not self.broadcast_enabled:
                raise Rejected(400, "FeatureNotEnabled", "broadcast is not enabled for the App ID")
            if len(self.channels) >= self.max_channels:
                raise Rejected(400, "CannotCreateChannelConfig", f"{len(self.channels)} channels")
            channel = base64.b64encode(os.urandom(16)).decode()
            self.channels[channel] = {"message-storage-policy": policy, "push-type": "LiveActivity",
                                      "created": now}
            record["channelId"] = channel
            return {"status": 201, "headers": [("apns-request-id", request_id), ("apns-channel-id", channel)]}
        if method == "GET":
            record["channel"] = "read"
            record["channelId"] = channel = self.channel_of(headers)
            info = self.channels[channel]
            return {"status": 200, "headers": [("apns-request-id", request_id)],
                    "body": {"message-storage-policy": info["message-storage-policy"], "push-type": info["push-type"]}}
        if method == "DELETE":
            record["channel"] = "delete"
            record["channelId"] = channel = self.channel_of(headers)
            del self.channels[channel]
            return {"status": 204, "headers": [("apns-request-id", request_id)]}
        raise Rejected(405, "MethodNotAllowed", method)

    def authenticated_on(self, record):
        conn = self.connections.get(record["connection"])
        if conn is not None:
            conn.on_authenticated()

    def take_token(self, digest, now):
        if digest in self.tokens_taken:
            return
        last = max(self.tokens_taken.values(), default=None)
        if last is not None and now - last < self.min_interval:
            raise Rejected(429, "TooManyProviderTokenUpdates",
                           f"a new provider token {now - last:.0f} s after the last one")
        self.tokens_taken[digest] = now

    def next_answer(self, token):
        for key in (token, "*"):
            queue = self.scripts.get(key)
            if queue:
                return queue.popleft()
        return self.otherwise.get(token) or self.otherwise.get("*")

    # Control operations, called through run_on_loop from the control thread.

    def script(self, spec):
        """Queue answers for a token ("*": any token), replacing its old script."""
        token = spec["token"]
        self.scripts[token] = collections.deque(spec.get("respond", []))
        self.otherwise[token] = spec.get("otherwise")
        return {"token": token, "queued": len(self.scripts[token])}

    def declare_token(self, spec):
        self.token_environments[spec["token"].lower()] = spec["environment"]
        return {"token": spec["token"], "environment": spec["environment"]}

    def reset(self, _spec=None):
        self.token_environments.clear()
        self.channels.clear()
        self.broadcast_enabled = True
        self.max_channels = MAX_CHANNELS
        self.scripts.clear()
        self.otherwise.clear()
        self.max_age = self.default_max_age
        self.min_interval = self.default_min_interval
        self.tokens_taken.clear()
        return {}

    def configure(self, spec):
        if "maxJwtAgeSeconds" in spec:
            self.max_age = spec["maxJwtAgeSeconds"]
        if "minJwtIntervalSeconds" in spec:
            self.min_interval = spec["minJwtIntervalSeconds"]
        if "broadcastEnabled" in spec:
            self.broadcast_enabled = bool(spec["broadcastEnabled"])
        if "maxChannels" in spec:
            self.max_channels = int(spec["maxChannels"])
        return {"maxJwtAgeSeconds": self.max_age, "minJwtIntervalSeconds": self.min_interval,
                "broadcastEnabled": self.broadcast_enabled, "maxChannels": self.max_channels,
                "channels": sorted(self.channels)}

    def clear_requests(self, _spec=None):
        self.requests = []
        return {}

    def snapshot(self):
        return list(self.requests), self.connections_opened, len(self.connections), self.refused_streams, self.pings

    def silence_all(self, _spec=None):
        """The peer stops answering on every open connection: no answers, no PING ACKs, no
        FIN (a host gone, a middlebox that forgot the flow). New connections are served."""
        conns = [conn for conn in self.connections.values() if conn.serving]
        for conn in conns:
            conn.silent = True
        return {"connections": len(conns)}

    def goaway_all(self, _spec=None):
        conns = [conn for conn in self.connections.values() if conn.serving]
        for conn in conns:
            conn.goaway()
        return {"connections": len(conns)}


def new_record(conn_id, stream_id, headers, now, listener="push"):
    # Every key exists from the start: the control thread may serialize a
    # record while the loop fills it in, and a dict must not grow meanwhile.
    return {
        "time": now, "connection": conn_id, "streamId": stream_id, "listener": listener,
        "channel": None, "channelId": None,
        "token": None, "headers": headers,
        "body": None, "jwtIat": None, "jwtHash": None, "status": None,
        "reason": None, "detail": None, "action": None, "scripted": False,
        "apnsId": None,
    }


# --- the HTTP/2 side ----------------------------------------------------------

# h2's per-header validation and normalization cost about a fifth of a
# request; the clients under test (libcurl, curl: nghttp2) send valid HTTP/2.
H2_CONFIG = h2.config.H2Configuration(
    client_side=False, header_encoding="utf-8",
    validate_inbound_headers=False, normalize_inbound_headers=False,
    validate_outbound_headers=False, normalize_outbound_headers=False)


class AdvertisedSettings(h2.settings.Settings):
    """Settings whose MAX_CONCURRENT_STREAMS is advertised but not enforced by h2 (which
    would drop the whole connection); the connection refuses extra streams itself, with
    RST_STREAM(REFUSED_STREAM), as APNs does."""

    @property
    def max_concurrent_streams(self):
        return 2 ** 31 - 1


class APNsConnection(asyncio.Protocol):
    """One client connection: HTTP/2 framing with h2, answers per stream."""

    def __init__(self, fake, max_streams, listener="push"):
        self.fake, self.max_streams, self.listener = fake, max_streams, listener
        self.transport = self.h2 = None
        self.serving = True  # False once closing or after GOAWAY: no more answers
        self.partial = {}  # stream id -> (headers, body bytearray) until END_STREAM
        self.delayed = {}  # stream id -> TimerHandle of a delayed answer
        # APNs allows one stream on a new connection until a request has authenticated,
        # then raises the limit: a client that opens more meanwhile gets them refused.
        self.authenticated = False
        self.unanswered = set()  # stream ids received and not answered yet
        self.refused = set()
        self.silent = False  # silence_all: everything received is ignored

    def connection_made(self, transport):
        self.transport = transport
        fake = self.fake
        fake.connections_opened += 1
        self.id = fake.connections_opened
        protocol = transport.get_extra_info("ssl_object").selected_alpn_protocol()
        if protocol != "h2":
            log.warning("connection %d: ALPN %r, not h2; closing", self.id, protocol)
            self.serving = False
            transport.abort()
            return
        fake.connections[self.id] = self
        self.h2 = h2.connection.H2Connection(H2_CONFIG)
        self.h2.local_settings = AdvertisedSettings(client=False, initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20,
        })
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(1 << 24)
        self.flush()
        log.info("connection %d opened from %s", self.id, transport.get_extra_info("peername"))

    def connection_lost(self, exc):
        self.serving = False
        self.cancel_delayed()
        if self.fake.connections.pop(self.id, None) is not None:
            log.info("connection %d closed", self.id)

    def data_received(self, data):
        if self.silent and self.serving:
            self.count_pings_only(data)
            return
        if not self.serving:
            return
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as error:
            log.warning("connection %d: protocol error %s", self.id, error)
            self.flush()
            self.close()
            return
        for event in events:
            if not self.serving:
                return
            self.on_event(event)
        self.flush()

    def count_pings_only(self, data):
        """A silent peer still counts the PINGs that reach it (h2 queues their ACKs, which
        are never sent); nothing else is acted on."""
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError:
            return
        self.fake.pings += sum(1 for event in events if type(event) is h2.events.PingReceived)

    def on_event(self, event):
        kind = type(event)
        if kind is h2.events.RequestReceived:
            if not self.authenticated and self.unanswered:
                self.refused.add(event.stream_id)
                self.fake.refused_streams += 1
                self.h2.reset_stream(event.stream_id, error_code=h2.errors.ErrorCodes.REFUSED_STREAM)
                return
            self.unanswered.add(event.stream_id)
            self.partial[event.stream_id] = (event.headers, bytearray())
        elif kind is h2.events.DataReceived:
            self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            if event.stream_id in self.partial:
                self.partial[event.stream_id][1].extend(event.data)
        elif kind is h2.events.StreamEnded:
            if event.stream_id not in self.partial:
                return
            headers, body = self.partial.pop(event.stream_id)
            self.fake.handle(self, event.stream_id, headers, bytes(body))
        elif kind is h2.events.StreamReset:
            self.partial.pop(event.stream_id, None)
            self.unanswered.discard(event.stream_id)
            timer = self.delayed.pop(event.stream_id, None)
            if timer:
                timer.cancel()
        elif kind is h2.events.PingReceived:
            self.fake.pings += 1  # h2 queues the ACK itself
        elif kind is h2.events.ConnectionTerminated:
            self.close()

    def perform(self, stream_id, record, item):
        """Carry out one answer item: a status, a delay, a GOAWAY or a drop."""
        action = item.get("action")
        record["action"] = action
        if action == "goaway":
            self.goaway(below=stream_id)
        elif action == "drop":
            self.serving = False
            self.transport.abort()
        elif action == "delay":
            rest = {k: v for k, v in item.items() if k not in ("action", "seconds")}
            self.delayed[stream_id] = asyncio.get_running_loop().call_later(
                float(item.get("seconds", 1)), self.answer_later, stream_id, record, rest)
        else:
            self.answer(stream_id, record, item)

    def answer_later(self, stream_id, record, item):
        self.delayed.pop(stream_id, None)
        if self.serving:
            self.answer(stream_id, record, item)
            self.flush()

    def on_authenticated(self):
        """The first request with a valid provider token: the stream limit goes up."""
        if self.authenticated or not self.serving:
            return
        self.authenticated = True
        self.h2.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: self.max_streams})

    def answer(self, stream_id, record, item):
        self.unanswered.discard(stream_id)
        status = int(item.get("status", 200))
        apns_id = record["headers"].get("apns-id") or str(uuid.uuid4())
        headers = [(":status", str(status)), ("apns-id", apns_id)]
        record["apnsId"], record["status"] = apns_id, status
        try:
            if 200 <= status < 300:
                headers += [(k.lower(), v) for k, v in item.get("headers", [])]
                if "body" in item:
                    body = json.dumps(item["body"]).encode()
                    headers += [("content-type", "application/json"), ("content-length", str(len(body)))]
                    self.h2.send_headers(stream_id, headers)
                    self.h2.send_data(stream_id, body, end_stream=True)
                else:
                    self.h2.send_headers(stream_id, headers, end_stream=True)
                return
            record["reason"] = reason = item.get("reason") or DEFAULT_REASONS.get(status, "Error")
            error = {"reason": reason}
            if status == 410:  # APNs says since when the token is invalid, in ms
                error["timestamp"] = int(item.get("timestamp", time.time() * 1000))
            body = json.dumps(error).encode()
            headers += [("content-type", "application/json"), ("content-length", str(len(body)))]
            self.h2.send_headers(stream_id, headers)
            self.h2.send_data(stream_id, body, end_stream=True)
        except h2.exceptions.StreamClosedError:
            log.info("stream %d on connection %d was reset before its answer", stream_id, self.id)

    def goaway(self, below=None):
        """Send GOAWAY, answer nothing more, close soon.

        last_stream_id stays below every stream not answered yet (and below
        `below`): the client knows those were not processed and may retry.
        """
        if not self.serving:
            return
        unanswered = set(self.partial) | set(self.delayed)
        if below is not None:
            unanswered.add(below)
        last = max(min(unanswered) - 2 if unanswered else self.h2.highest_inbound_stream_id, 0)
        self.h2.close_connection(last_stream_id=last)
        self.flush()
        log.info("connection %d: GOAWAY last_stream_id=%d", self.id, last)
        self.serving = False
        self.cancel_delayed()
        # Closing at once while the client still sends would make the kernel
        # reset the TCP connection, and the client could lose the GOAWAY: read
        # and ignore its data until it hangs up or the grace period is over.
        asyncio.get_running_loop().call_later(GOAWAY_GRACE, self.transport.close)

    def close(self):
        self.serving = False
        self.transport.close()  # sends what is buffered, then closes

    def cancel_delayed(self):
        for timer in self.delayed.values():
            timer.cancel()
        self.delayed.clear()

    def flush(self):
        data = self.h2.data_to_send()
        if data:
            self.transport.write(data)


# --- the control side -------------------------------------------------------

def check_answer_item(item):
    """Refuse typos in scripted answers early, with a clear message."""
    if not isinstance(item, dict):
        raise ValueError(f"answer item {item!r} is not an object")
    if item.get("action") not in (None, "goaway", "drop", "delay"):
        raise ValueError(f"unknown action {item['action']!r}")
    if "status" in item and not is_int(item["status"]):
        raise ValueError(f"status {item['status']!r} is not an int")
    if "seconds" in item and not is_number(item["seconds"]):
        raise ValueError(f"seconds {item['seconds']!r} is not a number")


def check_script(spec):
    if not isinstance(spec, dict) or not isinstance(spec.get("token"), str):
        raise ValueError('expected {"token": T, "respond": [...]}')
    if not isinstance(spec.get("respond", []), list):
        raise ValueError("respond must be a list")
    for item in spec.get("respond", []) + ([spec["otherwise"]] if "otherwise" in spec else []):
        check_answer_item(item)


def check_declaration(spec):
    if not isinstance(spec, dict) or not isinstance(spec.get("token"), str) or \
            spec.get("environment") not in ("production", "sandbox", "none"):
        raise ValueError('expected {"token": T, "environment": "production"|"sandbox"|"none"}')


def check_config(spec):
    if not isinstance(spec, dict) or not all(
            is_number(spec.get(k, 0)) for k in ("maxJwtAgeSeconds", "minJwtIntervalSeconds", "maxChannels")):
        raise ValueError('expected {"maxJwtAgeSeconds": N, "minJwtIntervalSeconds": M, "maxChannels": C, '
                         '"broadcastEnabled": B} (any of them)')


def stats(requests, opened, open_now, refused=0, pings=0):
    by_status = collections.Counter(str(r["status"]) for r in requests if r["status"] is not None)
    return {
        "total": len(requests),
        "byStatus": dict(by_status),
        "unanswered": sum(1 for r in requests if r["status"] is None),
        "connectionsOpened": opened,
        "connectionsOpen": open_now,
        "distinctJwts": len({r["jwtHash"] for r in requests if r["jwtHash"]}),
        "refusedStreams": refused,
        "pings": pings,
    }


class ControlHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-apns-control"

    def do_GET(self):
        url = urlsplit(self.path)
        if url.path == "/requests":
            requests, _, _, _, _ = self.call(Fake.snapshot)
            token = parse_qs(url.query).get("token", [None])[0]
            if token is not None:
                requests = [r for r in requests if r["token"] == token]
            self.reply(200, {"requests": requests})
        elif url.path == "/stats":
            self.reply(200, stats(*self.call(Fake.snapshot)))
        else:
            self.reply(404, {"error": "unknown path"})

    def do_POST(self):
        self.route({"/behavior": (Fake.script, check_script),
                    "/config": (Fake.configure, check_config),
                    "/tokens": (Fake.declare_token, check_declaration),
                    "/goaway-all": (Fake.goaway_all, None),
                    "/silence-all": (Fake.silence_all, None)})

    def do_DELETE(self):
        self.route({"/requests": (Fake.clear_requests, None),
                    "/behavior": (Fake.reset, None)})

    def route(self, routes):
        operation, validate = routes.get(urlsplit(self.path).path, (None, None))
        if operation is None:
            self.reply(404, {"error": "unknown path"})
            return
        length = int(self.headers.get("content-length") or 0)
        try:
            spec = json.loads(self.rfile.read(length) or b"{}")
            if validate:
                validate(spec)
        except ValueError as error:
            self.reply(400, {"error": str(error)})
            return
        self.reply(200, self.call(operation, spec))

    def call(self, operation, *args):
        return self.server.run_on_loop(operation, *args)

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, fmt, *args):
        log.debug("control: " + fmt, *args)


class ControlServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port, fake, loop):
        super().__init__(("127.0.0.1", port), ControlHandler)
        self.fake, self.loop = fake, loop

    def run_on_loop(self, operation, *args):
        """Run operation(fake, *args) on the event loop's thread; return its result."""
        future = concurrent.futures.Future()

        def run():
            try:
                future.set_result(operation(self.fake, *args))
            except Exception as error:  # handed back to the control thread
                future.set_exception(error)

        self.loop.call_soon_threadsafe(run)
        return future.result(timeout=30)


# --- start-up -----------------------------------------------------------------

def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cert", required=True, help="server certificate (PEM)")
    parser.add_argument("--key", required=True, help="server private key (PEM)")
    parser.add_argument("--auth-key-pub", required=True,
                        help="public half of the APNs auth key (.p8), PEM")
    parser.add_argument("--team-id", required=True, help="expected JWT iss")
    parser.add_argument("--key-id", required=True, help="expected JWT kid")
    parser.add_argument("--topic", required=True, help="app bundle id")
    parser.add_argument("--environment", choices=("production", "sandbox"), default="production",
                        help="the APNs environment this instance plays")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="APNs port (0: any free)")
    parser.add_argument("--control-port", type=int, default=0, help="control port (0: any free)")
    parser.add_argument("--manage-port", type=int, default=0,
                        help="channel management API port (0: any free)")
    parser.add_argument("--max-jwt-age", type=float, default=3600,
                        help="seconds after iat before ExpiredProviderToken")
    parser.add_argument("--min-jwt-interval", type=float, default=1200,
                        help="seconds after a new provider token before another new one is taken "
                             "(else 429 TooManyProviderTokenUpdates)")
    parser.add_argument("--max-concurrent-streams", type=int, default=1000)
    parser.add_argument("--ignore-stdin", action="store_true",
                        help="do not exit when stdin reaches EOF (for manual runs)")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser.parse_args(argv)


def tls_context(cert, key):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["h2"])
    return context


def exit_on_stdin_eof(loop, stop):
    """A test that dies closes our stdin: then stop rather than leak."""
    def watch():
        try:
            while os.read(0, 65536):
                pass
        except OSError:  # no stdin at all counts as closed
            pass
        loop.call_soon_threadsafe(stop.set)
    threading.Thread(target=watch, name="stdin-watch", daemon=True).start()


async def serve(args):
    loop = asyncio.get_running_loop()
    with open(args.auth_key_pub, "rb") as f:
        public_key = f.read()
    fake = Fake(args, TokenVerifier(public_key, args.team_id, args.key_id))
    server = await loop.create_server(
        lambda: APNsConnection(fake, args.max_concurrent_streams),
        args.host, args.port, ssl=tls_context(args.cert, args.key))
    # Apple's channel management API lives on its own host and port.
    manage = await loop.create_server(
        lambda: APNsConnection(fake, args.max_concurrent_streams, "manage"),
        args.host, args.manage_port, ssl=tls_context(args.cert, args.key))
    control = ControlServer(args.control_port, fake, loop)
    threading.Thread(target=control.serve_forever, kwargs={"poll_interval": 0.1},
                     name="control", daemon=True).start()

    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if not args.ignore_stdin:
        exit_on_stdin_eof(loop, stop)

    port = server.sockets[0].getsockname()[1]
    print(json.dumps({"port": port, "managePort": manage.sockets[0].getsockname()[1],
                      "controlPort": control.server_address[1]}), flush=True)
    log.info("APNs on %s:%d, control on 127.0.0.1:%d", args.host, port, control.server_address[1])
    await stop.wait()
    log.info("stopping")
    control.shutdown()
    control.server_close()
    server.close()
    manage.close()
    for conn in list(fake.connections.values()):
        conn.close()


def main(argv=None):
    args = parse_args(argv)
    cache_long_huffman_strings()
    logging.basicConfig(stream=sys.stderr, level=logging.DEBUG if args.verbose else logging.INFO,
                        format="fake_apns %(levelname)s %(message)s")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
