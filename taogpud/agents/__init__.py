"""The door for AI agents: `taogpuctl mcp`, the daemon's jobs as MCP tools on stdio.

    server.py    the MCP server (the official SDK, the `mcp` extra): the tools, their errors
    results.py   what the tools answer: pydantic models, pure functions of the daemon's JSON
    registration.py  how each AI tool registers the server (`relay env --tool X` prints it)

Client side only: it reaches the daemon through taogpud.client, as taogpuctl does.
"""
