"""Sluice from Python: a client of ``sluice serve``, the HTTP sidecar.

Callers in Python share a bucket or a semaphore with every other process
of the fleet (Go processes that use the library, other sidecars' callers):
each waits its turn in arrival order at Redis, and starts when its token is
really there.

    import sluice

    async with sluice.Bucket("api", cost={"": 1, "pu": 60}):
        await call_the_api()

    with sluice.Semaphore("crawler"):
        crawl()

The server's address comes from ``url=`` or the ``SLUICE_URL`` environment
variable (default ``http://127.0.0.1:8080``); its bearer token from
``token=`` or ``SLUICE_TOKEN``. Standard library only; Python 3.9 or later.

Every call opens one HTTP/1.1 connection and closes it when answered:
a caller that is cancelled (``asyncio`` cancellation, a timeout, Ctrl-C)
closes its connection, and the server gives its place in the queue back.
"""

import asyncio
import json
import os
import socket
import ssl
import threading
import urllib.parse

__all__ = [
    "Bucket",
    "Semaphore",
    "Reservation",
    "Permit",
    "Grant",
    "Estimate",
    "Error",
    "WaitTooLong",
    "QueueFull",
    "ConfigError",
    "LeaseLost",
    "Unauthorized",
    "Unavailable",
]

DEFAULT_URL = "http://127.0.0.1:8080"


class Error(Exception):
    """An error the server answered, in its words.

    ``status`` is the HTTP status, ``reason`` the server's word for the
    kind of error (``"wait_too_long"``, ``"not_found"``, ...), and the
    message is the server's ``error``.
    """

    def __init__(self, message, status=0, reason=""):
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason


class WaitTooLong(Error):
    """The caller could not be granted within its timeout; it took no place
    and no token. ``retry_after`` is the estimate of its earliest turn, in
    seconds (``None`` when the server gave none)."""

    def __init__(self, message, status=429, reason="wait_too_long", retry_after=None):
        super().__init__(message, status, reason)
        self.retry_after = retry_after


class QueueFull(Error):
    """Too many callers already wait (the bucket's MaxQueue, or the
    server's --max-waiting)."""


class ConfigError(Error):
    """The request cannot be served as it is: an unknown bucket or
    semaphore, a cost in a unit no policy counts, a cost above a policy's
    capacity, a bad name, or policies that differ from those in force."""


class LeaseLost(Error):
    """A permit's lease ended before it was released: it was not renewed in
    time. Another caller may hold the place now."""


class Unauthorized(Error):
    """The server wants a bearer token (``token=`` or ``SLUICE_TOKEN``)."""


class Unavailable(Error):
    """The server cannot answer now: Redis is unreachable, or the server is
    shutting down."""


_BY_REASON = {
    "wait_too_long": WaitTooLong,
    "queue_full": QueueFull,
    "bad_request": ConfigError,
    "not_found": ConfigError,
    "config_mismatch": ConfigError,
    "too_large": ConfigError,
    "lease_lost": LeaseLost,
    "unauthorized": Unauthorized,
    "unavailable": Unavailable,
}


def _error(status, body):
    message = body.get("error") or "HTTP %d" % status
    reason = body.get("reason", "")
    cls = _BY_REASON.get(reason, Error)
    if cls is WaitTooLong:
        ms = body.get("retry_after_ms")
        return WaitTooLong(message, status, reason, None if ms is None else ms / 1000.0)
    return cls(message, status, reason)


class _Server:
    """Where the server is, and how to send it one request."""

    def __init__(self, url=None, token=None):
        url = url or os.environ.get("SLUICE_URL") or DEFAULT_URL
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("sluice: url %r, want http://host:port or https://host:port" % url)
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.tls = ssl.create_default_context() if parts.scheme == "https" else None
        self.base = parts.path.rstrip("/")
        self.token = token if token is not None else os.environ.get("SLUICE_TOKEN")

    def request(self, method, path, body):
        """The bytes of one request, which closes its connection."""
        data = b"" if body is None else json.dumps(body).encode()
        lines = [
            "%s %s%s HTTP/1.1" % (method, self.base, path),
            "Host: %s:%d" % (self.host, self.port),
            "Connection: close",
            "Content-Type: application/json",
            "Content-Length: %d" % len(data),
        ]
        if self.token:
            lines.append("Authorization: Bearer %s" % self.token)
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + data

    def call(self, method, path, body=None):
        """Send one request and return the answer's JSON, or raise."""
        sock = socket.create_connection((self.host, self.port))
        try:
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_hostname=self.host)
            sock.sendall(self.request(method, path, body))
            chunks = []
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            sock.close()
        return _answer(b"".join(chunks))

    async def acall(self, method, path, body=None):
        """call, in asyncio: cancelling it closes the connection, which
        gives the caller's place back."""
        reader, writer = await asyncio.open_connection(
            self.host, self.port, ssl=self.tls, server_hostname=self.host if self.tls else None
        )
        try:
            writer.write(self.request(method, path, body))
            await writer.drain()
            data = await reader.read()
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except (OSError, asyncio.CancelledError):
                pass
        return _answer(data)


def _answer(data):
    """The JSON of an HTTP/1.1 response read to its end, or raise its error."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        raise Unavailable("sluice: the server closed the connection without an answer")
    lines = head.decode("iso-8859-1").split("\r\n")
    try:
        status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError):
        raise Error("sluice: not an HTTP response: %r" % lines[0][:80])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = _unchunk(body)
    elif "content-length" in headers:
        body = body[: int(headers["content-length"])]
    try:
        doc = json.loads(body.decode() or "{}")
    except ValueError:
        raise Error("sluice: HTTP %d with a body that is not JSON: %r" % (status, body[:200]), status)
    if status != 200:
        raise _error(status, doc)
    return doc


def _unchunk(body):
    out = []
    while body:
        size, _, rest = body.partition(b"\r\n")
        n = int(size.split(b";")[0], 16)
        if n == 0:
            break
        out.append(rest[:n])
        body = rest[n + 2 :]
    return b"".join(out)


def _quote(name):
    if not name:
        raise ValueError("sluice: empty name")
    return urllib.parse.quote(name, safe="")


def _timeout_ms(timeout):
    if timeout is None:
        return 0
    if timeout <= 0:
        raise ValueError("sluice: timeout %r, want > 0 seconds (None waits as long as needed)" % timeout)
    return max(1, int(timeout * 1000))


class Grant:
    """A caller's grant: ``waited`` seconds in the queue, and its ``ticket``,
    its arrival order at Redis among the bucket's callers (0: it did not
    queue)."""

    __slots__ = ("waited", "ticket")

    def __init__(self, doc):
        self.waited = doc.get("waited_ms", 0) / 1000.0
        self.ticket = doc.get("ticket", 0)

    def __repr__(self):
        return "Grant(waited=%.3f, ticket=%d)" % (self.waited, self.ticket)


class Estimate:
    """What a caller would meet if it entered now: ``wait`` seconds until its
    turn, and ``ahead`` callers queued before it, in every process."""

    __slots__ = ("wait", "ahead")

    def __init__(self, doc):
        self.wait = doc.get("wait_ms", 0) / 1000.0
        self.ahead = doc.get("ahead", 0)

    def __repr__(self):
        return "Estimate(wait=%.3f, ahead=%d)" % (self.wait, self.ahead)


class Bucket:
    """A shared token bucket, served by ``sluice serve``.

    ``cost`` is what one ``enter`` takes by default, by unit: ``{"": 1,
    "pu": 60}`` is one call and 60 processing units; ``None`` is one call.
    ``timeout`` (seconds) is the most a caller waits: a caller whose turn is
    estimated later is refused at once with ``WaitTooLong``, taking nothing.
    The bucket's policies are the server's (its --config, or Redis), never
    the client's.

    ``async with bucket:`` and ``with bucket:`` enter once. A Bucket holds no
    connection between calls and is safe to share between tasks and
    threads.
    """

    def __init__(self, name, cost=None, timeout=None, url=None, token=None):
        self.name = name
        self.cost = cost
        self.timeout = timeout
        self._server = _Server(url, token)
        self._path = "/v1/buckets/" + _quote(name)

    def _body(self, cost, timeout):
        body = {"timeout_ms": _timeout_ms(self.timeout if timeout is None else timeout)}
        cost = self.cost if cost is None else cost
        if cost is not None:
            body["cost"] = dict(cost)
        return body

    async def enter(self, cost=None, timeout=None):
        """Wait for the caller's turn; return its Grant."""
        return Grant(await self._server.acall("POST", self._path + "/enter", self._body(cost, timeout)))

    def enter_sync(self, cost=None, timeout=None):
        """enter, blocking the thread."""
        return Grant(self._server.call("POST", self._path + "/enter", self._body(cost, timeout)))

    async def reserve(self, cost=None, timeout=None):
        """Wait like enter for an estimated cost; return a Reservation to
        settle with the true cost once known (an LLM call's tokens)."""
        doc = await self._server.acall("POST", self._path + "/reserve", self._body(cost, timeout))
        return Reservation(self, doc)

    def reserve_sync(self, cost=None, timeout=None):
        """reserve, blocking the thread."""
        return Reservation(self, self._server.call("POST", self._path + "/reserve", self._body(cost, timeout)))

    async def estimate(self, cost=None):
        """How long a caller of cost would wait if it entered now; takes nothing."""
        return Estimate(await self._server.acall("POST", self._path + "/estimate", self._body(cost, None)))

    def estimate_sync(self, cost=None):
        """estimate, blocking the thread."""
        return Estimate(self._server.call("POST", self._path + "/estimate", self._body(cost, None)))

    async def inspect(self):
        """The bucket as every process sees it (as `sluice inspect --json`)."""
        return await self._server.acall("GET", self._path)

    def inspect_sync(self):
        """inspect, blocking the thread."""
        return self._server.call("GET", self._path)

    async def __aenter__(self):
        return await self.enter()

    async def __aexit__(self, *exc):
        return False

    def __enter__(self):
        return self.enter_sync()

    def __exit__(self, *exc):
        return False


class Reservation:
    """A grant whose true cost is known only once the work is done: settle
    it with that cost (the rest goes back to the bucket at once), or cancel
    it when the work never reached the upstream. It settles once; one never
    settled stays counted at its estimate."""

    def __init__(self, bucket, doc):
        self._bucket = bucket
        self.id = doc["reservation"]
        self.grant = Grant(doc)

    async def settle(self, cost):
        """Charge the true cost; a unit cost does not name is charged at the estimate."""
        await self._bucket._server.acall("POST", self._bucket._path + "/settle", {"reservation": self.id, "cost": dict(cost)})

    def settle_sync(self, cost):
        """settle, blocking the thread."""
        self._bucket._server.call("POST", self._bucket._path + "/settle", {"reservation": self.id, "cost": dict(cost)})

    async def cancel(self):
        """Give the whole estimate back."""
        await self._bucket._server.acall("POST", self._bucket._path + "/cancel", {"reservation": self.id})

    def cancel_sync(self):
        """cancel, blocking the thread."""
        self._bucket._server.call("POST", self._bucket._path + "/cancel", {"reservation": self.id})


class Permit:
    """A place in a Semaphore, held while it is renewed: acquire renews it
    in the background (a task, or a thread in sync code) every third of its
    lease, until release. ``lost`` is set when a renew found it gone."""

    def __init__(self, semaphore, doc):
        self._sem = semaphore
        self.id = doc["permit"]
        self.lease = doc["lease_ms"] / 1000.0
        self.waited = doc.get("waited_ms", 0) / 1000.0
        self.lost = False
        self._task = None
        self._thread = None
        self._stop = threading.Event()

    def _renew_body(self):
        return {"permit": self.id}

    async def _heartbeat(self):
        while True:
            await asyncio.sleep(self.lease / 3)
            try:
                await self._sem._server.acall("POST", self._sem._path + "/renew", self._renew_body())
            except (LeaseLost, ConfigError):
                self.lost = True
                return
            except (Error, OSError):
                pass  # the next renew may pass; the lease has two more thirds

    def _heartbeat_sync(self):
        while not self._stop.wait(self.lease / 3):
            try:
                self._sem._server.call("POST", self._sem._path + "/renew", self._renew_body())
            except (LeaseLost, ConfigError):
                self.lost = True
                return
            except (Error, OSError):
                pass

    async def release(self):
        """Give the place back, and stop renewing it."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self.lost:
            raise LeaseLost("sluice: permit %s of semaphore %r: lease lost before release" % (self.id, self._sem.name), 410, "lease_lost")
        await self._sem._server.acall("POST", self._sem._path + "/release", self._renew_body())

    def release_sync(self):
        """release, blocking the thread."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self.lost:
            raise LeaseLost("sluice: permit %s of semaphore %r: lease lost before release" % (self.id, self._sem.name), 410, "lease_lost")
        self._sem._server.call("POST", self._sem._path + "/release", self._renew_body())


class Semaphore:
    """A shared semaphore, served by ``sluice serve``: at most its capacity
    (the server's --config, or Redis) of weight held at once, fleet-wide,
    waiters served in arrival order.

    ``async with sem:`` and ``with sem:`` acquire a permit of ``weight``
    and release it at the end of the block. A Semaphore is safe to share
    between tasks and threads; each block holds its own permit.
    """

    def __init__(self, name, weight=1, timeout=None, url=None, token=None):
        self.name = name
        self.weight = weight
        self.timeout = timeout
        self._server = _Server(url, token)
        self._path = "/v1/semaphores/" + _quote(name)
        self._held = {}  # by task or thread, the permits of its open blocks
        self._lock = threading.Lock()

    def _body(self, weight, timeout):
        return {
            "weight": self.weight if weight is None else weight,
            "timeout_ms": _timeout_ms(self.timeout if timeout is None else timeout),
        }

    async def acquire(self, weight=None, timeout=None):
        """Wait for a permit; return it, renewed until its release."""
        p = Permit(self, await self._server.acall("POST", self._path + "/acquire", self._body(weight, timeout)))
        p._task = asyncio.ensure_future(p._heartbeat())
        return p

    def acquire_sync(self, weight=None, timeout=None):
        """acquire, blocking the thread; a thread renews the permit."""
        p = Permit(self, self._server.call("POST", self._path + "/acquire", self._body(weight, timeout)))
        p._thread = threading.Thread(target=p._heartbeat_sync, name="sluice-renew-" + p.id[:8], daemon=True)
        p._thread.start()
        return p

    async def inspect(self):
        """The semaphore as every process sees it: capacity, held, queued."""
        return await self._server.acall("GET", self._path)

    def inspect_sync(self):
        """inspect, blocking the thread."""
        return self._server.call("GET", self._path)

    def _push(self, key, p):
        with self._lock:
            self._held.setdefault(key, []).append(p)

    def _pop(self, key):
        with self._lock:
            stack = self._held[key]
            p = stack.pop()
            if not stack:
                del self._held[key]
            return p

    async def __aenter__(self):
        p = await self.acquire()
        self._push(asyncio.current_task(), p)
        return p

    async def __aexit__(self, *exc):
        await self._pop(asyncio.current_task()).release()
        return False

    def __enter__(self):
        p = self.acquire_sync()
        self._push(threading.get_ident(), p)
        return p

    def __exit__(self, *exc):
        self._pop(threading.get_ident()).release_sync()
        return False
