"""Tests of the Python client against a real `sluice serve` and a real
redis-server, both started here on free loopback ports.

SLUICE_BIN names the sluice binary (scripts/test builds it); without it,
the tests build it with `go build` into a temporary directory.
"""

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import sluice  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
TOKEN = "python-tests"

_procs = []
_tmp = None
URL = None


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(what, cond, within=10.0):
    """Poll cond until it holds; fail after within seconds."""
    deadline = time.monotonic() + within
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("gave up after %.0f s waiting for %s" % (within, what))
        time.sleep(0.01)


def setUpModule():
    global _tmp, URL
    _tmp = tempfile.mkdtemp(prefix="sluice-python-")
    redis = shutil.which("redis-server")
    if redis is None:
        raise unittest.SkipTest("redis-server is not on PATH")
    port = _free_port()
    rp = subprocess.Popen(
        [redis, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _procs.append(rp)

    def redis_up():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            return False

    _wait_for("redis-server to listen", redis_up)

    binary = os.environ.get("SLUICE_BIN")
    if not binary:
        binary = os.path.join(_tmp, "sluice")
        subprocess.check_call(["go", "build", "-o", binary, "./cmd/sluice"], cwd=REPO)
    config = os.path.join(_tmp, "sluice.json")
    with open(config, "w") as f:
        json.dump(
            {
                "buckets": {
                    "burst": {"policies": ["rate=1/1h,burst=3"]},
                    "fast": {"policies": ["rate=200/1s,burst=5", "unit=pu,capacity=600,refill_amount=60,refill_frequency=100ms"]},
                    "slow": {"policies": ["rate=1/1h,burst=1"]},
                    "llm": {"policies": ["unit=tokens,capacity=1000,refill_amount=1,refill_frequency=1h"]},
                },
                "semaphores": {"pool": {"capacity": 2}, "one": {"capacity": 1}},
            },
            f,
        )
    token_file = os.path.join(_tmp, "token")
    with open(token_file, "w") as f:
        f.write(TOKEN + "\n")
    sp = subprocess.Popen(
        [binary, "serve", "--redis", "redis://127.0.0.1:%d" % port, "--listen", "127.0.0.1:0",
         "--config", config, "--token-file", token_file, "--lease", "300ms"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _procs.append(sp)
    line = sp.stdout.readline()
    if "listening on " not in line:
        raise RuntimeError("sluice serve did not start: %r %s" % (line, sp.stderr.read()))
    URL = line.split("listening on ", 1)[1].split(" ", 1)[0]
    os.environ["SLUICE_URL"] = URL
    os.environ["SLUICE_TOKEN"] = TOKEN


def tearDownModule():
    for p in reversed(_procs):
        p.terminate()
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        for f in (p.stdout, p.stderr):
            if f is not None:
                f.close()
    if _tmp:
        shutil.rmtree(_tmp, ignore_errors=True)


def run(coro):
    return asyncio.run(coro)


class BucketTest(unittest.TestCase):
    def test_async_enter_and_wait_too_long(self):
        async def main():
            b = sluice.Bucket("burst")
            for _ in range(3):
                async with b as g:
                    self.assertLess(g.waited, 1.0)
            with self.assertRaises(sluice.WaitTooLong) as cm:
                await b.enter(timeout=0.5)
            e = cm.exception
            self.assertEqual(e.status, 429)
            self.assertGreater(e.retry_after, 3000)  # the next token is an hour away
            self.assertIn("not granted within timeout_ms", str(e))
            est = await b.estimate()
            self.assertGreater(est.wait, 3000)

        run(main())

    def test_sync_enter_with_cost(self):
        b = sluice.Bucket("fast", cost={"": 1, "pu": 60})
        start = time.monotonic()
        for _ in range(15):  # 900 pu at 600 a second after a burst of 600
            with b:
                pass
        self.assertGreater(time.monotonic() - start, 0.3)
        doc = b.inspect_sync()
        self.assertEqual(doc["bucket"], "fast")
        self.assertEqual([p["unit"] for p in doc["policies"]], ["", "pu"])

    def test_config_errors(self):
        with self.assertRaises(sluice.ConfigError) as cm:
            sluice.Bucket("fast", cost={"tokens": 1}).enter_sync()
        self.assertIn('"tokens"', str(cm.exception))
        with self.assertRaises(sluice.ConfigError) as cm:
            sluice.Bucket("fast", cost={"pu": 601}).enter_sync()
        self.assertIn("exceeds capacity", str(cm.exception))
        with self.assertRaises(sluice.ConfigError) as cm:
            sluice.Bucket("nobody-stored-this").enter_sync()
        self.assertEqual(cm.exception.status, 404)
        self.assertIn("unknown", str(cm.exception))
        with self.assertRaises(ValueError):
            sluice.Bucket("fast").enter_sync(timeout=-1)

    def test_bad_token(self):
        with self.assertRaises(sluice.Unauthorized) as cm:
            sluice.Bucket("fast", token="wrong").enter_sync()
        self.assertIn("bearer token", str(cm.exception))

    def test_cancel_gives_place_back(self):
        async def main():
            b = sluice.Bucket("slow")
            try:
                await b.enter(timeout=0.05)  # takes the hour's token, if still there
            except sluice.WaitTooLong:
                pass
            task = asyncio.ensure_future(b.enter())
            for _ in range(500):
                if (await b.inspect())["queued"] == 1:
                    break
                await asyncio.sleep(0.01)
            self.assertEqual((await b.inspect())["queued"], 1, "the caller never queued")
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task
            for _ in range(500):
                if (await b.inspect())["queued"] == 0:
                    break
                await asyncio.sleep(0.01)
            self.assertEqual((await b.inspect())["queued"], 0, "the cancelled caller kept its place")

        run(main())

    def test_reserve_settle_cancel(self):
        async def main():
            b = sluice.Bucket("llm")

            def tokens(doc):
                return doc["policies"][0]["tokens"]

            await (await b.reserve({"tokens": 1})).cancel()  # stores the policies
            before = tokens(await b.inspect())
            r = await b.reserve({"tokens": 300})
            self.assertEqual(tokens(await b.inspect()), before - 300)
            await r.settle({"tokens": 100})
            self.assertEqual(tokens(await b.inspect()), before - 100)
            with self.assertRaises(sluice.ConfigError):
                await r.settle({"tokens": 1})  # settles once
            r = b.reserve_sync({"tokens": 50})
            r.cancel_sync()
            self.assertEqual(tokens(b.inspect_sync()), before - 100)

        run(main())


class SemaphoreTest(unittest.TestCase):
    def test_async_bound_and_heartbeat(self):
        async def main():
            sem = sluice.Semaphore("pool")
            inside = 0
            most = 0

            async def worker():
                nonlocal inside, most
                async with sem:
                    inside += 1
                    most = max(most, inside)
                    # Held past the lease (300 ms): the heartbeats keep it.
                    await asyncio.sleep(0.5)
                    doc = await sem.inspect()
                    self.assertLessEqual(doc["held"], 2)
                    inside -= 1

            await asyncio.gather(*(worker() for _ in range(4)))
            self.assertEqual(most, 2)
            self.assertEqual((await sem.inspect())["held"], 0)

        run(main())

    def test_sync_and_lease(self):
        sem = sluice.Semaphore("one")
        with sem as p:
            time.sleep(0.5)  # past the 300 ms lease: the renew thread keeps it
            self.assertFalse(p.lost)
            self.assertEqual(sem.inspect_sync()["held"], 1)
            with self.assertRaises(sluice.WaitTooLong):
                sem.acquire_sync(timeout=0.05)
        self.assertEqual(sem.inspect_sync()["held"], 0)
        self.assertEqual([t for t in threading.enumerate() if t.name.startswith("sluice-renew")], [])

        # A permit nobody renews is released by the server within its lease.
        p = sluice.Semaphore("one").acquire_sync()
        p._stop.set()
        p._thread.join()
        _wait_for("the unrenewed permit to be released", lambda: sem.inspect_sync()["held"] == 0, 5)
        with self.assertRaises(sluice.ConfigError):  # not found: the server let it go
            p._sem._server.call("POST", p._sem._path + "/renew", {"permit": p.id})


if __name__ == "__main__":
    unittest.main()
