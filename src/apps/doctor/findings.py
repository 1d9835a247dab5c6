"""What the doctor reports: one finding per problem, printed as one line."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    """One problem the doctor saw.

    Attributes:
        id: Stable, kebab-case name of the check (``initial-loss``); docs/loop.md lists them all.
        saw: What was measured, with its numbers.
        why: Why it matters: what goes wrong, silently, if it stays.
        fix: What to change.
    """

    id: str
    saw: str
    why: str
    fix: str

    def line(self) -> str:
        """``[id] saw: ... | why: ... | fix: ...`` on one line."""
        return f"[{self.id}] saw: {self.saw} | why: {self.why} | fix: {self.fix}"
