"""Bellwether's configuration language, pure: bounded YAML loading, the problems
it reports, the merge of the layers, the template sandbox, rendering with its
validation, and file diffs. It imports no Django and no app (the import-linter
contracts in .importlinter keep it so), so every rule here is tested without a
database and the agent-side checksum can be compared with it.
"""
