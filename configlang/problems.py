"""A problem found while rendering or validating, naming where it is."""

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Problem:
    code: str
    message: str
    file: str | None = None
    line: int | None = None
    key: str | None = None

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def __str__(self) -> str:
        where = ":".join(str(p) for p in (self.file, self.line) if p is not None)
        if self.key:
            where = f"{where} {self.key}".strip()
        return f"{where}: {self.message}" if where else self.message
