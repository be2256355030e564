"""One finding about the config: which file and key, what is wrong, and the fix.

A start, a reload, `taogpuctl config validate` and the doctor all report these; a start or a
reload refused raises them together as one ConfigError (taogpud/errors.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from taogpud.i18n import Text


@dataclass(frozen=True)
class Problem:
    """One finding about the config: which file and key, what is wrong, and the fix."""

    file: str  # "settings.json", "config.toml", or a path as the user gave it
    key: str  # dotted, spelled as in that file: "gpu.memoryFraction", "scheduling.strategy"
    message: str
    fix: str
    severity: str = "error"  # "error" | "warning"
    # message and fix for a person, translated where shown (`in_language`); None: as above
    texts: tuple[Text, Text] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, file: str, key: str, message: Text, fix: Text, severity: str = "error") -> Problem:
        """A problem whose message and fix a person may read in their own language."""
        return cls(file, key, str(message), str(fix), severity, (message, fix))

    def in_language(self, language: str | None) -> Problem:
        """This problem with its message and fix in `language` (English where not known)."""
        if self.texts is None or language is None:
            return self
        message, fix = self.texts
        return replace(self, message=message.render(language), fix=fix.render(language))

    def cleaned(self, clean: Callable[[str], str]) -> Problem:
        """This problem with `clean` applied to every text it shows (the key's redaction)."""
        texts = (
            None
            if self.texts is None
            else (self.texts[0].cleaned(clean), self.texts[1].cleaned(clean))
        )
        return replace(
            self,
            file=clean(self.file),
            key=clean(self.key),
            message=clean(self.message),
            fix=clean(self.fix),
            texts=texts,
        )

    def __str__(self) -> str:
        return self.line(None)

    def line(self, language: str | None) -> str:
        """`file: key: message (fix: …)`, in `language` (None: English)."""
        shown = self.in_language(language)
        frame = Text(
            "{file}: {key}: {severity}{message} (fix: {fix})",
            file=shown.file,
            key=shown.key,
            severity=Text("warning: ") if self.severity == "warning" else "",
            message=shown.message,
            fix=shown.fix,
        )
        return frame.render(language)

    def as_dict(self) -> dict[str, str]:
        return {
            "file": self.file,
            "key": self.key,
            "message": self.message,
            "fix": self.fix,
            "severity": self.severity,
        }
