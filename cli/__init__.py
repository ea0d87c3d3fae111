"""The `bellwether` command: the operator REST API for CI and people (docs/ci.md).

It talks to a server over HTTP only and imports nothing of the server (the
"cli-standalone" import contract in .importlinter)."""
