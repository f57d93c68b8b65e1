"""The one error type of model configuration loading."""

from __future__ import annotations

from pathlib import Path

#: A position inside a ModelConfig message: field names and, for repeated fields, indexes,
#: e.g. ``("input", 1, "dims")`` for the dims of the second input.
FieldPath = tuple[str | int, ...]


def format_field_path(field_path: FieldPath) -> str:
    """``("input", 1, "dims")`` -> ``"input[1].dims"``."""
    text = ""
    for part in field_path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


class ConfigError(ValueError):
    """A model configuration cannot be used: it does not parse or fails validation.

    Raised while a model's configuration is loaded (``config.pbtxt`` or a JSON override). It is
    not recoverable for that model: the message says what to change, and the model loads once the
    configuration is fixed. ``path``, ``line`` and ``column`` locate the problem in the file when
    it came from one (lines and columns count from 1); ``field`` is the dotted field path, such as
    ``input[1].dims``, when the problem is one field's value. ``triton`` is tritonserver's message
    for the same problem, which the message then starts with.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        line: int | None = None,
        column: int | None = None,
        field_path: FieldPath = (),
        triton: str = "",
    ) -> None:
        # Triton's own words first where it has some: clients and Triton's QA match them
        self.message = f"{triton}: {message}" if triton else message
        self.path = None if path is None else str(path)
        self.line = line
        self.column = column
        self.field_path = field_path
        super().__init__(self._render())

    @property
    def field(self) -> str | None:
        """The dotted path of the field at fault (``"input[1].dims"``), or ``None``."""
        return format_field_path(self.field_path) or None

    def located(self, path: str | Path | None, line: int | None) -> ConfigError:
        """A copy of this error placed at ``path``:``line`` (keeps a known column)."""
        return ConfigError(
            self.message,
            path=path if path is not None else self.path,
            line=line if line is not None else self.line,
            column=self.column if line is None or line == self.line else None,
            field_path=self.field_path,
        )

    def _render(self) -> str:
        where = self.path or ""
        if self.line is not None:
            where = f"{where}:{self.line}" if where else f"line {self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return f"{where}: {self.message}" if where else self.message


__all__ = ["ConfigError", "FieldPath", "format_field_path"]
