"""Test helper: a private redis-server on a free loopback port (no persistence), started by
the test itself and stopped afterwards.  Without the binary a test skips -- or fails when
the environment variable CI is set, so CI can never silently skip the Redis tests."""
import contextlib
import os

import pytest

from hybridkv.disk.redis_backend import RedisServer

INSTALL = "apt-get install -y redis-server"


def require_redis_server():
    if RedisServer.available():
        return
    msg = f"redis-server not found on PATH (install: {INSTALL})"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


@contextlib.contextmanager
def redis_server():
    """Yields a started RedisServer (``.port``, ``.backend(prefix)``, ``.kill()``)."""
    require_redis_server()
    srv = RedisServer().start()
    try:
        yield srv
    finally:
        srv.stop()
