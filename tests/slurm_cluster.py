"""A real one-node SLURM cluster for the tests (Debian's slurm-wlm + munge), started in a
temporary directory and stopped by its pid files.

Everything lives under one state directory: munge's socket and key, slurm.conf, the spool,
the controller's state, the logs. Every client (``sbatch``, submitit, the jobs) finds the
cluster through ``SLURM_CONF``, so nothing outside the directory is touched and a cluster of
the machine (if any) is not disturbed: private ports, its own munge socket.

    with SlurmCluster(tmp_path / "slurm") as cluster:
        subprocess.run(["sbatch", ...], env=cluster.env)

:func:`available` says why a cluster cannot be started here (not root, packages missing), so
tests can skip with that reason. Install: ``apt-get install slurm-wlm slurmctld slurmd
slurm-client munge`` (the README's test section; ``.ci/run`` does it).
"""
from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

BINARIES = ("munged", "munge", "slurmctld", "slurmd", "sbatch", "sinfo", "squeue", "scancel", "scontrol")
#: accounting (sacct), which submitit needs to learn that a job ended without a result
ACCOUNTING = ("slurmdbd", "sacctmgr", "sacct", "mariadbd", "mariadb-install-db", "mariadb")


def available(accounting: bool = False) -> str | None:
    """None if a cluster can be started here, else the reason."""
    if os.geteuid() != 0:
        return "starting slurmctld/slurmd needs root"
    missing = [b for b in BINARIES if shutil.which(b) is None and not Path(f"/usr/sbin/{b}").exists()]
    if missing:
        return f"SLURM not installed ({', '.join(missing)} missing): apt-get install slurm-wlm slurmctld slurmd " \
               "slurm-client munge"
    missing = [b for b in ACCOUNTING if accounting and shutil.which(b) is None and not Path(f"/usr/sbin/{b}").exists()]
    if missing:
        return f"SLURM accounting not installed ({', '.join(missing)} missing): apt-get install slurmdbd mariadb-server"
    if not Path("/etc/munge/munge.key").is_file():
        return "/etc/munge/munge.key missing (the munge package creates it)"
    return None


def _free_port() -> int:
    for _ in range(50):
        port = random.randint(20000, 60000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port")


def _node_line() -> str:
    """This machine as slurmd sees it (``slurmd -C``), memory rounded down."""
    out = subprocess.run([_bin("slurmd"), "-C"], capture_output=True, text=True, check=True).stdout
    line = out.splitlines()[0]
    fields = dict(f.split("=", 1) for f in line.split())
    fields["RealMemory"] = str(int(int(fields.get("RealMemory", "2000")) * 0.8))
    return " ".join(f"{k}={v}" for k, v in fields.items())


def _bin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster:
    def __init__(self, root: Path, accounting: bool = False, nodes: int = 1):
        self.root = Path(root)
        self.accounting = accounting
        self.nodes = nodes  # > 1: that many slurmd on this machine (one CPU each), e.g. for DDP over nodes
        self.host = socket.gethostname()
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # ---- start / stop -----------------------------------------------------------------
    def __enter__(self) -> "SlurmCluster":
        try:
            return self._start()
        except BaseException:
            self.__exit__(None, None, None)  # whatever did start is stopped
            raise

    def _start(self) -> "SlurmCluster":
        r = self.root
        for sub in ("munge", "state", "spool", "log"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        shutil.copy("/etc/munge/munge.key", r / "munge" / "munge.key")
        subprocess.run(["chown", "-R", "munge:munge", str(r / "munge")], check=True)
        os.chmod(r / "munge", 0o755)
        os.chmod(r / "munge" / "munge.key", 0o400)
        os.chmod(r, 0o755)
        sock = r / "munge" / "munge.socket.2"
        subprocess.run(["runuser", "-u", "munge", "--", _bin("munged"), f"--socket={sock}",
                        f"--key-file={r / 'munge' / 'munge.key'}", f"--log-file={r / 'munge' / 'munged.log'}",
                        f"--pid-file={r / 'munge' / 'munged.pid'}", f"--seed-file={r / 'munge' / 'munged.seed'}"],
                       check=True)
        node = _node_line()
        names = [self.host]
        if self.nodes > 1:  # several slurmd daemons on this host, each its own node with its own port
            # node names do not resolve: jobs that need the main node's address set MASTER_ADDR=127.0.0.1
            names = [f"nas{i}" for i in range(self.nodes)]
            mem = int(int(dict(f.split("=", 1) for f in node.split())["RealMemory"]) / self.nodes)
            node = "\n".join(f"NodeName={n} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={_free_port()} CPUs=1 "
                             f"RealMemory={mem}" for n in names)
        acct = self._start_accounting(sock) if self.accounting else ["JobAcctGatherType=jobacct_gather/none"]
        self.conf.write_text("\n".join([
            "ClusterName=nastest", f"SlurmctldHost={self.host}",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={sock}",
            "SlurmUser=root", "SlurmdUser=root",
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
            f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool' / '%n'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}", f"SlurmdPidFile={r / 'slurmd.%n.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={r / 'log' / 'slurmd.%n.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core", "MpiDefault=none", "SwitchType=switch/none", "ReturnToService=2",
            "SchedulerType=sched/backfill", "KillWait=5", "SchedulerParameters=sched_interval=1",
            "MessageTimeout=30", *acct,
            node, f"PartitionName=debug Nodes={','.join(names)} Default=YES MaxTime=INFINITE State=UP", ""]))
        subprocess.run([_bin("slurmctld"), "-f", str(self.conf)], check=True, env=self.env)
        if self.accounting:
            subprocess.run(["sacctmgr", "-i", "add", "cluster", "nastest"], capture_output=True, env=self.env)
        for name in names:
            (r / "spool" / name).mkdir(parents=True, exist_ok=True)
            extra = ["-N", name] if self.nodes > 1 else []
            subprocess.run([_bin("slurmd"), "-f", str(self.conf), *extra], check=True, env=self.env)
        self.node_names = names
        deadline = time.time() + 60
        while time.time() < deadline:
            out = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, env=self.env).stdout
            states = out.split()
            if len(states) == len(names) and all(s in ("idle", "mix", "alloc") for s in states):
                return self
            time.sleep(0.5)
        raise RuntimeError(f"the test cluster did not come up: {self.log()}")

    def _start_accounting(self, sock: Path) -> list[str]:
        """MariaDB and slurmdbd under the state directory; the slurm.conf lines that use them."""
        r = self.root
        data = r / "mysql-data"
        (r / "mysql").mkdir(exist_ok=True)
        subprocess.run(["chown", "-R", "mysql:mysql", str(r / "mysql")], check=True)
        subprocess.run([_bin("mariadb-install-db"), "--user=mysql", f"--datadir={data}", "--auth-root-authentication-method=socket",
                        "--skip-test-db"], check=True, capture_output=True)
        db_port, dbd_port = _free_port(), _free_port()
        db_sock = r / "mysql" / "mysqld.sock"
        subprocess.Popen([_bin("mariadbd"), "--user=mysql", f"--datadir={data}", f"--socket={db_sock}",
                          f"--pid-file={r / 'mysql' / 'mysqld.pid'}", "--bind-address=127.0.0.1", f"--port={db_port}",
                          f"--log-error={r / 'log' / 'mariadb.log'}"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 60
        sql = ("CREATE DATABASE IF NOT EXISTS slurm_acct_db; CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY "
               "'nastest'; CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'nastest'; GRANT ALL ON "
               "slurm_acct_db.* TO 'slurm'@'localhost'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';")
        while True:
            got = subprocess.run([_bin("mariadb"), f"--socket={db_sock}", "-u", "root", "-e", sql], capture_output=True)
            if got.returncode == 0:
                break
            if time.time() > deadline:
                raise RuntimeError(f"MariaDB did not start: {got.stderr.decode()[-300:]}")
            time.sleep(0.5)
        dbd = self.conf.parent / "slurmdbd.conf"  # slurmdbd reads it next to SLURM_CONF
        dbd.write_text("\n".join([
            "AuthType=auth/munge", f"AuthInfo=socket={sock}", "DbdAddr=127.0.0.1", "DbdHost=localhost",
            f"DbdPort={dbd_port}", "SlurmUser=root", "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1",
            f"StoragePort={db_port}", "StorageUser=slurm", "StoragePass=nastest", "StorageLoc=slurm_acct_db",
            f"PidFile={r / 'slurmdbd.pid'}", f"LogFile={r / 'log' / 'slurmdbd.log'}", ""]))
        os.chmod(dbd, 0o600)
        subprocess.run([_bin("slurmdbd")], check=True, env=self.env)
        deadline = time.time() + 60
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", dbd_port)) == 0:
                    break
            time.sleep(0.3)
        return ["JobAcctGatherType=jobacct_gather/linux", "AccountingStorageType=accounting_storage/slurmdbd",
                "AccountingStorageHost=localhost", f"AccountingStoragePort={dbd_port}", f"AccountingStoragePass={sock}"]

    def __exit__(self, *exc) -> None:
        for pid_file in (*sorted(self.root.glob("slurmd.*.pid")), self.root / "slurmctld.pid", self.root / "slurmdbd.pid",
                         self.root / "mysql" / "mysqld.pid", self.root / "munge" / "munged.pid"):
            try:
                os.kill(int(pid_file.read_text().split()[0]), 15)
            except (OSError, ValueError):
                pass
        time.sleep(0.5)

    # ---- helpers ----------------------------------------------------------------------
    def log(self) -> str:
        parts = []
        for p in [self.root / "log" / "slurmctld.log", *sorted((self.root / "log").glob("slurmd.*.log"))]:
            name = p.name
            if p.is_file():
                parts.append(f"--- {name}\n" + "\n".join(p.read_text().splitlines()[-15:]))
        return "\n".join(parts)

    def jobs(self) -> list[str]:
        out = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True, env=self.env).stdout
        return [line for line in out.splitlines() if line.strip()]
