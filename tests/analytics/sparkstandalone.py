"""A Spark standalone cluster for tests: a master and workers started from the installed
PySpark (its ``bin/spark-class``; the wheel has no ``start-master.sh``), each a JVM of its
own on 127.0.0.1, stopped by pid. No Java is a failure, never a skip.

    with SparkStandalone(tmp_path, workers=2) as spark:
        spark.master_url            # spark://127.0.0.1:<port>, both workers registered
        spark.env()                 # what a driver process needs to use it

A driver is an ordinary ``python`` process given ``--master spark.master_url`` and
``spark.driver_env()``. Each worker has two cores and an application takes one executor of
one core on each worker, so two applications run side by side, each with its tasks in two
executor JVMs besides its driver.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from sqsq.cli.localprocs import free_port, wait_for_port

JAVA_MISSING = "Java is required for the Spark standalone tests (install a JDK 17)"
WORKER_CORES = 2
WORKER_MEMORY = "2g"  # two executors of spark.executor.memory's default 1g
# Short jobs on small data: the quick JIT tier and a plain GC start much faster (the local
# session of common.build_session does the same for its driver).
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_home() -> Path:
    import pyspark

    home = Path(pyspark.__file__).parent
    if not (home / "bin" / "spark-class").exists():
        raise OSError(f"{home} has no bin/spark-class: not a full PySpark install")
    return home


class SparkStandalone:
    def __init__(self, root: Path, workers: int = 2, cores: int = WORKER_CORES) -> None:
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            raise OSError(JAVA_MISSING)
        self.root = root
        self.home = spark_home()
        self.port = free_port()
        self.webui_port = free_port()
        self.workers = workers
        self.cores = cores
        self.worker_dirs = [root / f"worker{i}" for i in range(workers)]
        self.procs: list[subprocess.Popen] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The environment of the daemons, and of a driver that uses them: everything on
        127.0.0.1, executors running this interpreter."""
        return {**os.environ, "SPARK_HOME": str(self.home), "SPARK_LOCAL_IP": "127.0.0.1",
                "SPARK_LOG_DIR": str(self.root / "logs"), "SPARK_NO_DAEMONIZE": "1",
                "SPARK_DAEMON_JAVA_OPTS": QUICK_JVM, "SPARK_DAEMON_MEMORY": "256m",
                # no REST submission server (on by default since Spark 4.1): it takes the
                # fixed port 6066 and runs whatever is posted to it, unauthenticated
                "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
                "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}

    def driver_env(self) -> dict[str, str]:
        """``env()`` plus what a driver started by ``python`` hands its JVM: one executor of
        one core per worker, and the quick JIT in the driver and executors."""
        conf = {"spark.cores.max": str(self.workers), "spark.executor.cores": "1",
                # every executor is on this host: never wait for a "more local" one
                "spark.locality.wait": "0",
                "spark.driver.extraJavaOptions": QUICK_JVM,
                "spark.executor.extraJavaOptions": QUICK_JVM}
        args = " ".join(f'--conf "{k}={v}"' for k, v in conf.items())
        return {**self.env(), "PYSPARK_SUBMIT_ARGS": f"{args} pyspark-shell"}

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        log = open(self.root / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - the child's
        try:
            # spark-class execs the JVM: the pid is the daemon's own
            proc = subprocess.Popen([str(self.home / "bin" / "spark-class"), *args],
                                    stdout=log, stderr=subprocess.STDOUT, env=self.env(),
                                    start_new_session=True)
        finally:
            log.close()
        self.procs.append(proc)
        return proc

    def start(self, timeout_s: float = 60.0) -> SparkStandalone:
        try:
            master = self._spawn("master", [
                "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                "--port", str(self.port), "--webui-port", str(self.webui_port)])
            wait_for_port(self.webui_port, master, timeout_s)
            for i, work_dir in enumerate(self.worker_dirs):
                work_dir.mkdir(parents=True, exist_ok=True)
                self._spawn(f"worker{i}", [
                    "org.apache.spark.deploy.worker.Worker", self.master_url,
                    "--host", "127.0.0.1", "--webui-port", str(free_port()),
                    "--cores", str(self.cores), "--memory", WORKER_MEMORY,
                    "--work-dir", str(work_dir)])
            self.wait_workers(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def state(self) -> dict:
        """The master's own view (its web UI's JSON): workers, applications."""
        url = f"http://127.0.0.1:{self.webui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - our own master
            return json.load(resp)

    def wait_workers(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise OSError(f"a Spark daemon (pid {proc.pid}) exited with "
                                  f"{proc.returncode}; logs in {self.root / 'logs'}")
            try:
                alive = [w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]
            except (OSError, ValueError):
                # ValueError: a master just up may answer /json/ with its HTML page at first.
                alive = []
            if len(alive) == self.workers:
                return
            if time.monotonic() > deadline:
                raise OSError(f"{len(alive)} of {self.workers} Spark workers registered within "
                              f"{timeout_s}s; logs in {self.root / 'logs'}")
            time.sleep(0.2)

    def stop(self) -> None:
        """The workers first, all at once (each ends its executors), then the master; by
        pid."""
        master, workers = self.procs[:1], self.procs[1:]
        for group in (workers, master):
            for proc in group:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in group:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()

    def __enter__(self) -> SparkStandalone:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
