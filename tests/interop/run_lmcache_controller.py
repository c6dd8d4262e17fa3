#!/usr/bin/env python3
"""Run the REAL LMCache 0.5.6 controller (``python -m lmcache.v1.api_server``)
CPU-only, without torch, by installing the torch stub first.

All CLI arguments are passed through unchanged, e.g.::

    .venv/bin/python tests/interop/run_lmcache_controller.py \
        --host 127.0.0.1 --port 18000 \
        --monitor-ports '{"pull": 18300, "reply": 18400, "heartbeat": 18082}'

Use ``--host 127.0.0.1`` so the ZMQ sockets bind loopback only and the
``heartbeat_url`` handed to workers is ``127.0.0.1:<port>`` (a specific bind
host is returned unchanged by the controller).
"""

from __future__ import annotations

import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import stub_torch  # noqa: E402


def main() -> None:
    stub_torch.prepare_lmcache()
    sys.argv = ["lmcache.v1.api_server", *sys.argv[1:]]
    runpy.run_module("lmcache.v1.api_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
