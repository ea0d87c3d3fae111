"""The Bellwether agent: polls for its desired snapshot and applies it safely.

Standard library only, so it drops onto any host with Python 3.8 or newer.
Run it as `python -m agent --help`.
"""

__version__ = "0.1.0"
