"""A private PostgreSQL cluster for the restart fault: initdb + pg_ctl in a temporary directory, on a
free port, never the machine's shared server. PostgreSQL refuses to run as root, so when the tests run
as root the server commands run as the ``postgres`` OS user (runuser).

    cluster = PrivateCluster.create()      # initdb + start (a few seconds)
    cluster.restart(mode="immediate")      # a crash and WAL recovery ("fast": a clean shutdown)
    cluster.destroy()                      # stop + remove the directory
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass

BIN_DIRS = ("/usr/local/bin", "/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/17/bin")
SERVER_USER = os.environ.get("WEFT_CHAOS_PG_OS_USER", "postgres")


def find_binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for directory in BIN_DIRS:
        candidate = os.path.join(directory, name)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def unavailable_reason() -> str | None:
    """Why a private cluster cannot be started here (None when it can)."""
    for name in ("initdb", "pg_ctl"):
        if find_binary(name) is None:
            return f"{name} not found on PATH or in {BIN_DIRS} (apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return f"running as root and there is no {SERVER_USER!r} OS user to run the private server as"
        if shutil.which("runuser") is None:
            return "running as root and runuser is missing (util-linux)"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class PrivateCluster:
    directory: str
    port: int
    user: str = "postgres"  # the database superuser (trust auth on 127.0.0.1)
    restarts: int = 0
    options: str = ""  # the server's -o options (port, socket directory, settings)

    @property
    def data(self) -> str:
        return os.path.join(self.directory, "data")

    @property
    def log(self) -> str:
        return os.path.join(self.directory, "server.log")

    @classmethod
    def create(cls, max_connections: int = 300) -> PrivateCluster:
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(f"cannot start a private PostgreSQL cluster: {reason}")
        directory = tempfile.mkdtemp(prefix="weft-chaos-pg-")
        if os.geteuid() == 0:
            record = pwd.getpwnam(SERVER_USER)
            os.chown(directory, record.pw_uid, record.pw_gid)
        os.chmod(directory, 0o700)
        cluster = cls(directory, free_port())
        cluster._run(
            find_binary("initdb") or "initdb",
            "-D",
            cluster.data,
            "-U",
            cluster.user,
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        )
        options = [
            f"-p {cluster.port}",
            "-c listen_addresses=127.0.0.1",
            f"-k {cluster.directory}",  # its own socket directory, never /var/run/postgresql
            f"-c max_connections={max_connections}",
            "-c fsync=off",  # a crash of the server process (immediate stop) still recovers from WAL
            "-c synchronous_commit=off",
            "-c full_page_writes=off",
        ]
        cluster.options = " ".join(options)
        cluster.start()
        return cluster

    def _command(self, *args: str) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", SERVER_USER, "--", *args]
        return list(args)

    def _run(self, *args: str, timeout: float = 120.0) -> str:
        result = subprocess.run(self._command(*args), capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip() or result.stdout.strip()}"
                f"\n(server log: {self.log})"
            )
        return result.stdout

    def pg_ctl(self, *args: str) -> str:
        return self._run(find_binary("pg_ctl") or "pg_ctl", "-D", self.data, *args)

    def start(self) -> None:
        self.pg_ctl("-o", self.options, "-l", self.log, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self.pg_ctl("-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str = "fast", down_for: float = 0.0) -> None:
        """Stop (``fast``: clean shutdown; ``immediate``: the server dies and recovers from WAL on start)
        and start again, optionally staying down a while."""
        self.stop(mode)
        time.sleep(down_for)
        self.start()
        self.restarts += 1

    def running(self) -> bool:
        result = subprocess.run(
            self._command(find_binary("pg_ctl") or "pg_ctl", "-D", self.data, "status"),
            capture_output=True,
            check=False,
        )
        return result.returncode == 0

    def destroy(self) -> None:
        try:
            if self.running():
                self.stop("immediate")
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)
