"""What each side may load: the SDK no server code (a client's install needs none of it, and
a change to the server cannot break an application through an import), the shard package
not the gateway (a node's replica knows nothing of the public doors)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import sqsq
from importwalk import imported_modules

# Everything under sqsq that is the server's; the SDK may load only sqsq.client and what
# both sides share (sqsq.errors, sqsq.wire, sqsq.frozen, sqsq.v1).
SERVER = ("sqsq.core", "sqsq.raft", "sqsq.sim", "sqsq.shard", "sqsq.control", "sqsq.gateway",
          "sqsq.cli", "sqsq.analytics", "sqsq.api", "sqsq.prompt", "sqsq.listen",
          "sqsq.admincred")


def server_modules_loaded(imports: str) -> list[str]:
    """The server's modules a fresh interpreter holds after ``import <imports>``."""
    code = (f"import sys, {imports}\n"
            "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('sqsq'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.split()
    assert "sqsq" in loaded
    return [m for m in loaded if any(m == s or m.startswith(s + ".") for s in SERVER)]


def test_the_sdk_loads_no_server_code() -> None:
    assert server_modules_loaded("sqsq.client, sqsq.client.aio, sqsq.client.sync") == []


def test_the_check_sees_server_code_loaded() -> None:
    assert "sqsq.core.commands" in server_modules_loaded("sqsq.client, sqsq.api")


def test_the_shard_package_never_imports_the_gateway() -> None:
    shard = Path(sqsq.__file__).parent / "shard"
    offenders = {p.name: sorted(m for m in imported_modules(p)
                                if m == "sqsq.gateway" or m.startswith("sqsq.gateway."))
                 for p in sorted(shard.glob("*.py"))}
    assert {name: mods for name, mods in offenders.items() if mods} == {}
