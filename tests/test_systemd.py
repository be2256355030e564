"""taogpud under a real systemd 252, booted as PID 1 of a throwaway container.

The container is systemd-nspawn on the host's own tree (`--volatile=yes`: a tmpfs root,
/usr and dpkg's database as copy-on-write overlays so dpkg can install into them, and
nothing else of the host's: never its /var/lib/taogpud, /run/taogpud or /etc/taogpud, where a
run by hand may have left root's files). The daemon is
installed there from the .deb that packaging/build.py makes, as a user would install it,
with the CPU pair in /etc/taogpud and the API key in /etc/credstore; one container serves
the whole file. Tests talk to the socket from the host through /proc/<PID 1>/root and
run systemctl/journalctl inside with nsenter (the host has no bus to the container).
Each nspawn option says why it is there where it is set (HOST_TREE, _boot).

TestMinimalDebianJourney boots a second, smaller tree first: a debootstrap minbase Debian 12
(made once per test session from the Debian archive apt uses here; about 1.5 min), where the
README's own steps run as an operator and two users would run them.

Needs root and systemd-nspawn (`apt-get install systemd-container`), and debootstrap for the
journey; skipped otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from taogpud.client import Client

REPO = Path(__file__).resolve().parent.parent
SECRET = "tt-sk-credential-8c1f0e2d9b7a"  # the API key the credential holds
BOOT_TIMEOUT_S = 60.0
OVERLAY_TEMP = Path("/var/tmp/nspawn-temp-*")  # where nspawn puts --overlay=LOWER::TARGET uppers
# The security exposure of taogpud.service, checked offline. The unit scores 1.7: every
# sandbox setting a GPU daemon can keep is on, and each exception (devices, network for
# the API channel, /proc/driver, W^X for the NVIDIA driver, uids for SO_PEERCRED, the
# callers' processes in /proc for programs' leases) costs
# 0.1-0.3. 2.0 leaves room for one more justified exception and fails a change that
# drops a whole group (ProtectSystem=, the syscall filter, the capability bounding set).
EXPOSURE_THRESHOLD = 2.0
# The module's watchdog: short, so a wedged daemon is seen killed within seconds, and
# restarted at once (RestartSec is a pause before the restart, not a margin for anything).
TEST_DROPIN = """\
[Service]
WatchdogSec=4
TimeoutAbortSec=2
RestartSec=100ms
"""

pytestmark = [
    pytest.mark.systemd,
    pytest.mark.slow,  # a booted container per class
    pytest.mark.xdist_group("systemd"),  # one container: every test of this file on one worker
    pytest.mark.timeout(240),
]


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (systemd-nspawn boots a container)"
    for tool in ("systemd-nspawn", "nsenter", "dpkg-deb", "systemd-analyze"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (apt-get install systemd-container)"
    if not Path("/usr/bin/python3").exists():
        return "the .deb runs on /usr/bin/python3, which is missing"
    return None


@dataclass
class Container:
    nspawn: subprocess.Popen[bytes]
    pid1: int
    console: Path
    overlays_before: set[Path]  # nspawn's temporary dirs in /var/tmp that are not ours
    host_probe: Path | None = None  # a host directory in /var/lib made before the boot

    @property
    def root(self) -> Path:
        return Path(f"/proc/{self.pid1}/root")

    @property
    def socket_path(self) -> Path:
        return self.root / "run/taogpud/taogpud.sock"

    def run(self, *argv: str, check: bool = True, timeout_s: float = 60) -> str:
        """A command inside the container; its stdout."""
        done = subprocess.run(
            ["nsenter", "-t", str(self.pid1), "-a", *argv],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{argv} exited {done.returncode}: {done.stderr}{done.stdout}")
        return done.stdout

    def show(self, *props: str, unit: str = "taogpud.service") -> dict[str, str]:
        out = self.run("systemctl", "show", unit, *(f"--property={p}" for p in props))
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def client(self, timeout_s: float = 30) -> Client:
        return Client(self.socket_path, timeout_s=timeout_s)

    def journal(self, *matches: str) -> list[dict[str, Any]]:
        out = self.run("journalctl", "--no-pager", "-o", "json", *matches)
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]

    def log_tail(self) -> str:
        return self.run("journalctl", "--no-pager", "-u", "taogpud", "-n", "60", check=False)

    def wait_until(
        self, what: str, ready: Callable[[], bool], timeout_s: float = 30, step_s: float = 0.1
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(step_s)
        raise AssertionError(f"not {what} within {timeout_s} s; journal:\n{self.log_tail()}")

    def running(self) -> bool:
        state = self.show("ActiveState", "SubState")
        return (state["ActiveState"], state["SubState"]) == ("active", "running")


# /etc, /run and the rest of /var are the tmpfs root's own, empty at boot: the host's state
# (its /var/lib/taogpud above all) never reaches the container.
# (--tmpfs=/var/lib: nspawn makes an overlay's mount point, not its parents.)
HOST_TREE = (
    "--directory=/", "--volatile=yes", "--overlay=/usr::/usr", "--tmpfs=/var/lib",
    "--overlay=/var/lib/dpkg::/var/lib/dpkg",  # for dpkg, thrown away
)  # fmt: skip


def _boot(
    workdir: Path, deb: Path, tree: tuple[str, ...] = HOST_TREE, name: str = "test"
) -> Container:
    console = workdir / "console.log"
    # --register=no --keep-unit: without them nspawn asks a system bus this host lacks
    # ("Failed to open system bus"); --private-network: nothing inside reaches a network;
    # systemd-firstboot masked: it waits for answers and leaves the system "degraded".
    command = [
        "systemd-nspawn", "--quiet", "--register=no", "--keep-unit",
        f"--machine=taogpud-{name}-{os.getpid()}", "--console=pipe",
        *tree, "--private-network", f"--bind-ro={workdir}", f"--bind-ro={deb.parent}",
        "--boot", "--", "systemd.mask=systemd-firstboot.service",
    ]  # fmt: skip
    overlays_before = _overlays()
    with console.open("wb") as out:
        nspawn = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    pid1 = None
    try:
        pid1 = _find_pid1(nspawn, console)
        container = Container(nspawn, pid1, console, overlays_before)
        private = container.root / "run/systemd/private"
        _poll(private.exists, BOOT_TIMEOUT_S, "systemd's private socket", console)
        try:
            container.run("systemctl", "is-system-running", "--wait", timeout_s=BOOT_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            jobs = container.run("systemctl", "list-jobs", "--no-pager", check=False)
            raise AssertionError(f"boot did not finish in {BOOT_TIMEOUT_S} s:\n{jobs}") from exc
    except BaseException:
        _stop(nspawn, pid1, overlays_before)
        raise
    return container


def _overlays() -> set[Path]:
    return set(OVERLAY_TEMP.parent.glob(OVERLAY_TEMP.name))


def _find_pid1(nspawn: subprocess.Popen[bytes], console: Path) -> int:
    """The container's systemd: a descendant of nspawn that is PID 1 in its namespace."""
    found: list[int] = []

    def look() -> bool:
        for pid in _descendants(nspawn.pid):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                exe = Path(f"/proc/{pid}/exe").readlink()
            except OSError:
                continue
            nspid = [ln.split()[-1] for ln in status.splitlines() if ln.startswith("NSpid")]
            if nspid == ["1"] and exe.name == "systemd":
                found.append(pid)
                return True
        return False

    _poll(look, BOOT_TIMEOUT_S, "the container's PID 1", console, nspawn)
    return found[0]


def _descendants(pid: int) -> list[int]:
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return children + [d for c in children for d in _descendants(c)]


def _poll(
    ready: Callable[[], bool],
    timeout_s: float,
    what: str,
    console: Path,
    nspawn: subprocess.Popen[bytes] | None = None,
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        if nspawn is not None and nspawn.poll() is not None:
            break
        time.sleep(0.02)
    raise AssertionError(f"no {what} within {timeout_s} s:\n{console.read_text()[-3000:]}")


def _stop(nspawn: subprocess.Popen[bytes], pid1: int | None, overlays_before: set[Path]) -> None:
    """Power the container off; else TERM nspawn; else KILL the container's PID 1 (and so
    its whole PID namespace, which would outlive nspawn) and nspawn."""
    if pid1 is not None and nspawn.poll() is None:
        subprocess.run(
            ["nsenter", "-t", str(pid1), "-a", "systemctl", "poweroff", "--no-block"],
            capture_output=True,
            timeout=10,
            check=False,
        )
        if _exited(nspawn, 20):
            return
    nspawn.terminate()
    if _exited(nspawn, 10):
        return
    if pid1 is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid1, signal.SIGKILL)
    nspawn.kill()
    nspawn.wait()
    # A killed nspawn leaves its overlays' upper directories behind in /var/tmp.
    for leftover in _overlays() - overlays_before:
        shutil.rmtree(leftover, ignore_errors=True)


def _exited(process: subprocess.Popen[bytes], timeout_s: float) -> bool:
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return False
    return True


def _build_deb(out: Path) -> Path:
    """The package, built as `make deb` does; uncompressed, since it never leaves this host."""
    command = [sys.executable, str(REPO / "packaging/build.py"), "deb", "--out", str(out)]
    done = subprocess.run(
        [*command, "--compression", "none"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"packaging/build.py deb failed:\n{done.stderr}"
    return Path(done.stdout.strip().splitlines()[-1])


def _install(container: Container, deb: Path) -> None:
    """As an admin would: the pair and the key first, then `dpkg -i` (which starts it)."""
    etc = container.root / "etc"
    (etc / "taogpud").mkdir(parents=True, exist_ok=True)
    for name in ("settings.json", "config.toml"):
        shutil.copy(REPO / "packaging/examples/cpu" / name, etc / "taogpud" / name)
    (etc / "credstore").mkdir(mode=0o700, exist_ok=True)
    key = etc / "credstore/taotoken_api_key"
    key.write_text(SECRET + "\n")
    key.chmod(0o600)
    dropin = etc / "systemd/system/taogpud.service.d"
    dropin.mkdir(parents=True, exist_ok=True)
    (dropin / "test.conf").write_text(TEST_DROPIN)
    # The host's statoverride names groups this container's empty /etc/group lacks.
    (container.root / "var/lib/dpkg/statoverride").write_text("")
    container.run("dpkg", "-i", "--force-confold", str(deb), timeout_s=120)


# Session scope, not module: under xdist this file's tests share a worker (xdist_group) but
# may be interleaved with other files' tests, and a module fixture would boot again each time.
@pytest.fixture(scope="session")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package, built once for both containers (the journey's and this file's)."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    return _build_deb(tmp_path_factory.mktemp("deb"))


@pytest.fixture(scope="session")
def container(tmp_path_factory: pytest.TempPathFactory, deb: Path) -> Iterator[Container]:
    workdir = tmp_path_factory.mktemp("nspawn")
    # A directory of the host's /var, there before the boot: the container must not see it.
    probe = Path(tempfile.mkdtemp(prefix="taogpud-host-probe-", dir="/var/lib"))
    # systemd-creds refuses a host key on a tmpfs: /var/lib/systemd on a fresh disk folder.
    (workdir / "var-lib-systemd").mkdir()
    tree = (*HOST_TREE, f"--bind={workdir}/var-lib-systemd:/var/lib/systemd")
    try:
        booted = _boot(workdir, deb, tree)
        booted.host_probe = probe
        try:
            _install(booted, deb)
            yield booted
        finally:
            _stop(booted.nspawn, booted.pid1, booted.overlays_before)
    finally:
        probe.rmdir()


def _main_pid(container: Container) -> int:
    return int(container.show("MainPID")["MainPID"])


def _submit_cli(container: Container, *args: str) -> dict[str, Any]:
    taogpuctl = Path(sys.executable).parent / "taogpuctl"
    done = subprocess.run(
        [str(taogpuctl), "--socket", str(container.socket_path), "submit", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"taogpuctl exited {done.returncode}: {done.stderr}"
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _ensure_running(container: Container) -> None:
    if not container.running():
        container.run("systemctl", "start", "taogpud.service")


# --- an operator's journey on a minimal Debian 12 -----------------------------------------
# Not the host's tree, which has procps, sudo and everything else: a debootstrap minbase
# rootfs (systemd, python3 and jq added), booted read-only with a tmpfs overlay, so the one
# rootfs of a test session serves any number of boots. The steps are the README's own
# commands (README_STEPS, checked to be in README.md), run as root or as two local users:
# alice in group taogpu, bob outside it.

SUITE = "bookworm"  # Debian 12, systemd 252
MINBASE_PACKAGES = "systemd,python3,jq"
SYSTEM_SOCKET = "/run/taogpud/taogpud.sock"
README_STEPS = {
    "cpu_pair": "sudo cp /usr/share/doc/taogpud/examples/cpu/{settings.json,config.toml} "
    "/etc/taogpud/",
    "restart": "sudo systemctl restart taogpud",
    "reset": "sudo systemctl reset-failed taogpud.socket taogpud.service",
    "member": "sudo usermod -aG taogpu alice",
    "submit": "taogpuctl submit vector_add --size 1000000 --wait",
    "status": "taogpuctl status",
    "reload": "sudo systemctl reload taogpud",
    "stop": "sudo systemctl stop taogpud.socket taogpud.service",
    "purge": "sudo dpkg --purge taogpud",
}
NOT_IN_GROUP = (
    "taogpuctl: you are not in group taogpu: `sudo usermod -aG taogpu $USER`, then log in again"
)
EXIT_NOT_IN_GROUP = 4
RELAY_DOC_STEPS = (  # docs/relay.md's, in order
    "sudo systemctl stop taogpud",
    "sudo systemctl enable --now taogpud-relay.socket",
    "sudo systemctl start taogpud",
)
# Run inside the container (its python3): who holds the relay's listening socket, PID 1
# (systemd's taogpud-relay.socket) or only the daemon (a port it bound itself), and the
# status line of an unauthenticated request (401 from the relay, which serves it).
RELAY_PROBE = """
import os, socket
port = "%04X" % 8742
rows = [r.split() for r in open("/proc/net/tcp").read().splitlines()[1:]]
inode = next(r[9] for r in rows if r[1].endswith(":" + port) and r[3] == "0A")
fds = os.listdir("/proc/1/fd")
held = any(os.readlink("/proc/1/fd/" + fd) == "socket:[%s]" % inode for fd in fds)
with socket.create_connection(("127.0.0.1", 8742), timeout=30) as s:
    s.sendall(b"GET /v1/models HTTP/1.0\\r\\nHost: 127.0.0.1:8742\\r\\n\\r\\n")
    status = s.recv(200).split(b"\\r\\n")[0].decode()
print("systemd" if held else "daemon", status)
"""


def _debian_mirror() -> str | None:
    """The Debian archive apt already uses on this host (its sources), for debootstrap."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for source in sources:
        try:
            lines = source.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            words = line.split("#")[0].split()
            if words[:1] == ["URIs:"] or words[:1] == ["deb"]:
                for uri in words[1:]:
                    if "://" in uri and uri.rstrip("/").endswith("/debian"):
                        return uri
    return None


@pytest.fixture(scope="session")
def minbase_rootfs(request: pytest.FixtureRequest) -> Path:
    """A debootstrap --variant=minbase Debian 12 (290 MB), made once and kept in pytest's
    cache (.pytest_cache/d/): it is only ever booted read-only under a tmpfs overlay, so the
    next session boots the same pristine tree instead of spending 1.5-3 min making it again.
    A tree whose debootstrap did not finish has no marker and is made again."""
    reason = _skip_reason()
    mirror = _debian_mirror()
    if reason is None and shutil.which("debootstrap") is None:
        reason = "debootstrap is missing (apt-get install debootstrap)"
    if reason is None and mirror is None:
        reason = "no Debian archive in /etc/apt/sources.list* for debootstrap"
    if reason:
        pytest.skip(reason)
    assert mirror is not None
    cached = request.config.cache.mkdir(f"minbase-{SUITE}-{MINBASE_PACKAGES.replace(',', '-')}")
    root, made = cached / "rootfs", cached / "made"
    if made.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    done = subprocess.run(
        ["debootstrap", "--variant=minbase", f"--include={MINBASE_PACKAGES}", SUITE,
         str(root), mirror],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"debootstrap failed:\n{done.stdout[-3000:]}{done.stderr}"
    made.write_text(f"{MINBASE_PACKAGES}\n")
    return root


def _sh(
    container: Container, script: str, user: str | None = None
) -> subprocess.CompletedProcess[str]:
    """A README line inside the container: `sudo` lines as root, others as `user` through
    a login shell (runuser -l), as the user would type them; with no terminal (stdin is
    /dev/null), as in a provisioning script, so a question from dpkg fails the step."""
    script = script.removeprefix("sudo ")
    argv = ["bash", "-o", "pipefail", "-c", script]
    if user is not None:
        argv = ["runuser", "-l", user, "-c", script]
    return subprocess.run(
        ["nsenter", "-t", str(container.pid1), "-a", *argv],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _manager_says(container: Container, since: str) -> list[str]:
    """What systemd itself logged about taogpud's units since `since`."""
    entries = container.journal("-u", "taogpud.service", "-u", "taogpud.socket", "_PID=1",
                                f"--since={since}")  # fmt: skip
    return [str(e.get("MESSAGE", "")) for e in entries]


def _relay(container: Container) -> str:
    return container.run("python3", "-c", RELAY_PROBE).strip()


def _failed(container: Container) -> bool:
    return container.show("ActiveState")["ActiveState"] == "failed"


def _now(container: Container) -> str:
    return container.run("date", "+%Y-%m-%d %H:%M:%S").strip()


@pytest.fixture(scope="class")
def box(
    minbase_rootfs: Path, deb: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Container, Path]]:
    """The minbase rootfs booted (read-only, a tmpfs overlay on top) and the .deb to install."""
    workdir = tmp_path_factory.mktemp("minbase-boot")
    tree = (f"--directory={minbase_rootfs}", "--volatile=overlay")
    booted = _boot(workdir, deb, tree, name="minbase")
    try:
        yield booted, deb
    finally:
        _stop(booted.nspawn, booted.pid1, booted.overlays_before)


@pytest.mark.slow
@pytest.mark.timeout(600)  # the first test's setup makes the rootfs: 1.5-3 min here
class TestMinimalDebianJourney:
    """The README's steps on a fresh minbase Debian 12, in order; the first of this file's
    tests, so that its container is down before the host-tree one boots."""

    def test_readme_holds_every_step(self) -> None:
        """Each command this journey runs is written in README.md exactly so."""
        readme = (REPO / "README.md").read_text()
        missing = [line for line in README_STEPS.values() if line not in readme]
        assert not missing, missing

    def test_0_a_run_by_hand_as_root_before_the_install(self, box: tuple[Container, Path]) -> None:
        """The README's first line, `taogpud`, run as root before the package is installed
        (from the .deb unpacked elsewhere): it refuses to start on this GPU-less host, and
        leaves root's lock in /var/lib/taogpud, the service's state directory to come."""
        container, deb = box
        container.run("dpkg-deb", "-x", str(deb), "/root/unpacked")
        done = _sh(container, "/root/unpacked/opt/taogpud/bin/python -m taogpud")
        assert done.returncode != 0, done.stdout
        assert "CUDA cannot start" in done.stderr, done.stderr
        owner = container.run("stat", "-c", "%U %a", "/var/lib/taogpud/taogpud.lock").split()
        assert owner == ["root", "600"]

    def test_1_install_comes_up_on_the_cpu_pair_and_says_why(
        self, box: tuple[Container, Path]
    ) -> None:
        """dpkg -i on a host without an NVIDIA driver, no pair in /etc/taogpud: postinst
        writes the CPU pair, says which and why, and the service is active on it."""
        container, deb = box
        assert not (container.root / "bin/kill").exists(), "procps is in the minbase tree"
        done = _sh(container, f"dpkg -i {deb}")
        assert done.returncode == 0, done.stderr + done.stdout
        said = done.stderr + done.stdout
        assert "installed the cpu pair" in said and "no NVIDIA driver here" in said, said
        pair = container.root / "etc/taogpud"
        for name in ("settings.json", "config.toml"):
            assert (pair / name).read_bytes() == (
                REPO / "packaging/examples/cpu" / name
            ).read_bytes()
        assert container.running(), container.log_tail()
        assert container.show("StatusText")["StatusText"].startswith("cpu: workers")

    def test_2_the_cpu_pair_then_a_restart_runs_it(self, box: tuple[Container, Path]) -> None:
        """The README's CPU pair and restart: the service runs, its socket is root:taogpu 0660."""
        container, _ = box
        for step in ("cpu_pair", "restart"):
            done = _sh(container, README_STEPS[step])
            assert done.returncode == 0, f"{step}: {done.stderr}{container.log_tail()}"
        assert container.running(), container.log_tail()
        sock = container.run("stat", "-c", "%a %U %G", SYSTEM_SOCKET).split()
        assert sock == ["660", "root", "taogpu"]
        # root's lock from test_0 was given back to the service, not a Permission denied.
        lock = container.run("stat", "-c", "%U %G %a", "/var/lib/taogpud/taogpud.lock").split()
        assert lock == ["taogpud", "taogpud", "600"]
        modes = container.run("stat", "-c", "%a", "/var/lib/taogpud", "/var/cache/taogpud")
        assert modes.split() == ["700", "750"]  # as tmpfiles.d says, after a start too

    def test_2a_ten_restarts_in_a_minute_all_come_back(self, box: tuple[Container, Path]) -> None:
        """A person's own restarts (the README's, socket and service) never trip a start
        limit: ten in a row, each active, and the socket never fails with the service."""
        container, _ = box
        for attempt in range(10):
            done = _sh(container, README_STEPS["restart"])
            assert done.returncode == 0, f"restart {attempt + 1}: {done.stderr}"
            assert container.running(), f"restart {attempt + 1}:\n{container.log_tail()}"
        for unit in ("taogpud.socket", "taogpud.service"):
            shown = container.show("ActiveState", "Result", unit=unit)
            assert shown == {"ActiveState": "active", "Result": "success"}, (unit, shown)

    def test_3_a_member_submits_with_the_readme_command(self, box: tuple[Container, Path]) -> None:
        """alice, in group taogpu, runs `taogpuctl submit … --wait` with no --socket: the
        client finds the system socket (no daemon of her own runs)."""
        container, _ = box
        for user in ("alice", "bob"):
            container.run("useradd", "--create-home", "--shell", "/bin/bash", user)
        assert _sh(container, README_STEPS["member"]).returncode == 0
        done = _sh(container, README_STEPS["submit"], user="alice")
        assert done.returncode == 0, done.stderr
        assert "succeeded" in done.stdout and "backend=cpu" in done.stdout, done.stdout

    def test_4_an_outsider_is_told_to_join_the_group(self, box: tuple[Container, Path]) -> None:
        """bob, outside taogpu: the join-the-group line and exit 4, with or without --socket."""
        container, _ = box
        for line in (README_STEPS["status"], f"taogpuctl --socket {SYSTEM_SOCKET} status"):
            done = _sh(container, line, user="bob")
            assert done.returncode == EXIT_NOT_IN_GROUP, f"{line}: {done.stderr}"
            assert done.stderr.startswith(NOT_IN_GROUP), done.stderr

    def test_5_reload_needs_no_procps(self, box: tuple[Container, Path]) -> None:
        """`systemctl reload` on a system without /bin/kill reaches the daemon as SIGHUP."""
        container, _ = box
        pid = _main_pid(container)
        done = _sh(container, README_STEPS["reload"])
        assert done.returncode == 0, done.stderr + container.log_tail()

        def reloaded() -> bool:
            lines = [e["MESSAGE"] for e in container.journal("-u", "taogpud", "_TRANSPORT=stdout")]
            events = [json.loads(m) for m in lines if m.startswith("{")]
            return any("SIGHUP" in str(e.get("trigger", "")) for e in events)

        container.wait_until("the reload logged by the daemon", reloaded, timeout_s=15)
        container.wait_until("running again", container.running, timeout_s=15)
        assert _main_pid(container) == pid

    def test_6_the_readmes_journal_examples_work(self, box: tuple[Container, Path]) -> None:
        """Every line of the systemd guide's journal block exits 0; the jq one prints the JSON
        lines of the job events (TRACE_JSON)."""
        container, _ = box
        guide = (REPO / "docs" / "systemd.md").read_text()
        section = guide.split("## Journal", 1)[1].split("\n## ", 1)[0]
        blocks = section.split("```")[1::2]  # the fenced blocks: examples of output, commands
        block = next(b for b in blocks if b.strip().startswith("journalctl"))
        lines = [ln.split("  #")[0].strip() for ln in block.splitlines() if ln.strip()]
        lines = [ln.replace("3f1c2a…", "x") for ln in lines]
        assert lines
        for line in lines:
            done = _sh(container, line)
            assert done.returncode == 0, f"{line}: {done.stderr}"
        # the JSON lines, read back from the TRACE_JSON field of the job entries
        jq_lines = [ln for ln in lines if "select(.BACKEND)" in ln and "TRACE_JSON" in ln]
        assert jq_lines
        printed = _sh(container, jq_lines[0]).stdout
        events = [json.loads(ln) for ln in printed.splitlines() if ln.startswith("{")]
        assert any(event.get("backend") == "cpu" for event in events), printed[-2000:]

    def test_6a_the_guides_gpu_pair_here_is_refused_once_and_the_fix_shows(
        self, box: tuple[Container, Path]
    ) -> None:
        """The guide's GPU pair on this CPU-only build and GPU-less host: the start fails,
        naming the CUDA build of the package or the CPU pair, never pip; it is not retried
        (exit 6, NOTCONFIGURED: no start limit spent, the socket still listens). The README's
        CPU pair and restart then run, and the status shows the new state, not the old error."""
        container, _ = box
        _sh(container, "cp /usr/share/doc/taogpud/examples/gpu/* /etc/taogpud/")
        assert _sh(container, README_STEPS["restart"]).returncode != 0
        shown = container.show("ExecMainStatus", "NRestarts", "Result", "ActiveState")
        assert shown == {
            "ExecMainStatus": "6", "NRestarts": "0", "Result": "exit-code", "ActiveState": "failed",
        }, shown  # fmt: skip
        assert container.show("ActiveState", unit="taogpud.socket")["ActiveState"] == "active"
        status = container.show("StatusText")["StatusText"]
        assert "CUDA build of the package" in status, status
        assert "/usr/share/doc/taogpud/examples/cpu" in status
        assert "pip install" not in status
        # Its offline checks: the socket unit would start the failing service on a connect,
        # and the client would wait in the backlog for its 60 s timeout.
        doctor = _sh(container, "TAOGPUD_SOCKET=/run/taogpud/absent taogpuctl doctor")
        assert doctor.returncode == 1, doctor.stderr
        assert "CUDA build of the package" in doctor.stdout, doctor.stdout
        assert "pip install" not in doctor.stdout + doctor.stderr
        for step in ("cpu_pair", "restart"):
            done = _sh(container, README_STEPS[step])
            assert done.returncode == 0, f"{step}: {done.stderr}{container.log_tail()}"
        assert container.running(), container.log_tail()
        status = _sh(container, "systemctl status --no-pager taogpud").stdout
        assert 'Status: "cpu: workers 1/1 warm' in status, status
        assert "CUDA" not in container.show("StatusText")["StatusText"]

    def test_6b_a_start_that_may_pass_later_is_not_looped_and_says_why(
        self, box: tuple[Container, Path]
    ) -> None:
        """The state directory held by another process: the start fails once (exit 75, not
        retried: no loop, no start limit spent), STATUS= names the holder and the fix, and
        the socket still listens. Once the holder is gone, the README's restart runs it."""
        container, _ = box
        container.run("systemctl", "stop", "taogpud.service")
        lock = "/var/lib/taogpud/taogpud.lock"
        holder = "taogpud-lock-holder.service"
        container.run("systemd-run", f"--unit={holder}", "/usr/bin/flock", lock, "sleep", "600")
        try:

            def held() -> bool:
                return _sh(container, f"flock --nonblock {lock} true").returncode != 0

            container.wait_until("the lock held", held, timeout_s=10)
            assert _sh(container, README_STEPS["restart"]).returncode != 0
            # No need to wait out RestartSec: systemd decides on a retry as the start fails,
            # and a retry it has decided on shows as activating/auto-restart until it runs.
            # failed/failed at the restart's return is the decision that none will come.
            props = ("ExecMainStatus", "NRestarts", "ActiveState", "SubState", "StatusText")
            shown = container.show(*props)
            assert (shown["ExecMainStatus"], shown["NRestarts"]) == ("75", "0"), shown
            assert (shown["ActiveState"], shown["SubState"]) == ("failed", "failed"), shown
            status = shown["StatusText"]
            assert "failed to start: the state directory /var/lib/taogpud is in use" in status
            assert "stop that one" in status, status
            assert container.show("ActiveState", unit="taogpud.socket")["ActiveState"] == "active"
        finally:
            container.run("systemctl", "stop", holder)
        for step in ("reset", "restart"):
            done = _sh(container, README_STEPS[step])
            assert done.returncode == 0, f"{step}: {done.stderr}{container.log_tail()}"
        assert container.running(), container.log_tail()

    def test_6c_the_relay_socket_from_the_package_serves_across_a_restart(
        self, box: tuple[Container, Path]
    ) -> None:
        """The package's taogpud-relay.socket, enabled as docs/relay.md says with the relay
        on: systemd holds the port and the daemon serves it, across `systemctl restart`."""
        container, _ = box
        guide = (REPO / "docs/relay.md").read_text()
        assert all(step in guide for step in RELAY_DOC_STEPS)
        config = container.root / "etc/taogpud/config.toml"
        relay = '\n[relay]\nenabled = true\nlisten = "127.0.0.1:8742"\n'
        config.write_text(config.read_text() + relay)
        for step in RELAY_DOC_STEPS:
            done = _sh(container, step)
            assert done.returncode == 0, f"{step}: {done.stderr}{container.log_tail()}"
        assert _relay(container) == "systemd HTTP/1.1 401 Unauthorized"
        assert _sh(container, README_STEPS["restart"]).returncode == 0
        assert _relay(container) == "systemd HTTP/1.1 401 Unauthorized"

    def test_7_an_upgrade_with_a_client_waiting(self, box: tuple[Container, Path]) -> None:
        """dpkg -i over the installed package while `taogpuctl wait` follows a job that
        outlives the drain and allows a retry: prerm stops only the service, the sockets
        (the relay's too) never close, the wait rides through the restart, and the job,
        queued again at the drain deadline, succeeds on the new daemon."""
        container, deb = box
        config = container.root / "etc/taogpud/config.toml"
        # The job outlives the drain if the stop begins within 4 s of its submit (prerm's,
        # once dpkg has read the package): 5 s of sleep against a 1 s drain.
        drain = "max_concurrent_tasks = 8\ndrain_timeout_s = 1"
        config.write_text(config.read_text().replace("max_concurrent_tasks = 8", drain))
        with container.client() as client:
            generation = client.status()["config_generation"]
        assert _sh(container, README_STEPS["reload"]).returncode == 0  # the stop reads it

        def drain_in_force() -> bool:
            with container.client() as client:
                return bool(client.status()["config_generation"] > generation)

        container.wait_until("the reloaded drain in force", drain_in_force, timeout_s=15)
        pid = _main_pid(container)
        with container.client() as client:
            job = client.submit("sleep", {"ms": 5000}, max_retries=1)
        taogpuctl = Path(sys.executable).parent / "taogpuctl"
        wait = [str(taogpuctl), "--socket", str(container.socket_path), "wait", job["id"]]
        waiting = subprocess.Popen(
            [*wait, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        since = _now(container)
        done = _sh(container, f"dpkg -i {deb}")
        assert done.returncode == 0, done.stderr
        out, err = waiting.communicate(timeout=120)
        assert waiting.returncode == 0, f"taogpuctl wait exited {waiting.returncode}: {err}"
        finished = json.loads(out)
        assert (finished["status"], finished["attempts"]) == ("succeeded", 1), finished
        assert "still active" not in done.stderr + done.stdout
        for unit in ("taogpud.socket", "taogpud.service", "taogpud-relay.socket"):
            assert container.show("ActiveState", unit=unit)["ActiveState"] == "active", unit
        assert _main_pid(container) != pid
        assert _relay(container) == "systemd HTTP/1.1 401 Unauthorized"
        said = _manager_says(container, since)
        assert not [m for m in said if m.startswith("Closed taogpud")], said

    def test_8_stop_with_the_socket_stays_stopped_and_leaves_nothing(
        self, box: tuple[Container, Path]
    ) -> None:
        """The README's stop: both units down, the socket file gone, the service not back a
        moment later, and systemd had no left-over process of the daemon's to kill."""
        container, _ = box
        since = _now(container)
        done = _sh(container, README_STEPS["stop"])
        assert done.returncode == 0, done.stderr
        assert "can still be activated" not in done.stderr and "still active" not in done.stderr
        time.sleep(1)
        for unit in ("taogpud.socket", "taogpud.service", "taogpud-relay.socket"):
            assert container.show("ActiveState", unit=unit)["ActiveState"] == "inactive", unit
        assert not container.socket_path.exists()
        said = _manager_says(container, since)
        assert not [m for m in said if "Killing process" in m or "remains running" in m], said

    def test_9_purge_removes_its_own_and_names_what_stays(
        self, box: tuple[Container, Path]
    ) -> None:
        """dpkg --purge of a failed install: state and cache gone; the admin's API key
        stays, and postrm says so; the failed units do not linger in `systemctl --failed`."""
        container, _ = box
        key = "install -m 0600 /dev/stdin /etc/credstore/taotoken_api_key"
        assert _sh(container, f"echo {SECRET} | {key}").returncode == 0
        _sh(container, "cp /usr/share/doc/taogpud/examples/gpu/* /etc/taogpud/")
        assert _sh(container, "systemctl start taogpud.service").returncode != 0
        assert "taogpud.service" in _sh(container, "systemctl --failed --no-legend").stdout
        done = _sh(container, README_STEPS["purge"])
        assert done.returncode == 0, done.stderr
        said = done.stderr + done.stdout
        assert "/etc/credstore/taotoken_api_key stays" in said, said
        assert SECRET not in said
        for gone in ("var/lib/taogpud", "var/cache/taogpud", "etc/taogpud", "opt/taogpud"):
            assert not (container.root / gone).exists(), gone
        assert (container.root / "etc/credstore/taotoken_api_key").exists()
        state = container.show("LoadState", "ActiveState")
        assert state["ActiveState"] == "inactive", state
        failed = _sh(container, "systemctl --failed --no-legend --all").stdout
        assert "taogpud" not in failed, failed
        links = _sh(container, "find /etc/systemd -name 'taogpud*'").stdout
        assert links == "", links  # taogpud-relay.socket's .wants links too

    def test_10_an_install_over_the_admins_pair_asks_nothing_and_keeps_it(
        self, box: tuple[Container, Path]
    ) -> None:
        """The admin's own pair first, then `dpkg -i` with no terminal, twice (an install,
        then a reinstall): no conffile question, the pair kept byte for byte, and it runs."""
        container, deb = box
        pair = container.root / "etc/taogpud"
        pair.mkdir()
        for name in ("settings.json", "config.toml"):
            shutil.copy(REPO / "packaging/examples/cpu" / name, pair / name)
        config = pair / "config.toml"
        config.write_text(
            config.read_text().replace("max_concurrent_tasks = 8", "max_concurrent_tasks = 5")
        )
        mine = {name: (pair / name).read_bytes() for name in ("settings.json", "config.toml")}
        for attempt in ("install", "reinstall"):
            done = _sh(container, f"dpkg -i {deb}")
            assert done.returncode == 0, f"{attempt}: {done.stderr}{done.stdout}"
            assert "keeping the pair in /etc/taogpud" in done.stderr, done.stderr
            assert {name: (pair / name).read_bytes() for name in mine} == mine, attempt
            assert container.running(), f"{attempt}: {container.log_tail()}"
        with Client(container.socket_path, timeout_s=30) as client:
            assert client.status()["max_concurrent_tasks"] == 5


# --- the package ------------------------------------------------------------------------


def test_deb_installs_enables_and_starts(container: Container) -> None:
    """dpkg -i creates the user and group, enables the socket and the service, starts it."""
    assert container.run("dpkg-query", "-W", "-f=${Status}", "taogpud") == "install ok installed"
    assert container.run("getent", "group", "taogpu").startswith("taogpu:")
    assert "taogpu" in container.run("id", "-nG", "taogpud").split()
    for unit in ("taogpud.socket", "taogpud.service"):
        assert container.run("systemctl", "is-enabled", unit).strip() == "enabled"
    assert container.running(), container.log_tail()
    cmdline = (container.root / f"proc/{_main_pid(container)}/cmdline").read_bytes()
    assert b"/usr/bin/taogpud" in cmdline.split(b"\0")
    sock = container.run("stat", "-c", "%a %U %G", "/run/taogpud/taogpud.sock").split()
    assert sock == ["660", "root", "taogpu"]


def test_the_container_sees_none_of_the_hosts_state(container: Container) -> None:
    """The host's /var (bar dpkg's database), /run and /etc stay outside: a directory made
    in the host's /var/lib before the boot is not there, and the package's state directory
    is the container's own (a root-run leftover on the host once turned 12 tests red)."""
    assert container.host_probe is not None
    assert container.host_probe.is_dir()
    assert not (container.root / container.host_probe.relative_to("/")).exists()
    assert (container.root / "var/lib/dpkg/status").exists()
    mounts = container.run("findmnt", "--noheadings", "--output", "TARGET,FSTYPE", "--list")
    fstype = dict(line.split() for line in mounts.splitlines() if len(line.split()) == 2)
    assert (fstype["/var/lib"], fstype["/var/lib/dpkg"]) == ("tmpfs", "overlay"), mounts
    for own in ("/var/lib/taogpud", "/run/taogpud", "/etc/taogpud"):
        assert own not in fstype, f"{own} is a mount: {mounts}"


def test_units_verify_without_a_word(container: Container) -> None:
    """systemd-analyze verify prints nothing on stderr for every unit the package ships."""
    system = [f"/lib/systemd/system/{u}" for u in ("taogpud.service", "taogpud.socket")]
    system.append("/lib/systemd/system/taogpud-relay.socket")
    user = [f"/usr/lib/systemd/user/taogpud.{kind}" for kind in ("service", "socket")]
    # A user manager's view needs a runtime dir. The host's gpg-agent environment
    # generator needs awk, whose /etc/alternatives link this container's /etc lacks.
    container.run("mkdir", "-p", "/run/user/0/no-generators")
    user_env = [
        "XDG_RUNTIME_DIR=/run/user/0",
        "SYSTEMD_ENVIRONMENT_GENERATOR_PATH=/run/user/0/no-generators",
    ]
    for argv in (
        ["systemd-analyze", "verify", *system],
        ["env", *user_env, "systemd-analyze", "--user", "verify", *user],
    ):
        done = subprocess.run(
            ["nsenter", "-t", str(container.pid1), "-a", *argv],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert (done.returncode, done.stderr) == (0, ""), f"{argv}: {done.stderr}"


def test_security_exposure_under_threshold() -> None:
    """`systemd-analyze security --offline=yes` rates taogpud.service at most 2.0."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is missing")
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager",
         f"--threshold={int(EXPOSURE_THRESHOLD * 10)}", str(REPO / "systemd/taogpud.service")],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    overall = [ln for ln in done.stdout.splitlines() if "Overall exposure level" in ln]
    assert overall, done.stdout + done.stderr
    exposure = float(overall[0].split(":")[1].split()[0])
    assert exposure <= EXPOSURE_THRESHOLD, overall[0]
    assert done.returncode == 0, done.stderr


# --- notify: start, status, reload ------------------------------------------------------


def test_start_returns_after_ready_with_status(container: Container) -> None:
    """`systemctl restart` returns once READY=1 came: health is ok and STATUS= names the workers."""
    container.run("systemctl", "restart", "taogpud.service")
    assert container.running()
    with container.client(timeout_s=5) as client:
        assert client.health()["ok"] is True
    status = container.show("StatusText")["StatusText"]
    assert "cpu: workers 1/1 warm (cpu:0)" in status, status
    assert "config generation 1" in status
    assert 'Status: "cpu: workers 1/1 warm' in container.run(
        "systemctl", "status", "--no-pager", "taogpud.service", check=False
    )


def test_status_follows_running_jobs(container: Container) -> None:
    """STATUS= is kept current: a running job shows in it, and is gone once it finished."""
    _ensure_running(container)
    with container.client() as client:
        job = client.submit("sleep", {"ms": 2500})
        container.wait_until(
            "a running job in STATUS=",
            lambda: "running 1," in container.show("StatusText")["StatusText"],
            timeout_s=5,
        )
        client.wait(job["id"], timeout_s=10)
    container.wait_until(
        "STATUS= back to idle",
        lambda: "running 0," in container.show("StatusText")["StatusText"],
        timeout_s=5,
    )


def test_reload_applies_config_and_notifies(container: Container) -> None:
    """`systemctl reload` after a config.toml change: RELOADING=1, then READY=1, change in force."""
    _ensure_running(container)
    with container.client() as client:
        before = client.status()
    config = container.root / "etc/taogpud/config.toml"
    text = config.read_text()
    config.write_text(text.replace("max_concurrent_tasks = 8", "max_concurrent_tasks = 3"))
    container.run("systemctl", "log-level", "debug")  # the manager logs each state change
    try:
        container.run("systemctl", "reload", "taogpud.service")

        def applied() -> bool:
            with container.client() as client:
                status = client.status()
            return status["max_concurrent_tasks"] == 3 and container.running()

        container.wait_until("the reloaded config in force", applied, timeout_s=15)
    finally:
        container.run("systemctl", "log-level", "info")
    with container.client() as client:
        assert client.status()["config_generation"] > before["config_generation"]
    lines = [e["MESSAGE"] for e in container.journal("-u", "taogpud", "_TRANSPORT=stdout")]
    events = [json.loads(m) for m in lines if m.startswith("{")]
    assert any(
        e["event"] in ("config.reloaded", "config.unchanged") and "SIGHUP" in e.get("trigger", "")
        for e in events
    ), "systemctl reload did not reach the daemon as SIGHUP"
    manager = [
        e["MESSAGE"]
        for e in container.journal("-u", "taogpud.service", "_PID=1")
        if "Changed" in e.get("MESSAGE", "")
    ]
    assert "taogpud.service: Changed running -> reload" in manager, manager
    assert manager.index("taogpud.service: Changed reload -> running") > manager.index(
        "taogpud.service: Changed running -> reload"
    )


# --- jobs through the socket, and the journal -------------------------------------------


def test_job_from_the_host_through_the_socket(container: Container) -> None:
    """`taogpuctl submit --wait` from outside the container runs a job on the CPU backend."""
    _ensure_running(container)
    job = _submit_cli(container, "vector_add", "--size", "100000", "--wait")
    assert (job["status"], job["backend"], job["device"]) == ("succeeded", "cpu", "cpu:0")
    assert job["error"] is None


def test_journal_fields_select_exactly_the_job_entries(container: Container) -> None:
    """`journalctl -u taogpud BACKEND=cpu` and `JOB_ID=` select job events, each once."""
    _ensure_running(container)
    job = _submit_cli(container, "saxpy", "--size", "1000", "--wait")
    entries = container.journal("-u", "taogpud", f"JOB_ID={job['id']}")
    assert [e["EVENT"] for e in entries] == ["job.queued", "job.running", "job.succeeded"]
    done = entries[-1]
    assert (done["BACKEND"], done["DEVICE"], done["TASK"]) == ("cpu", "cpu:0", "saxpy")
    assert (done["FALLBACK"], done["STATUS"], done["UID"], done["PRIORITY"]) == (
        "false", "succeeded", "0", "6",
    )  # fmt: skip
    assert float(done["RUN_MS"]) >= 0 and float(done["QUEUE_MS"]) >= 0
    assert json.loads(done["TRACE_JSON"])["job_id"] == job["id"]  # the JSON line stdout has
    assert done["MESSAGE"].startswith(f"job {job['id'][:6]} succeeded saxpy on cpu:0 (cpu) in ")
    on_cpu = container.journal("-u", "taogpud", "BACKEND=cpu")
    assert on_cpu and all(e["EVENT"].startswith("job.") and e["JOB_ID"] for e in on_cpu)
    assert {e["JOB_ID"] for e in on_cpu} >= {job["id"]}
    stdout_lines = [e["MESSAGE"] for e in container.journal("-u", "taogpud", "_TRANSPORT=stdout")]
    assert not [m for m in stdout_lines if job["id"] in m], "a job event also went to stdout"


def test_stop_lets_running_jobs_finish(container: Container) -> None:
    """`systemctl stop` during a running job waits for it (bounded drain), then stops."""
    _ensure_running(container)
    with container.client() as client:
        job = client.submit("sleep", {"ms": 2000})
        container.wait_until(
            "the job running", lambda: client.get(job["id"])["status"] == "running", timeout_s=5
        )
    started = time.monotonic()
    container.run("systemctl", "stop", "taogpud.service")
    took_s = time.monotonic() - started
    assert container.show("ActiveState")["ActiveState"] == "inactive"
    finished = container.journal("-u", "taogpud", f"JOB_ID={job['id']}", "EVENT=job.succeeded")
    assert len(finished) == 1, container.log_tail()
    assert 0.5 < took_s < 30, took_s


def test_connect_starts_the_stopped_service(container: Container) -> None:
    """With the service stopped, a connect to the socket starts it (socket activation)."""
    container.run("systemctl", "stop", "taogpud.service")
    assert container.show("ActiveState")["ActiveState"] == "inactive"
    assert container.show("ActiveState", unit="taogpud.socket")["ActiveState"] == "active"
    with container.client(timeout_s=60) as client:
        assert client.health()["ok"] is True  # waits in the backlog while the workers warm
    assert container.running()
    # Served on systemd's socket: a daemon binding its own would own the file itself.
    sock = container.run("stat", "-c", "%U %G", "/run/taogpud/taogpud.sock").split()
    assert sock == ["root", "taogpu"]


# --- the watchdog -----------------------------------------------------------------------


def _wait_restarted(container: Container, old_pid: int, restarts: int) -> None:
    def restarted() -> bool:
        shown = container.show("NRestarts", "MainPID", "ActiveState", "SubState")
        return (
            int(shown["NRestarts"]) > restarts
            and int(shown["MainPID"]) not in (0, old_pid)
            and (shown["ActiveState"], shown["SubState"]) == ("active", "running")
        )

    container.wait_until("restarted by the watchdog", restarted, timeout_s=40, step_s=0.25)


def test_watchdog_restarts_a_wedged_main_loop(container: Container) -> None:
    """A daemon whose main process stops (SIGSTOP) is killed by the watchdog and restarted."""
    _ensure_running(container)
    pid, restarts = _main_pid(container), int(container.show("NRestarts")["NRestarts"])
    since = container.run("date", "+%Y-%m-%d %H:%M:%S").strip()
    container.run("kill", "-STOP", str(pid))
    _wait_restarted(container, pid, restarts)
    messages = [e["MESSAGE"] for e in container.journal("-u", "taogpud", "--since", since)]
    assert any("Watchdog timeout" in m for m in messages), messages


def test_watchdog_restarts_when_a_worker_stops_answering(container: Container) -> None:
    """A live loop whose worker does not answer pings withholds WATCHDOG=1 and is restarted."""
    _ensure_running(container)
    pid, restarts = _main_pid(container), int(container.show("NRestarts")["NRestarts"])
    with container.client() as client:
        worker_pid = client.status()["workers"][0]["pid"]
    container.run("kill", "-STOP", str(worker_pid))
    _wait_restarted(container, pid, restarts)
    unresponsive = container.journal("-u", "taogpud", f"_PID={pid}", "_TRANSPORT=stdout")
    assert any("daemon.workers_unresponsive" in e["MESSAGE"] for e in unresponsive)


# --- the key ----------------------------------------------------------------------------

# The README's drop-in for a key encrypted with systemd-creds. The empty LoadCredential=
# first: systemd 252 ignores a second credential with the same name.
ENCRYPTED_DROPIN = """\
[Service]
LoadCredential=
LoadCredentialEncrypted=taotoken_api_key
"""


def test_encrypted_credential_through_a_drop_in(container: Container) -> None:
    """A key encrypted by systemd-creds, loaded by the README's drop-in, reaches the daemon."""
    _ensure_running(container)
    plain, encrypted = (
        "/etc/credstore/taotoken_api_key",
        "/etc/credstore.encrypted/taotoken_api_key",
    )
    container.run("systemd-creds", "encrypt", "--name=taotoken_api_key", plain, encrypted)
    container.run("mv", plain, "/run/taotoken_api_key.plain")  # only the encrypted key is left
    dropin = container.root / "etc/systemd/system/taogpud.service.d/credential.conf"
    dropin.write_text(ENCRYPTED_DROPIN)
    try:
        container.run("systemctl", "daemon-reload")
        container.run("systemctl", "restart", "taogpud.service")
        with container.client() as client:
            assert client.info()["key_source"] == "credential"
        assert SECRET.encode() not in (container.root / encrypted.lstrip("/")).read_bytes()
    finally:
        dropin.unlink()
        container.run("mv", "/run/taotoken_api_key.plain", plain)
        container.run("systemctl", "daemon-reload")
        container.run("systemctl", "restart", "taogpud.service")


def test_credential_reaches_the_daemon_and_never_the_journal(container: Container) -> None:
    """The key comes from LoadCredential= (key_source=credential) and is in no journal entry."""
    _ensure_running(container)
    with container.client() as client:
        assert client.info()["key_source"] == "credential"
    environment = container.show("Environment")["Environment"]
    assert SECRET not in environment
    everything = container.run("journalctl", "--no-pager", "-o", "export")
    assert "taogpud" in everything
    assert SECRET not in everything
