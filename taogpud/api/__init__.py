"""The control API: HTTP/1.1 over the Unix socket, one handler module per resource."""
