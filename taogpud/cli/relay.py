"""`taogpuctl relay token|env|status`, and the doctor's relay check. Client side only.

The token is fetched over the Unix socket (the daemon knows the caller by SO_PEERCRED) and
kept in $XDG_CONFIG_HOME/taogpud/relay-token@SOCKET (SOCKET: the daemon's socket path, its
slashes as `-`), mode 0600, for `relay env` to print: one file per daemon, as a token is.
`relay env` never replaces a token: it fetches one only when the daemon holds none for the
user, since a new token revokes the old one and every tool configured with it.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer

from taogpud.cli.context import connect, socket_of
from taogpud.cli.options import JsonFlag
from taogpud.cli.output import emit_json, emit_line
from taogpud.client import Client
from taogpud.errors import CliError
from taogpud.i18n import _
from taogpud.relay.tools import TOOLS, Recipe, recipe, with_mcp_server
from taogpud.wire import RelayStatusJson

if TYPE_CHECKING:  # both import pydantic-settings: taogpuctl's start pays for them only here
    from taogpud.doctor import Check

TOKEN_FILE = "relay-token"
MAX_NAME = 200  # a file name holds 255 bytes; a longer socket path is shortened by its hash

relay_app = typer.Typer(help="The relay: AI tools reach the provider through taogpud.")


def token_path(socket_path: str) -> Path:
    """Where this user keeps the token of the daemon at `socket_path` (one file per daemon)."""
    from taogpud.config.loading import default_config_dir  # pydantic: ~370 ms, relay's only

    absolute = str(Path(socket_path).absolute())  # not resolve(): a symlink names its daemon
    name = f"{TOKEN_FILE}@{absolute.strip('/').replace('/', '-')}"
    if len(name) > MAX_NAME:
        name = name[: MAX_NAME - 17] + "-" + hashlib.sha256(name.encode()).hexdigest()[:16]
    return default_config_dir(os.environ, system=False) / name


def fingerprint(token: str) -> str:
    """What the daemon's status shows of the caller's token: enough to tell it is the one."""
    return hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()[:16]


def save_token(path: Path, token: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)  # an older file keeps its mode through O_CREAT
        out.write(token + "\n")
    return path


@relay_app.command("token")
def token_command(
    ctx: typer.Context,
    revoke: Annotated[bool, typer.Option("--revoke", help="Revoke instead of fetching.")] = False,
    uid: Annotated[int | None, typer.Option(help="With --revoke, as root: whose.")] = None,
    show: Annotated[bool, typer.Option("--show", help="Print the token too.")] = False,
    json_out: JsonFlag = False,
) -> None:
    """Fetch a new relay token (the previous one stops working) and keep it 0600."""
    with connect(ctx) as client:
        if revoke:
            revoked = client.relay_revoke(uid)
            if uid is None:
                token_path(client.socket_path).unlink(missing_ok=True)
            _report(revoked, json_out, f"relay token of uid {revoked['uid']} revoked")
            return
        answer = client.relay_token()
        path = save_token(token_path(client.socket_path), answer["token"])
    shown = {**answer, "path": str(path)} if show else {"uid": answer["uid"], "path": str(path)}
    _report(shown, json_out, f"relay token for uid {answer['uid']} saved to {path} (0600)")
    if show and not json_out:
        emit_line(answer["token"])


@relay_app.command("env")
def env_command(
    ctx: typer.Context,
    tool: Annotated[str, typer.Option(help=f"One of: {', '.join(TOOLS)}.")] = "openai",
    write: Annotated[
        bool,
        typer.Option(
            "--write",
            help="Merge the entry into the tool's config file (codex, openclaw), keeping a .bak; "
            "print only the shell's lines.",
        ),
    ] = False,
) -> None:
    """Print the lines TOOL reads to use the relay and taogpud's GPU tools (`taogpuctl mcp`)."""
    if tool not in TOOLS:
        raise typer.BadParameter(f"unknown tool {tool!r}; known: {', '.join(TOOLS)}")
    with connect(ctx) as client:
        status = client.relay_status()
        if not status.get("listen"):
            raise CliError(
                "the relay has no TCP listener",
                "set enabled = true and listen in [relay] of config.toml and restart taogpud",
            )
        token = _usable_token(client, status)
    made = recipe(tool, f"http://{status['listen']}", token, status.get("models") or {})
    socket_path = socket_of(ctx)
    made = with_mcp_server(made, tool, None if socket_path is None else str(socket_path))
    lines = _written(made) if write else made.lines()
    print("\n".join(lines))  # as is: never through rich, whose markup eats `[table]` lines


def _usable_token(client: Client, status: RelayStatusJson) -> str:
    """The user's token for this daemon: the saved one, or a first one when the daemon holds
    none. Never a replacement: that would revoke the token every configured tool uses."""
    path = token_path(client.socket_path)
    saved = path.read_text().strip() if path.exists() else ""
    if not status.get("has_token"):
        return save_token(path, client.relay_token()["token"]).read_text().strip()
    if saved and fingerprint(saved) == status.get("token_fingerprint"):
        return saved
    older = _older_copy(path.parent / TOKEN_FILE, status.get("token_fingerprint"))
    if older:  # an older taogpuctl's one file per user: now this daemon's
        save_token(path, older)
        return older
    where = "is not the one in" if saved else "is not saved in"
    raise CliError(
        f"you have a relay token for this daemon, but it {where} {path} (it was fetched "
        "under another HOME or XDG_CONFIG_HOME)",
        "use that copy, or `taogpuctl relay token` for a new one (the old one then stops "
        "working for every tool set up with it)",
    )


def _older_copy(legacy: Path, wanted: object) -> str:
    """The token an older taogpuctl kept in one file per user, if it is this daemon's."""
    token = legacy.read_text().strip() if legacy.is_file() else ""
    return token if token and fingerprint(token) == wanted else ""


def _written(made: Recipe) -> list[str]:
    """--write: the file's part merged into the tool's file; the shell's part printed."""
    from taogpud.cli import toolfiles  # its TOML writer, ~10 ms: --write alone needs it

    if made.file_kind == "codex-toml":
        path = toolfiles.codex_path(os.environ)
        toolfiles.write_codex(path, made.merge)
    elif made.file_kind == "openclaw-json":
        path = toolfiles.openclaw_path(os.environ)
        toolfiles.write_openclaw(path, made.merge)
    else:
        raise CliError(
            "--write is for tools that read a config file (codex, openclaw, openclaw-anthropic)",
            "this tool reads only its environment: drop --write and eval the lines",
        )
    merged = _("# merged into {path} (the previous one, if any, in {backup})")
    print(merged.format(path=path, backup=f"{path.name}.bak"), file=sys.stderr)
    return made.export_lines


@relay_app.command("status")
def status_command(ctx: typer.Context, json_out: JsonFlag = False) -> None:
    """The relay's state and its use per user and model."""
    with connect(ctx) as client:
        status = client.relay_status()
    if json_out:
        emit_json(status)
        return
    state = (
        _("relay on: tcp {tcp}, unix {unix}/")
        if status["enabled"]
        else _("relay off: tcp {tcp}, unix {unix}/")
    )
    emit_line(state.format(tcp=status["listen"] or "-", unix=status["unix_prefix"]))
    channel = _("channel {channel} (key from {source})")
    emit_line(channel.format(channel=status["channel"], source=status["key_source"]))
    use = _("uid {uid} {model} {status}: {requests} requests, {input} in / {output} out tokens")
    for row in status["use"]:
        emit_line(
            use.format(
                uid=row["uid"],
                model=row["model"],
                status=row["status"],
                requests=row["requests"],
                input=row["input_tokens"],
                output=row["output_tokens"],
            )
        )


def _report(answer: Mapping[str, Any], json_out: bool, text: str) -> None:
    if json_out:
        emit_json(answer)
    else:
        emit_line(text)


def relay_check(client: Client) -> Check:
    """The doctor's end-to-end check: GET /v1/models through the relay on the Unix socket."""
    from taogpud.doctor import Check  # pydantic-settings, ~700 ms: the doctor's alone

    name = "relay"
    status = client.relay_status()
    if not status.get("enabled"):
        return Check(name, "skip", "the relay is off ([relay] enabled = false)")
    code, body = client.relay_models()
    if 200 <= code < 300:
        where = f"tcp {status['listen']}" if status.get("listen") else "unix socket only"
        return Check(name, "pass", f"GET /v1/models through the relay answered {code} ({where})")
    try:
        said = orjson.loads(body)
    except orjson.JSONDecodeError:
        said = {}
    message = said.get("message") if isinstance(said, dict) else None
    detail = f"GET /v1/models through the relay answered {code}: {message or body[:200]!r}"
    hint = said.get("hint", "") if isinstance(said, dict) else ""
    return Check(name, "fail", detail, hint or "`taogpuctl api ping` checks the channel itself")
