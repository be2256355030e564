"""`taogpuctl relay token|env|status`, and the doctor's relay check. Client side only.

The token is fetched over the Unix socket (the daemon knows the caller by SO_PEERCRED) and
kept in $XDG_CONFIG_HOME/taogpud/relay-token, mode 0600, for `relay env` to print.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer

from taogpud.cli.output import emit_json, emit_line
from taogpud.client import Client
from taogpud.relay.tools import TOOLS, env_lines

if TYPE_CHECKING:  # both import pydantic-settings: taogpuctl's start pays for them only here
    from taogpud.doctor import Check

TOKEN_FILE = "relay-token"

relay_app = typer.Typer(help="The relay: AI tools reach the provider through taogpud.")
JsonFlag = Annotated[bool, typer.Option("--json", help="Print exactly one JSON document.")]


def token_path() -> Path:
    from taogpud.config.loading import default_config_dir

    return default_config_dir(os.environ, system=False) / TOKEN_FILE


def save_token(token: str) -> Path:
    path = token_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)  # an older file keeps its mode through O_CREAT
        out.write(token + "\n")
    return path


def _client(ctx: typer.Context) -> Client:
    # the global --socket lives on the root context's object (taogpud.cli.Globals)
    return Client(getattr(ctx.find_root().obj, "socket_path", None))


@relay_app.command("token")
def token_command(
    ctx: typer.Context,
    revoke: Annotated[bool, typer.Option("--revoke", help="Revoke instead of fetching.")] = False,
    uid: Annotated[int | None, typer.Option(help="With --revoke, as root: whose.")] = None,
    show: Annotated[bool, typer.Option("--show", help="Print the token too.")] = False,
    json_out: JsonFlag = False,
) -> None:
    """Fetch a new relay token (the previous one stops working) and keep it 0600."""
    with _client(ctx) as client:
        if revoke:
            answer = client.relay_revoke(uid)
            if uid is None:
                token_path().unlink(missing_ok=True)
            _report(answer, json_out, f"relay token of uid {answer['uid']} revoked")
            return
        answer = client.relay_token()
    path = save_token(answer["token"])
    shown = {**answer, "path": str(path)} if show else {"uid": answer["uid"], "path": str(path)}
    _report(shown, json_out, f"relay token for uid {answer['uid']} saved to {path} (0600)")
    if show and not json_out:
        emit_line(answer["token"])


@relay_app.command("env")
def env_command(
    ctx: typer.Context,
    tool: Annotated[str, typer.Option(help=f"One of: {', '.join(TOOLS)}.")] = "openai",
) -> None:
    """Print the lines TOOL reads to use the relay (its base URL and your relay token)."""
    if tool not in TOOLS:
        raise typer.BadParameter(f"unknown tool {tool!r}; known: {', '.join(TOOLS)}")
    with _client(ctx) as client:
        status = client.relay_status()
        path = token_path()
        token = path.read_text().strip() if path.exists() else ""
        if not token or not status.get("has_token"):
            token = client.relay_token()["token"]
            save_token(token)
    if not status.get("listen"):
        raise typer.BadParameter(
            "the relay has no TCP listener: set enabled = true and listen in [relay] of "
            "config.toml and restart taogpud"
        )
    for line in env_lines(tool, f"http://{status['listen']}", token):
        emit_line(line)


@relay_app.command("status")
def status_command(ctx: typer.Context, json_out: JsonFlag = False) -> None:
    """The relay's state and its use per user and model."""
    with _client(ctx) as client:
        status = client.relay_status()
    if json_out:
        emit_json(status)
        return
    state = "on" if status["enabled"] else "off"
    emit_line(f"relay {state}: tcp {status['listen'] or '-'}, unix {status['unix_prefix']}/")
    emit_line(f"channel {status['channel']} (key from {status['key_source']})")
    for row in status["use"]:
        emit_line(
            f"uid {row['uid']} {row['model']} {row['status']}: {row['requests']} requests, "
            f"{row['input_tokens']} in / {row['output_tokens']} out tokens"
        )


def _report(answer: dict[str, Any], json_out: bool, text: str) -> None:
    if json_out:
        emit_json(answer)
    else:
        emit_line(text)


def relay_check(client: Client) -> Check:
    """The doctor's end-to-end check: GET /v1/models through the relay on the Unix socket."""
    from taogpud.doctor import Check

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
