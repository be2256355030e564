"""taogpud in the user's language: zh-CN where the locale says so, English otherwise, and
everything machine-readable (--json, codes, the trace) the same bytes in every locale."""

from __future__ import annotations

import copy
import json
import os
import pickle
import pty
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from babel.messages.catalog import Message
from conftest import token_of

from scripts import i18n as catalogs
from taogpud.daemon.lifecycle import EXIT_HOST_CANNOT_RUN
from taogpud.i18n import Text, accepted_language, catalog_for, user_language
from taogpud.testing import RunningDaemon, running, same_code_env, taogpuctl, write_pair
from taogpud.testing.fake_provider import FakeProvider

# One worker for the module (--dist loadgroup), so that the daemon its tests share starts once.
pytestmark = pytest.mark.xdist_group("i18n")

ZH = {"LANG": "zh_CN.UTF-8"}
EN = {"LANG": "C.UTF-8"}


@pytest.fixture(scope="module")
def daemon() -> Iterator[RunningDaemon]:
    with running() as started:
        yield started


# --- no daemon needed ----------------------------------------------------------------------


def test_the_language_comes_from_the_usual_variables_in_the_usual_order() -> None:
    """TAOGPUD_LANG forces one; else LC_ALL, LC_MESSAGES, LANG, the first set; C is English."""
    assert user_language({"LANG": "zh_CN.UTF-8"}) == "zh_CN"
    assert user_language({"LC_ALL": "C", "LANG": "zh_CN.UTF-8"}) is None
    assert user_language({"LC_MESSAGES": "zh_CN.UTF-8", "LANG": "en_US.UTF-8"}) == "zh_CN"
    assert user_language({"TAOGPUD_LANG": "zh-CN", "LC_ALL": "C"}) == "zh_CN"
    assert user_language({"TAOGPUD_LANG": "en", "LANG": "zh_CN.UTF-8"}) is None
    assert user_language({}) is None
    assert [catalog_for(tag) for tag in ("zh", "zh-Hans", "zh_CN.gb18030", "fr_FR")] == [
        "zh_CN",
        "zh_CN",
        "zh_CN",
        None,
    ]


def test_accept_language_picks_the_first_catalog_by_weight() -> None:
    """The highest q first; English asked for first stays English; no header is English."""
    assert accepted_language("zh-CN,zh;q=0.9,en;q=0.8") == "zh_CN"
    assert accepted_language("en-US,zh;q=0.5") is None
    assert accepted_language("fr, zh-Hans;q=0.3") == "zh_CN"
    assert accepted_language("en;q=0.2, zh;q=0.9") == "zh_CN"
    assert accepted_language(None) is None


def test_a_text_is_english_in_logs_and_translated_for_a_person() -> None:
    """str() of a Text is the English; render() translates the template and nested Texts."""
    text = Text("{origin}, expected {allowed}", origin=Text("got {given}", given="7"), allowed="x")
    assert str(text) == "got 7, expected x"
    assert text.render("zh_CN") == "实际为 7，应为 x"
    assert Text("not in the catalog {x}", x=1).render("zh_CN") == "not in the catalog 1"


def test_a_text_survives_pickle_and_copy() -> None:
    """An error's Text crossing a process (pickle) or copied stays the same message, braces in
    its values included, and still translates."""
    text = Text(
        "{origin}, expected {allowed}", origin=Text("got {given}", given='{"a": 1}'), allowed="x"
    )
    for again in (pickle.loads(pickle.dumps(text)), copy.deepcopy(text)):
        assert again == text == 'got {"a": 1}, expected x'
        assert again.render("zh_CN") == '实际为 {"a": 1}，应为 x'


def test_the_catalog_is_complete_and_compiled() -> None:
    """What `make check` runs: every marked string translated, placeholders kept, .mo current."""
    assert catalogs.check() == []


def test_the_catalog_check_catches_a_placeholder_that_would_crash() -> None:
    """A translation whose {names} differ from the English fails the check (str.format would
    raise KeyError at run time), and so does an empty one."""
    wrong = Message("job {job_id} {status}", "作业 {id} {status}")
    assert any("placeholders" in p for p in catalogs.entry_problems("zh_CN", wrong))
    empty = Message("job {job_id} {status}", "")
    assert list(catalogs.entry_problems("zh_CN", empty)) == [
        "zh_CN: 'job {job_id} {status}': no translation"
    ]


# --- against a daemon ----------------------------------------------------------------------


def test_the_main_flows_speak_chinese_under_a_chinese_locale(
    module_daemon: RunningDaemon, tmp_path: Path
) -> None:
    """submit, show --evidence, status, a refused submit and doctor, under LANG=zh_CN.UTF-8:
    the zh-CN text, with the guide's `device=… backend=…` grep left as it is."""
    submitted = module_daemon.ctl("submit", "vector_add", "--size", "1000", "--wait", env=ZH)
    assert submitted.returncode == 0, submitted.stderr
    assert "成功 task=vector_add device=cpu:" in submitted.stdout
    assert " backend=cpu fallback=false" in submitted.stdout
    job_id = submitted.stdout.split()[1]

    evidence = module_daemon.ctl("show", job_id, "--evidence", env=ZH)
    assert "没有 NVML 证据：该作业在 cpu 上运行，不是 CUDA GPU" in evidence.stdout

    status = module_daemon.ctl("status", env=ZH)
    assert status.returncode == 0, status.stderr
    assert "后端 cpu" in status.stdout and "兜底 否" in status.stdout
    assert any(line.startswith("设备") for line in status.stdout.splitlines())  # table heading

    refused = module_daemon.ctl("submit", "vector_ad", env=ZH)
    assert refused.returncode == 2
    assert "没有名为 'vector_ad' 的任务；是否想写 'vector_add'？ [unknown_task]" in refused.stderr
    assert "（提示：已有任务：" in refused.stderr

    doctor = module_daemon.ctl("doctor", "--no-ping", env=ZH)
    assert "doctor：" in doctor.stdout and "项通过" in doctor.stdout
    assert "不是 WSL（原生 Linux 内核）" in doctor.stdout  # a check's detail, from the daemon
    assert "gpu.backend 为 cpu：不使用 cuda_arch" in doctor.stdout
    assert "你的 shell 没有导出 TAOTOKEN_API_KEY" in doctor.stdout  # a check made by the CLI
    assert "在 " in doctor.stdout and "上应答：后端 cpu，配置版本 1" in doctor.stdout


def test_a_config_error_names_file_key_and_fix_in_chinese(tmp_path: Path) -> None:
    """`config validate` on a file with a misspelt key: the did-you-mean in zh-CN."""
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"gpu": {"memoryFracton": 0.5}}))
    result = taogpuctl("config", "validate", "--settings", str(settings), env=ZH)
    assert result.returncode == 2
    assert 'settings.json：gpu.memoryFracton：未知的键（修复：是否想写 "memoryFraction"？）' in (
        result.stdout
    )
    assert "配置无效：1 个错误" in result.stdout


@pytest.mark.process
def test_the_daemon_refuses_a_bad_config_in_chinese_at_a_terminal(tmp_path: Path) -> None:
    """A start-up refusal read at a terminal is in the user's language; into a file (the
    journal) it stays English."""
    config = {"runtime": {"thread_num": 4}}
    pair = write_pair(tmp_path, {"gpu": {"memoryFracton": 0.5}}, config)
    command = [sys.executable, "-m", "taogpud", *pair.flags(), "--state-dir", str(tmp_path / "s")]
    env = same_code_env({**os.environ, **ZH, "TAOGPUD_LANG": ""})
    main, child = pty.openpty()
    proc = subprocess.Popen(command, stdin=child, stdout=child, stderr=child, env=env)
    os.close(child)
    seen = _read_all(main)
    assert proc.wait(timeout=30) == 2
    assert "taogpud: 配置错误：" in seen
    assert 'settings.json：gpu.memoryFracton：未知的键（修复：是否想写 "memoryFraction"？）' in seen
    into_file = subprocess.run(
        command, check=False, capture_output=True, text=True, env=env, timeout=30
    )
    assert into_file.returncode == 2
    assert "settings.json: gpu.memoryFracton: unknown key" in into_file.stderr
    assert "config error: " in into_file.stderr


def _read_all(fd: int) -> str:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode()


def test_json_and_the_trace_are_the_same_bytes_in_every_locale(
    module_daemon: RunningDaemon,
) -> None:
    """--json answers and error bodies are English byte for byte under zh-CN; the trace of
    what a zh-CN user did holds no Chinese."""
    job_id = json.loads(module_daemon.ctl("submit", "noop", "--wait", "--json").stdout)["id"]
    cases = (
        ("show", job_id, "--json"),
        ("tasks", "--json"),
        ("submit", "nope", "--json"),
        ("doctor", "--no-ping", "--no-probe", "--json"),
    )
    for args in cases:
        english, chinese = module_daemon.ctl(*args, env=EN), module_daemon.ctl(*args, env=ZH)
        assert english.stdout == chinese.stdout, args
        assert english.returncode == chinese.returncode
    chinese_job = module_daemon.ctl("submit", "noop", "--wait", "--json", env=ZH)
    chinese_id = json.loads(chinese_job.stdout)["id"]
    trace = module_daemon.stdout_text()
    assert chinese_id in trace
    assert not any("\u4e00" <= char <= "\u9fff" for char in trace)


@pytest.mark.process
def test_help_is_in_the_users_language() -> None:
    """`--help` of a command: its docstring and its options' help in zh-CN, the flags as they
    are; in English, the English docstring."""
    chinese = taogpuctl("submit", "--help", env={**ZH, "COLUMNS": "200"})
    assert chinese.returncode == 0, chinese.stderr
    assert "提交作业；加 --wait 时显示进度和运行位置。" in chinese.stdout
    assert "--wait" in chinese.stdout and "等待它结束。" in chinese.stdout
    english = taogpuctl("submit", "--help", env={**EN, "COLUMNS": "200"})
    assert "Submit a job; with --wait, show its progress and where it ran." in english.stdout


def test_a_daemon_that_cannot_be_reached_is_explained_in_chinese(tmp_path: Path) -> None:
    """The newcomer's first error, no daemon at the socket: message and hint in zh-CN, exit 3."""
    missing = tmp_path / "taogpud.sock"
    result = taogpuctl("status", socket_path=missing, env=ZH)
    assert result.returncode == 3
    assert f"{missing} 处没有守护进程的套接字" in result.stderr
    assert "（提示：taogpud 在运行吗？" in result.stderr


def test_the_relays_own_errors_follow_accept_language(
    provider: FakeProvider, relayd: RunningDaemon
) -> None:
    """A 401 from the relay in zh-CN for a client asking for it (as new-api does), English for
    one that does not; the code and the header that names it stay the same."""
    _, base = token_of(relayd)
    chinese = httpx.get(base + "/v1/models", headers={"accept-language": "zh-CN,zh;q=0.9"})
    english = httpx.get(base + "/v1/models")
    assert chinese.status_code == english.status_code == 401
    assert chinese.json()["code"] == english.json()["code"] == "relay_token_required"
    assert chinese.json()["message"] == "请求没有携带中继令牌；没有令牌，中继不转发任何请求"
    assert english.json()["message"].startswith("the request carries no relay token")
    assert chinese.headers["x-taogpud-error"] == "relay_token_required"
    assert provider.seen == []


@pytest.mark.process
@pytest.mark.skipif(Path("/proc/driver/nvidia").exists(), reason="CUDA can start on this host")
def test_a_backend_that_cannot_start_is_refused_in_chinese_at_a_terminal(tmp_path: Path) -> None:
    """The guide's GPU pair on a host without a driver: at a terminal the refusal and its fix
    are in zh-CN (the reason itself, from the driver, may stay English); the exit status of a
    host that cannot run it."""
    # the embedded seed's backend (CUDA, GPU 0); a file needs one key to be a file
    pair = write_pair(tmp_path, {}, {"runtime": {"thread_num": 4}})
    command = [sys.executable, "-m", "taogpud", *pair.flags(), "--state-dir", str(tmp_path / "s")]
    command += ["--socket", str(tmp_path / "t.sock")]
    env = same_code_env({**os.environ, **ZH, "TAOGPUD_LANG": ""})
    main, child = pty.openpty()
    proc = subprocess.Popen(command, stdin=child, stdout=child, stderr=child, env=env)
    os.close(child)
    seen = _read_all(main)
    assert proc.wait(timeout=60) == EXIT_HOST_CANNOT_RUN
    assert "taogpud: CUDA 无法启动：" in seen
    assert (
        "（修复：修好驱动或设备列表，或者在 settings.json 中把 gpu.allowFallbackToCpu 设为 true"
        in seen
    )
